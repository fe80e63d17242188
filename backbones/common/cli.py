"""The commands' options: the parser every command builds (`command_parser`: its help layout, foreign flags named
with what to give instead), the options several commands share (model, device, precision, workers, seed, weights,
outputs), and argparse value types that check a value's meaning. The commands run through
`backbones.common.commands.run_command`; the experiment trackers' options are in `backbones.common.trackers`.
"""
from __future__ import annotations

import argparse
import ast
import itertools
import math
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import ClassVar, Protocol, TypeVar

import torch

from backbones.common.errors import UsageError

# loader processes by default: 4, or fewer on a smaller machine (PyTorch warns beyond the cores there are)
DEFAULT_WORKERS = min(4, os.cpu_count() or 1)
# beyond 8 loader processes a core they only contend for it (and a typo like 4000 would fork thousands of processes)
MAX_WORKERS = 8 * (os.cpu_count() or 1)


E = TypeVar('E', bound='EmbeddedData')


class EmbeddedData(Protocol):
    """Data a tool hands its trainer for runs given no data set (the tools give their embedded set): a description
    for --help, its own options (where it lives), and the instance those options make. Each task refines it with
    what it needs: `classification.loaders.EmbeddedImageData`, `backbones.dense.run_data.EmbeddedSegData`."""

    description: ClassVar[str]

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None: ...

    @classmethod
    def from_args(cls: type[E], args: argparse.Namespace) -> E: ...


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The usage text as written (its examples keep their lines), and an option's default after its help where there
    is one to show: not for a required option, a flag, an option whose default is None or an empty list, or a help
    that names its default itself."""

    def _get_help_string(self, action: argparse.Action) -> str:  # the hook ArgumentDefaultsHelpFormatter overrides
        text = action.help or ''
        nothing = action.default is None or action.default is False or action.default is argparse.SUPPRESS
        shown = (not nothing and action.default != [] and not action.required and 'default' not in text
                 and (action.option_strings or action.nargs in ('?', '*')))
        return f'{text} (default: %(default)s)' if shown else text


class CommandParser(argparse.ArgumentParser):
    """Every command's parser (`command_parser`), its subcommands' parsers included: no abbreviated options (with
    them `--model lvvit_s` would be read as `--model-kwargs lvvit_s`), the usage text as written, defaults shown."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs['allow_abbrev'] = False
        kwargs.setdefault('formatter_class', HelpFormatter)
        super().__init__(*args, **kwargs)
        self.foreign_flags: dict[str, str] = {}

    def add_foreign_flags(self, origin: str, equivalents: Mapping[str, str | None]) -> None:
        """Flags of another program that users type out of habit (`origin`, e.g. "mmseg's tools/test.py"), each
        with what this command takes instead, in words (None: nothing). Given one, the command stops with one line
        naming the flag, its origin and the equivalent, before any other check of the command line. A flag the
        parser takes itself is its own, so one table may serve several commands. Call it again for another origin."""
        for flag, equivalent in equivalents.items():
            instead = f'use {equivalent}' if equivalent else 'it has no equivalent here'
            self.foreign_flags[flag] = f'{flag} is a flag of {origin}; {self.prog} does not take it: {instead}'

    def parse_known_args(self, args=None, namespace=None):
        args = sys.argv[1:] if args is None else list(args)
        self.refuse_foreign_flags(args)
        namespace, rest = super().parse_known_args(args, namespace)
        self.refuse_names_at_odds(args)
        check_precision(namespace)
        return namespace, rest

    def refuse_foreign_flags(self, args: list[str]) -> None:
        """argparse's error (one line after the usage) for the first foreign flag in `args` (`add_foreign_flags`);
        the options after `--` are values."""
        for flag in typed_flags(args):
            if flag in self.foreign_flags and flag not in self._option_string_actions:
                self.error(self.foreign_flags[flag])


    def refuse_names_at_odds(self, args: list[str]) -> None:
        """Two names of one setting in `args` with different values (an option and its alias, `--aa X
        --auto-augment Y`; a flag and its `--no-` form) are a UsageError naming both: argparse would keep the last
        silently. The same value under both names passes, and so does one name given twice (a later one overrides,
        as argparse has it)."""
        actions = self._option_string_actions
        typed = [flag for flag in typed_flags(args) if flag in actions]
        for dest in dict.fromkeys(actions[flag].dest for flag in typed):
            if len({flag for flag in typed if actions[flag].dest == dest}) < 2:
                continue
            given = values_given(self, args, dest)
            for (flag, value), (other, other_value) in itertools.combinations(given, 2):
                if flag != other and value != other_value and not (switched_on(actions[flag], value)
                                                                    and switched_on(actions[other], other_value)):
                    raise UsageError(f'{as_typed(actions[flag], flag, value)} and '
                                     f'{as_typed(actions[other], other, other_value)} set one setting ({dest}) to '
                                     'different values: give one of them')


def switched_on(action: argparse.Action, value: object) -> bool:
    """Whether a value an option stored means its setting switched on: a flag's True, or the value an option with an
    optional value stores given bare (`--torchcompile`, `inductor`, and `--compile`, True, say the same)."""
    return value is True or (action.nargs == '?' and value is not None and value == action.const)


class _Noted(argparse.Action):
    """Stands in for an option's action: notes the name it was given under and the value the action stores."""

    def __init__(self, action: argparse.Action, given: list[tuple[str, object]]) -> None:
        super().__init__(action.option_strings, action.dest, action.nargs, action.const, None, action.type,
                         action.choices)
        self.action, self.given = action, given

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        stored = argparse.Namespace()
        self.action(parser, stored, values, option_string)
        self.given.append((option_string, getattr(stored, self.dest)))


def values_given(parser: argparse.ArgumentParser, args: list[str], dest: str) -> list[tuple[str, object]]:
    """Each value `args` give `parser`'s setting `dest`, in order, with the option name it came under: read by
    argparse itself (a parser holding only that setting's options; the other arguments are left over)."""
    given: list[tuple[str, object]] = []
    noting = argparse.ArgumentParser(add_help=False, allow_abbrev=False, prefix_chars=parser.prefix_chars)
    for action in parser._actions:
        if action.dest == dest and action.option_strings:
            noting._add_action(_Noted(action, given))
    noting.parse_known_args(args)
    return given


def as_typed(action: argparse.Action, flag: str, value: object) -> str:
    """An option as a message quotes it: the name, and the value where the option takes one."""
    if action.nargs == 0:
        return flag
    return f'{flag} {" ".join(map(str, value)) if isinstance(value, list) else value}'


def typed_flags(args: list[str]) -> list[str]:
    """The flags of a command line as typed (`--name` of `--name=value` too), up to `--`: what follows it are
    values."""
    return [arg.split('=', 1)[0] for arg in (args[:args.index('--')] if '--' in args else args)]


def check_precision(args: argparse.Namespace) -> None:
    """--amp fp16 means the same in every command: refused before any work where the command runs on a CPU."""
    if getattr(args, 'amp', None) == 'fp16':
        pick_amp('fp16', torch.device(device_name(getattr(args, 'device', None))))


def command_parser(description: str | None, prog: str | None = None) -> CommandParser:
    """A command's parser: `description` is its usage text (a tool's docstring)."""
    return CommandParser(prog=prog, description=description)


def model_parser(prog: str, description: str | None) -> CommandParser:
    """A command's parser whose first argument is a model name."""
    parser = command_parser(description, prog)
    add_model_argument(parser)
    return parser


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    """A command's (or subcommand's) first argument, a model name."""
    parser.add_argument('model', help='model name (tools/model_info.py --all lists the suite\'s)')


def parse_model_kwargs(items: list[str], option: str = '--model-kwargs') -> dict:
    """`--model-kwargs key=value ...` (or another `option` of model arguments): values parsed as Python literals
    where they are one (numbers, True, None)."""
    kwargs = {}
    for item in items:
        key, sep, value = item.partition('=')
        if not sep:
            raise UsageError(f'{option} takes key=value, got {item!r}')
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key] = value
    return kwargs


def _checked(kind: type, test: Callable[[float], bool], meaning: str) -> Callable[[str], object]:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f'expected {meaning}, got {text!r}') from None
        if not test(value):
            raise argparse.ArgumentTypeError(f'expected {meaning}, got {text}')
        return value
    parse.__name__ = meaning  # argparse names the type in its messages
    return parse


positive_int = _checked(int, lambda v: v >= 1, 'a whole number >= 1')
non_negative_int = _checked(int, lambda v: v >= 0, 'a whole number >= 0')
positive_float = _checked(float, lambda v: 0 < v < math.inf, 'a number > 0')
non_negative_float = _checked(float, lambda v: 0 <= v < math.inf, 'a number >= 0')
probability = _checked(float, lambda v: 0 <= v <= 1, 'a probability in [0, 1]')
fraction = _checked(float, lambda v: 0 < v <= 1, 'a fraction in (0, 1]')
below_one = _checked(float, lambda v: 0 <= v < 1, 'a number in [0, 1)')
open_fraction = _checked(float, lambda v: 0 < v < 1, 'a number in (0, 1)')

DEVICES = ('cpu', 'cuda')


def resolve_device(device: str | None) -> bool:
    """Whether to use CUDA for `--device` (None: when there is a GPU); a device that is not there is an error."""
    if device is None:
        return torch.cuda.is_available()
    if device not in DEVICES:
        raise UsageError(f'--device must be one of {", ".join(DEVICES)}, got {device!r}')
    if device == 'cuda' and not torch.cuda.is_available():
        raise UsageError('--device cuda: no GPU is visible to PyTorch here (torch.cuda.is_available() is False); '
                         'use --device cpu')
    return device == 'cuda'


def device_name(device: str | None) -> str:
    """`--device` resolved to 'cuda' or 'cpu' (`resolve_device`: a GPU that is not there is an error)."""
    return 'cuda' if resolve_device(device) else 'cpu'


# The options every command that has them declares through these helpers, with one meaning and one default; a
# command whose default differs says why in its help.

def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """`--device cpu|cuda` (without it: cuda when PyTorch sees a GPU; see `resolve_device`, `device_name`)."""
    parser.add_argument('--device', choices=DEVICES, help='where the command runs (default: cuda when PyTorch sees '
                        'a GPU, else cpu)')


AMP_CHOICES = ('auto', 'none', 'bf16', 'fp16')
AMP_MEANINGS = {'auto': 'bf16 on GPUs that have it, fp16 on older GPUs, none on CPUs',
                'none': 'float32 throughout',
                'bf16': 'bfloat16 autocast (CPUs run it too: faster where they have bf16 instructions)',
                'fp16': 'float16 autocast (GPUs only; training scales its loss)'}
# bf16 where a command's mixed precision runs on GPUs alone (train_seg: mmengine's AmpOptimWrapper)
BF16_ON_GPUS = 'bfloat16 autocast (GPUs only)'

# why the benchmarks' --amp is none unless asked, and the studies' --workers a number of their own
TIMED_IN_FP32 = 'the benchmark times float32 unless asked, so that its figures compare across devices and runs'
SAME_WORK_EVERYWHERE = 'the same work on every machine, so that the figures compare'


def add_amp_argument(parser: argparse.ArgumentParser, default: str = 'auto', why: str = '',
                     choices: tuple[str, ...] = AMP_CHOICES, alone: str | None = None, gpus_only: bool = False
                     ) -> None:
    """`--amp`, mixed precision (`pick_amp` resolves it): `choices`, those of AMP_CHOICES a command can run;
    `default` other than auto only with `why`; `alone`, what `--amp` given without a value means (a former flag);
    `gpus_only`, a command whose bf16 runs on GPUs alone, as its fp16."""
    if not set(choices) <= set(AMP_CHOICES) or default not in choices or bool(why) != (default != 'auto'):
        raise ValueError(f'--amp: choices {choices} must be among {AMP_CHOICES}, the default {default!r} among '
                         'them, and a default other than auto needs its reason')
    meanings = {**AMP_MEANINGS, 'bf16': BF16_ON_GPUS} if gpus_only else AMP_MEANINGS
    text = 'mixed precision; ' + '; '.join(f'{choice}: {meanings[choice]}' for choice in choices)
    if why:
        text += f' (default: {default}, {why})'
    if alone:
        text += f'; --amp alone: {alone}'
    parser.add_argument('--amp', choices=choices, default=default, help=text,
                        **({'nargs': '?', 'const': alone} if alone else {}))


def pick_amp(amp: str, device: torch.device) -> str:
    """`--amp` resolved: auto is bf16 on GPUs that have it, fp16 on older GPUs, none on CPU (bf16 runs there too
    when asked: faster on CPUs with bf16 instructions, but a run's numbers then depend on the CPU)."""
    if amp != 'auto':
        if amp == 'fp16' and device.type != 'cuda':
            raise UsageError(f'--amp fp16 needs a GPU; this run is on {device} (bf16 runs on CPUs)')
        return amp
    if device.type != 'cuda':
        return 'none'
    return 'bf16' if torch.cuda.is_bf16_supported() else 'fp16'


def add_model_kwargs_argument(parser: argparse.ArgumentParser, example: str = 'depth=2 embed_dim=64 (a tiny model)',
                              option: str = '--model-kwargs', whose: str = 'the model') -> None:
    """`--model-kwargs KEY=VALUE ...` (`parse_model_kwargs` reads them); `option` and `whose` for another model of
    the command (a teacher)."""
    parser.add_argument(option, nargs='*', default=[], metavar='KEY=VALUE',
                        help=f'arguments of {whose}\'s constructor, values read as Python literals, e.g. {example}')


def add_workers_argument(parser: argparse.ArgumentParser, default: int | None = None, why: str = '',
                         least: int = 0) -> None:
    """`--workers`: loader processes, by default DEFAULT_WORKERS; a `default` of the command's own only with `why`;
    `least` 1 for a command that measures its workers."""
    if (default is None) == bool(why) or least not in (0, 1):
        raise ValueError('--workers: a default of the command\'s own needs its reason, and only then; least is 0 or 1')
    text = 'loader processes beside each process of the command, reading and decoding its data'
    text += '; 0: the process reads it itself' if least == 0 else ''
    text += f' (default: {default}, {why})' if why else ' (default: 4, or the cores where fewer)'
    text += f'; at most {MAX_WORKERS}, 8 a core'
    workers = _checked(int, lambda v: least <= v <= MAX_WORKERS,
                       f'a whole number >= {least}, at most {MAX_WORKERS} (8 loader processes a core here)')
    parser.add_argument('--workers', type=workers, default=DEFAULT_WORKERS if default is None else default, help=text)


def add_weights_argument(parser: argparse.ArgumentParser) -> None:
    """Which weights of a training checkpoint a command takes (`use_ema`): by default the checkpoint's model (the EMA
    when its run kept one, as timm's loaders take it), `--use-ema` its EMA copy, `--trained-weights` the trained
    weights (`backbones.weights.read_state_dict`)."""
    weights = parser.add_mutually_exclusive_group()
    weights.add_argument('--use-ema', dest='use_ema', action='store_const', const=True, default=None,
                         help='the EMA weights of a training checkpoint (default: its model, which is the EMA when '
                              'the run kept one)')
    weights.add_argument('--trained-weights', dest='use_ema', action='store_const', const=False,
                         help='the trained weights of a training checkpoint that also holds an EMA')


DEFAULT_SEED = 42


def add_seed_argument(parser: argparse.ArgumentParser, effect: str = '') -> None:
    """`--seed`: the seed of the random streams (`backbones.common.random_state.seed_all`); `effect`, what it
    decides in this command."""
    parser.add_argument('--seed', type=non_negative_int, default=DEFAULT_SEED,
                        help='seed of the random streams (Python, NumPy, torch)' + (f': {effect}' if effect else ''))


def check_writable(path: str | Path) -> None:
    """A file a command will write: its folder must exist and be writable, and the path must not be a folder (nor
    be typed as one, with a trailing slash)."""
    if str(path).endswith(os.sep):
        raise UsageError(f'{path} names a folder (its trailing {os.sep}); give a file name to write')
    path = Path(path)
    if path.is_dir():
        raise UsageError(f'{path} is a folder; give a file name to write')
    if not path.parent.is_dir():
        raise UsageError(f'cannot write {path}: the folder {path.parent} does not exist')
    check_folder_writable(path.parent, path)


def _checked_argument(check: Callable[[str], None], value: str) -> None:
    """Run an output check on a command-line value: its UsageError becomes argparse's error for the option."""
    try:
        check(value)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def output_file(value: str) -> str:
    """argparse type of a file a command will write: checked (`check_writable`) before any work."""
    _checked_argument(check_writable, value)
    return value


def png_file(value: str) -> str:
    """argparse type of a PNG picture a command will write: named .png and checked like `output_file`, before any
    work (another suffix failed only once the picture was drawn)."""
    if Path(value).suffix.lower() != '.png':
        raise argparse.ArgumentTypeError(f'{value}: give a .png file (the picture is written as PNG)')
    return output_file(value)


def output_folder(value: str) -> Path:
    """argparse type of a folder a command will create or fill: checked (`check_output_folder`) before any work."""
    _checked_argument(check_output_folder, value)
    return Path(value)


def check_output_folder(path: str | Path) -> None:
    """A folder a command will create or fill: it must not be a file, nor lie under one, and the folder (or the
    nearest one above it that exists, where it is to be made) must be writable."""
    path = Path(path)
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            raise UsageError(f'cannot use {path} as output folder: {part} is a file')
    check_folder_writable(next(part for part in (path, *path.parents) if part.exists()), path)


def check_folder_writable(folder: Path, target: Path) -> None:
    """Files can be made in `folder` (to write `target`): before the work, not after it. access(2) says so for a
    read-only file system too, root included; a file is made and removed to be sure (root may write anywhere by
    access(2), yet /proc takes no new file)."""
    if os.access(folder, os.W_OK | os.X_OK):
        try:
            with tempfile.NamedTemporaryFile(dir=folder, prefix='.write-check-'):
                return
        except OSError as e:
            raise UsageError(f'cannot write {target}: no file can be made in {folder} ({e.strerror}); give an output '
                             f'path elsewhere') from None
    read_only_fs = hasattr(os, 'statvfs') and os.statvfs(folder).f_flag & os.ST_RDONLY
    why = 'is on a read-only file system' if read_only_fs else 'is not writable by this user'
    raise UsageError(f'cannot write {target}: {folder} {why}; give an output path elsewhere')
