"""The commands' options: the parser every command builds (`command_parser`: its help layout, foreign flags named
with what to give instead), the options several commands share (model, workers, seed, weights), and argparse value
types that check a value's meaning. Device and precision are `backbones.common.devices`'; outputs,
`backbones.common.outputs`'; the experiment trackers' options, `backbones.common.trackers`'.
"""
from __future__ import annotations

import argparse
import ast
import itertools
import math
import os
import sys
from collections.abc import Callable, Mapping
from typing import ClassVar, Protocol, TypeVar

from backbones.common.devices import check_precision
from backbones.common.errors import UsageError

# loader processes by default: 4, or fewer on a smaller machine (PyTorch warns beyond the cores there are)
DEFAULT_WORKERS = min(4, os.cpu_count() or 1)
# beyond 8 loader processes a core they only contend for it (and a typo like 4000 would fork thousands of processes)
MAX_WORKERS = 8 * (os.cpu_count() or 1)


E = TypeVar('E', bound='EmbeddedData')


class EmbeddedData(Protocol):
    """Data a tool's trainer runs on when given no data set: a --help description, its options and what they make."""

    description: ClassVar[str]

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None: ...

    @classmethod
    def from_args(cls: type[E], args: argparse.Namespace) -> E: ...


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The usage text as written, and an option's default after its help where it is worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str:  # the hook ArgumentDefaultsHelpFormatter overrides
        text = action.help or ''
        nothing = action.default is None or action.default is False or action.default is argparse.SUPPRESS
        shown = (not nothing and action.default != [] and not action.required and 'default' not in text
                 and (action.option_strings or action.nargs in ('?', '*')))
        return f'{text} (default: %(default)s)' if shown else text


class CommandParser(argparse.ArgumentParser):
    """Every command's parser: no abbreviated options, the usage text as written, defaults shown."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs['allow_abbrev'] = False
        kwargs.setdefault('formatter_class', HelpFormatter)
        super().__init__(*args, **kwargs)
        self.foreign_flags: dict[str, str] = {}

    def add_foreign_flags(self, origin: str, equivalents: Mapping[str, str | None]) -> None:
        """Flags of another program (`origin`) that users type out of habit, each with what this command takes instead
        (None: nothing): given one, the command stops with one line naming them, before any other check."""
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
        """argparse's error for the first foreign flag in `args` (`add_foreign_flags`), up to `--`."""
        for flag in typed_flags(args):
            if flag in self.foreign_flags and flag not in self._option_string_actions:
                self.error(self.foreign_flags[flag])

    def refuse_names_at_odds(self, args: list[str]) -> None:
        """Two names of one setting in `args` with different values (an option and its alias; a flag and its `--no-`
        form) are a UsageError naming both, where argparse would keep the last silently; one name given twice passes."""
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
    """Whether a stored value means its setting is on: a flag's True, or an optional value's `const` given bare."""
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
    """Each value `args` give `parser`'s setting `dest`, in order, with its option name, as argparse reads them."""
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
    """The flags of a command line as typed (`--name` of `--name=value` too), up to `--`."""
    return [arg.split('=', 1)[0] for arg in (args[:args.index('--')] if '--' in args else args)]


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
    """`--model-kwargs key=value ...` (or `option`'s), values parsed as Python literals where they are one."""
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


# The options every command that has them declares through these helpers (and `backbones.common.devices`'), with
# one meaning and one default; a command whose default differs says why in its help.
SAME_WORK_EVERYWHERE = 'the same work on every machine, so that the figures compare'


def add_model_kwargs_argument(parser: argparse.ArgumentParser, example: str = 'depth=2 embed_dim=64 (a tiny model)',
                              option: str = '--model-kwargs', whose: str = 'the model') -> None:
    """`--model-kwargs KEY=VALUE ...`; `option` and `whose` for another model of the command (a teacher)."""
    parser.add_argument(option, nargs='*', default=[], metavar='KEY=VALUE',
                        help=f'arguments of {whose}\'s constructor, values read as Python literals, e.g. {example}')


def add_workers_argument(parser: argparse.ArgumentParser, default: int | None = None, why: str = '',
                         least: int = 0) -> None:
    """`--workers`: loader processes (DEFAULT_WORKERS, or `default` with `why`); `least` 1 to measure them."""
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
    """Which weights of a training checkpoint a command takes: its model, `--use-ema` its EMA, `--trained-weights`."""
    weights = parser.add_mutually_exclusive_group()
    weights.add_argument('--use-ema', dest='use_ema', action='store_const', const=True, default=None,
                         help='the EMA weights of a training checkpoint (default: its model, which is the EMA when '
                              'the run kept one)')
    weights.add_argument('--trained-weights', dest='use_ema', action='store_const', const=False,
                         help='the trained weights of a training checkpoint that also holds an EMA')


DEFAULT_SEED = 42


def add_seed_argument(parser: argparse.ArgumentParser, effect: str = '') -> None:
    """`--seed` (`backbones.common.random_state.seed_all`); `effect`: what it decides in this command."""
    parser.add_argument('--seed', type=non_negative_int, default=DEFAULT_SEED,
                        help='seed of the random streams (Python, NumPy, torch)' + (f': {effect}' if effect else ''))


