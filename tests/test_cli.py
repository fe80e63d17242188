"""The commands' surface: each tool's --help is its own usage text and says what every option does; the options the
tools share (--amp, --model-kwargs, --workers, --device, --seed) are declared once, with one meaning and one default;
no option is taken for the abbreviation of another.

The parsers are the ones the tools build: each tool's call of its library function is read from its file (not
imported) and made here, stopped where the parser would parse."""
from __future__ import annotations

import argparse
import ast
import importlib
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import AmpOptimWrapper

from backbones.common.cli import DEFAULT_SEED, DEFAULT_WORKERS, MAX_WORKERS, CommandParser
from backbones.common.devices import AMP_CHOICES, DEVICES, check_precision, pick_amp, use_tf32
from backbones.common.errors import UsageError
from helpers.commands import ROOT

TOOLS = sorted(path.name for path in (ROOT / 'tools').glob('*.py'))
SHARED = ('--amp', '--model-kwargs', '--workers', '--device', '--seed')


def tool_call(tool: str) -> tuple[Callable, dict, str]:
    """The library function a tool calls, the keyword arguments it gives it (its usage text as `description`), and
    that text: a tool is its usage text (its docstring), imports, and
    `run_command(lambda: FUNCTION(description=__doc__, ...))`."""
    tree = ast.parse((ROOT / 'tools' / tool).read_text())
    usage = ast.get_docstring(tree, clean=False)
    imported = {alias.asname or alias.name: (node.module, alias.name)
                for node in tree.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    (block,) = [node for node in tree.body if isinstance(node, ast.If)]
    (statement,) = block.body
    runner = statement.value
    assert runner.func.id == 'run_command' and isinstance(runner.args[0], ast.Lambda), tool
    call = runner.args[0].body
    assert not call.args, f'{tool}: the library function takes keyword arguments only'

    def resolve(name: str):
        module, attribute = imported[name]
        return getattr(importlib.import_module(module), attribute)

    kwargs = {}
    for keyword in call.keywords:
        if keyword.arg == 'description':
            assert keyword.value.id == '__doc__', f'{tool} gives its library function another description'
            kwargs['description'] = usage
        else:
            kwargs[keyword.arg] = (keyword.value.value if isinstance(keyword.value, ast.Constant)  # prog='...'
                                   else resolve(keyword.value.id))
    assert 'description' in kwargs, f'{tool} does not give its usage text to its parser'
    return resolve(call.func.id), kwargs, usage


class Parsed(Exception):
    """The parser a command was about to parse its arguments with."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__()
        self.parser = parser


def tool_parser(tool: str, monkeypatch) -> tuple[argparse.ArgumentParser, str, Callable]:
    """A tool's parser, as its call of the library builds it (stopped at its parse), its usage text and function."""
    function, kwargs, usage = tool_call(tool)

    def stop(self, *args, **kwargs):
        raise Parsed(self)

    monkeypatch.setattr(CommandParser, 'parse_args', stop)
    try:
        function(['--help'], **kwargs)
    except Parsed as parsed:
        return parsed.parser, usage, function
    except SystemExit:
        pass
    pytest.fail(f'{tool}: its parser is not a CommandParser (backbones.common.cli.command_parser)')


def parsers_of(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """A parser and its subcommands' parsers, by name."""
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from parsers_of(sub)


def options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    return (action for action in parser._actions if not isinstance(action, argparse._HelpAction))


@pytest.mark.parametrize('tool', TOOLS)
def test_a_tools_help_is_its_own_usage_text_and_says_what_every_option_does(tool, monkeypatch):
    parser, usage, function = tool_parser(tool, monkeypatch)
    assert usage.strip() and usage != sys.modules[function.__module__].__doc__
    assert parser.description == usage
    text = parser.format_help()
    assert text.split('\n\n')[1].strip() == usage.strip().split('\n\n')[0]  # right after the usage line
    for name, each in parsers_of(parser):
        assert isinstance(each, CommandParser) and each.allow_abbrev is False, name
        assert each.description, f'{name} --help has no description'
        text = each.format_help()
        assert '(default: None)' not in text and '(default: [])' not in text, name
        for action in options(each):
            if not isinstance(action, argparse._SubParsersAction):
                assert action.help, f'{name} {"/".join(action.option_strings) or action.dest} has no help'


@pytest.mark.parametrize('tool', TOOLS)
def test_the_shared_options_mean_one_thing_in_every_tool(tool, monkeypatch):
    """Each shared option has one type, one set of values and one default wherever a tool has it; a default of a
    tool's own (--amp, --workers) says why in its help."""
    parser, _, _ = tool_parser(tool, monkeypatch)
    for name, each in parsers_of(parser):
        found = {option: action for action in options(each) for option in action.option_strings if option in SHARED}
        if '--device' in found:
            device = found['--device']
            assert (device.choices, device.default, device.type) == (DEVICES, None, None), name
        if '--seed' in found:
            seed = found['--seed']
            assert seed.default == DEFAULT_SEED and seed.type('7') == 7, name
            with pytest.raises(argparse.ArgumentTypeError):
                seed.type('-1')
        if '--model-kwargs' in found:
            kwargs = found['--model-kwargs']
            assert (kwargs.nargs, kwargs.default, kwargs.metavar) == ('*', [], 'KEY=VALUE'), name
        if '--workers' in found:
            workers = found['--workers']
            own = f'(default: {workers.default}, ' in workers.help  # a default of the tool's own, and why
            assert own or (workers.default == DEFAULT_WORKERS and '(default: 4, or the cores' in workers.help), name
            assert workers.type(str(MAX_WORKERS)) == MAX_WORKERS, name
            with pytest.raises(argparse.ArgumentTypeError, match=f'>= [01], at most {MAX_WORKERS} '):
                workers.type('100000')  # thousands of loader processes forked by a typo
        if '--amp' in found:
            amp = found['--amp']
            assert set(amp.choices) <= set(AMP_CHOICES), name
            assert amp.default == 'auto' or f'(default: {amp.default}, ' in amp.help, name
            assert isinstance(each, CommandParser), name  # whose parsing refuses --amp fp16 where it cannot run
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match='--amp fp16 needs a GPU; this run is on cpu'):
            check_precision(argparse.Namespace(amp='fp16'))
        with pytest.raises(UsageError, match='--amp fp16 needs a GPU; this run is on cpu'):
            check_precision(argparse.Namespace(amp='fp16', device='cpu'))


def literal_options(path: Path) -> Iterator[str]:
    """The option strings written as literals in a file's add_argument calls."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, 'attr', '') == 'add_argument':
            yield from (arg.value for arg in node.args if isinstance(arg, ast.Constant))


def test_each_shared_option_is_declared_once():
    """`grep "'--amp'"` finds one add_argument: each shared option is declared by its helper in
    backbones/common/cli.py or devices.py (--model-kwargs by the one that also declares --teacher-kwargs), nowhere
    else."""
    files = [path for folder in ('backbones', 'classification', 'tools') for path in (ROOT / folder).rglob('*.py')]
    declared = {path.relative_to(ROOT).as_posix(): [o for o in literal_options(path) if o in SHARED] for path in files}
    declared = {path: found for path, found in declared.items() if found}
    assert declared == {'backbones/common/cli.py': ['--workers', '--seed'],
                        'backbones/common/devices.py': ['--device', '--amp']}


def test_an_option_is_not_read_as_the_abbreviation_of_another(capsys):
    """`--model-kw lvvit_s` is refused as an unknown option, not taken for `--model-kwargs lvvit_s`."""
    from classification.train import build_parser
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(['deit_small_patch16_224', '--model-kw', 'lvvit_s'])
    assert exit_info.value.code == 2
    assert 'unrecognized arguments: --model-kw lvvit_s' in capsys.readouterr().err
    assert build_parser().parse_args(['lvvit_s', '--model-kwargs', 'depth=2']).model_kwargs == ['depth=2']


def test_train_segs_amp_takes_the_shared_values_and_alone_means_fp16():
    """train_seg's --amp has the shared values, auto unless given; given alone it means what the former flag did
    (mmengine's AmpOptimWrapper in float16); each precision becomes the wrapper's dtype, which runs on GPUs only."""
    from backbones.dense.train import build_parser, use_amp
    parse = build_parser().parse_args
    assert [parse(['c.py', *amp]).amp for amp in ([], ['--amp', 'bf16'], ['--amp', 'none'])] == ['auto', 'bf16', 'none']
    if torch.cuda.is_available():
        assert parse(['c.py', '--amp']).amp == 'fp16'
    else:  # fp16 is refused where it cannot run, as in every command
        with pytest.raises(UsageError, match='--amp fp16 needs a GPU'):
            parse(['c.py', '--amp'])

    def optim_wrapper(amp: str, gpu: bool) -> dict:
        cfg = Config(dict(optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-4))))
        use_amp(cfg, amp, gpu)
        return cfg.optim_wrapper.to_dict()

    plain = {'type': 'OptimWrapper', 'optimizer': {'type': 'AdamW', 'lr': 1e-4}}
    for amp, dtype in (('fp16', 'float16'), ('bf16', 'bfloat16')):
        assert optim_wrapper(amp, gpu=True) == {**plain, 'type': 'AmpOptimWrapper', 'loss_scale': 'dynamic',
                                                'dtype': dtype}
        assert dtype in AmpOptimWrapper.valid_dtypes
        with pytest.raises(UsageError, match=f"--amp {amp}: mmengine's AmpOptimWrapper trains on GPUs only"):
            optim_wrapper(amp, gpu=False)
    assert optim_wrapper('none', gpu=True) == optim_wrapper('none', gpu=False) == optim_wrapper('auto', gpu=False) \
        == plain


def test_train_cls_amp_alone_means_fp16_as_timms_flag(monkeypatch):
    """timm's `--amp` with no value is float16 autocast; on a CPU it is refused in one line, as --amp fp16 is."""
    from classification.train import build_parser
    parse = build_parser().parse_args
    assert parse(['deit_small_patch16_224']).amp == 'auto'
    with pytest.raises(UsageError, match='--amp fp16 needs a GPU; this run is on cpu'):
        parse(['deit_small_patch16_224', '--amp', '--device', 'cpu'])
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)  # parsed as where a GPU is seen
    assert parse(['deit_small_patch16_224', '--amp']).amp == 'fp16'
    assert parse(['deit_small_patch16_224', '--amp', 'bf16']).amp == 'bf16'


@pytest.mark.parametrize('bf16, expected', [(True, 'bf16'), (False, 'fp16')])
def test_train_segs_auto_precision_is_the_gpus_own(monkeypatch, bf16, expected):
    """--amp auto (train_seg's default) trains in bf16 on a GPU that has it, fp16 on an older one, float32 on CPUs."""
    from backbones.dense.train import training_precision
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'is_bf16_supported', lambda *args, **kwargs: bf16)
    assert training_precision('auto') == expected
    assert training_precision('auto', gpu=False) == 'none'


@pytest.fixture
def tf32_flags() -> Iterator[None]:
    """torch's TF32 flags off for the test, then as they were."""
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


def test_tf32_is_set_for_a_cuda_device_only(tf32_flags):
    use_tf32(torch.device('cpu'))
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, False)
    use_tf32(torch.device('cuda', 0))
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)


def test_test_segs_precision_makes_the_test_loop_autocast_in_its_dtype():
    """test_seg --amp: mmengine's TestLoop autocasts (`fp16`) in the dtype of the context around it; none leaves the
    config's loop as it is."""
    from mmengine.runner.amp import autocast as mmengine_autocast

    from backbones.dense.test import testing_precision
    cfg = Config(dict(test_cfg=dict(type='TestLoop')))
    with testing_precision(cfg, 'none', torch.device('cpu')):
        assert cfg.test_cfg.to_dict() == {'type': 'TestLoop'} and not torch.is_autocast_enabled('cpu')
    with testing_precision(cfg, 'bf16', torch.device('cpu')), mmengine_autocast(enabled=cfg.test_cfg['fp16']):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    assert cfg.test_cfg['type'] == 'TestLoop'


def amp_meaning(parser: argparse.ArgumentParser, precision: str) -> str:
    """What a parser's --amp help says of one precision (`bf16: bfloat16 autocast (...)`)."""
    (text,) = [action.help for action in parser._actions if '--amp' in action.option_strings]
    return re.search(rf'\b{precision}: ([^;(]*\([^)]*\))', text)[1]


def test_the_amp_help_says_where_each_precision_runs_as_the_command_runs_it():
    """train_seg's bf16 and fp16 (mmengine's AmpOptimWrapper) run on GPUs only, and its help says so of both, and
    nowhere that CPUs run them; train_cls runs bf16 on a CPU, and its help says that."""
    from backbones.dense.train import build_parser as train_seg_parser
    from backbones.dense.train import use_amp
    from classification.train import build_parser as train_cls_parser
    seg = train_seg_parser()
    assert 'CPUs run' not in next(action.help for action in seg._actions if '--amp' in action.option_strings)
    for precision in ('bf16', 'fp16'):
        assert 'GPUs only' in amp_meaning(seg, precision)
        with pytest.raises(UsageError, match='trains on GPUs only'):
            use_amp(Config(dict(optim_wrapper=dict(type='OptimWrapper'))), precision, gpu=False)
    assert 'CPUs run it too' in amp_meaning(train_cls_parser(), 'bf16')
    assert pick_amp('bf16', torch.device('cpu')) == 'bf16'
    if not torch.cuda.is_available():  # refused before the config is read (it is not even there)
        from backbones.dense.train import prepare
        with pytest.raises(UsageError, match="--amp bf16: mmengine's AmpOptimWrapper trains on GPUs only"):
            prepare(seg.parse_args(['absent.py', '--amp', 'bf16']))


def test_a_foreign_flag_is_one_line_naming_its_origin_and_the_equivalent(capsys):
    """A flag of another program (add_foreign_flags) stops the command with argparse's error, one line naming it,
    where it comes from and what to type instead, before the other checks (a missing argument); the parser's own
    flags, and values after `--`, are not refused."""
    from backbones.common.cli import command_parser
    parser = command_parser('usage', 'tool.py')
    parser.add_argument('config')
    parser.add_argument('--out')
    parser.add_foreign_flags("mmseg's tools/test.py", {'--show': '--show-dir DIR', '--opacity': None, '--out': None})

    def error(argv: list[str]) -> str:
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(argv)
        assert exit_info.value.code == 2
        return capsys.readouterr().err.strip().splitlines()[-1]

    assert error(['c.py', '--show']) == ("tool.py: error: --show is a flag of mmseg's tools/test.py; tool.py does not "
                                         'take it: use --show-dir DIR')
    assert error(['--opacity=0.3']).endswith("--opacity is a flag of mmseg's tools/test.py; tool.py does not take it: "
                                             'it has no equivalent here')
    assert parser.parse_args(['c.py', '--out', 'x.json']).out == 'x.json'
    assert 'unrecognized arguments: --show' in error(['c.py', '--', '--show'])
