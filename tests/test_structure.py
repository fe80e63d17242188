"""The code base's structure: imports run one way between the packages with no cycle among the modules, library code
neither prints nor exits, the README's layout is the tree, and the suite leaves timm's own models alone."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.commands import ENV, ROOT, run_python, succeeded

# The two installed packages' parts, lowest first: a module may import from its own part and the ones before it
# (a part is its longest listed prefix). `backbones` is the models and the dense stack (`backbones.dense`), and never
# imports `classification`, the pretraining application; the engine knows the objectives only through its protocol.
# The dense stack's shared core sits below its task folders (`DENSE_TASKS`, one part, none importing another), and its
# package entry, which registers them all, above them.
DENSE_TASKS = ('backbones.dense.semantic', 'backbones.dense.instances', 'backbones.dense.depth')
LAYERS = ('backbones.common', 'backbones', 'backbones.dense', 'backbones.dense tasks', 'backbones.dense package',
          'classification.sources', 'classification.engine', 'classification.token_labeling', 'classification.data',
          'classification.objectives', 'classification.pictures', 'classification', 'classification.digits',
          'classification.studies')
PACKAGES = ('backbones', 'classification')
FORMER_PACKAGES = ('common', 'engine', 'digits', 'visualization', 'token_labeling', 'segmentation')


def dense_task_of(module: str) -> str | None:
    """The task folder a module of the dense stack belongs to, or None."""
    return next((task for task in DENSE_TASKS if module == task or module.startswith(task + '.')), None)


def layer_of(module: str) -> str:
    """The layer a module belongs to: its longest prefix in LAYERS ('tools' for the tools)."""
    if module.split('.')[0] == 'tools':
        return 'tools'
    if module == 'backbones.dense':
        return 'backbones.dense package'
    if dense_task_of(module):
        return 'backbones.dense tasks'
    return max((layer for layer in LAYERS if module == layer or module.startswith(layer + '.')), key=len)


def project_modules() -> dict[str, Path]:
    """Every module of the packages (dotted name -> file), and the tools (`tools.NAME`)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob('*.py')):
            parts = list(path.relative_to(ROOT).with_suffix('').parts)
            modules['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = path
    for path in sorted((ROOT / 'tools').glob('*.py')):
        modules[f'tools.{path.stem}'] = path
    return modules


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules a module imports anywhere in its body (inside functions too), relative imports resolved;
    `from package import module` counts the module."""
    package = name if path.stem == '__init__' else name.rpartition('.')[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parts = package.split('.')
                base = '.'.join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f'{base}.{alias.name}' for alias in node.names]
        else:
            continue
        for target in targets:
            if path.parent.name == 'tools' and target in {m.split('.', 1)[1] for m in known if m.startswith('tools.')}:
                target = f'tools.{target}'  # a tool importing another tool by its module name
            while target and target not in known:
                target = target.rpartition('.')[0]
            if target and target != name:
                found.add(target)
    return found


@pytest.fixture(scope='module')
def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(path, name, set(modules)) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle (its modules in order, the first repeated at the end), or [] if there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return []


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': set()}) == ['a', 'b', 'c', 'a']
    assert find_cycle({'a': {'b'}, 'b': set()}) == []


def test_no_import_cycle_among_the_projects_modules(graph):
    assert len(graph) > 50 and any(graph.values())
    assert find_cycle(graph) == []


def test_imports_run_one_way_from_the_tools_down_to_the_models(graph):
    rank = {layer: i for i, layer in enumerate(LAYERS)} | {'tools': len(LAYERS)}
    upward = [f'{module} imports {target}' for module, targets in graph.items() for target in targets
              if rank[layer_of(target)] > rank[layer_of(module)] or (layer_of(target) == 'tools' != layer_of(module))]
    assert upward == []
    assert not any(target.startswith('classification') for module, targets in graph.items()
                   if module.startswith('backbones') for target in targets)
    across = [f'{module} imports {target}' for module, targets in graph.items() for target in targets
              if dense_task_of(module) and dense_task_of(target) not in (None, dense_task_of(module))]
    assert across == []
    assert {layer_of(module) for module in graph} >= {'backbones.dense', 'backbones.dense tasks'}


def test_no_module_of_the_dense_stack_is_over_400_lines():
    lines = {name: len(path.read_text().splitlines()) for name, path in project_modules().items()
             if name.startswith('backbones.dense')}
    assert len(lines) > 40 and {name: count for name, count in lines.items() if count > 400} == {}


def test_no_library_module_docstring_is_over_15_lines():
    """The contract in the module, the story in docs/: a library module's docstring says what it provides and what a
    caller may rely on in at most 15 lines; design, history and comparisons go to the docs page of its topic."""
    lines = {}
    for name, path in project_modules().items():
        if not name.startswith('tools.'):
            docstring = ast.get_docstring(ast.parse(path.read_text()), clean=False)
            lines[name] = len(docstring.splitlines()) if docstring else 0
    assert len(lines) > 100 and {name: count for name, count in lines.items() if count > 15} == {}


def test_the_former_top_level_packages_are_gone_and_only_two_are_installed():
    """`import common` (or engine, digits, ...) fails from outside the repository: only `backbones` and
    `classification` are installed."""
    result = succeeded(run_python(['-c', f'''
import importlib.util
found = [name for name in {FORMER_PACKAGES!r} if importlib.util.find_spec(name) is not None]
print(found, sorted(importlib.util.find_spec(n) is not None for n in {PACKAGES!r}))
'''], cwd='/'))
    assert result.stdout.strip().splitlines()[-1] == '[] [True, True]'


@pytest.mark.slow
def test_the_wheel_holds_the_two_packages_without_the_studies(tmp_path):
    """The wheel built from pyproject.toml installs `backbones` and `classification`, the studies (benchmarks, the
    GPU session, the reproduction, the docs renderer) left to the checkout that runs them."""
    import shutil
    import zipfile
    source = tmp_path / 'source'  # a copy: a build writes its build/ and egg-info beside the sources
    for package in PACKAGES:
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns('__pycache__'))
    for name in ('pyproject.toml', 'README.md', 'LICENSE'):
        shutil.copy(ROOT / name, source / name)
    succeeded(run_python(['-m', 'pip', 'wheel', '--quiet', '--no-deps', '--no-build-isolation', '--wheel-dir',
                          str(tmp_path), str(source)], cwd=tmp_path))
    names = zipfile.ZipFile(next(tmp_path.glob('*.whl'))).namelist()
    modules = {name for name in names if name.endswith('.py')}
    assert {name.split('/')[0] for name in modules} == {'backbones', 'classification'}
    assert 'classification/train.py' in modules and 'backbones/dense/train.py' in modules
    assert [name for name in modules if name.startswith('classification/studies')] == []
    assert len(modules) == len([name for name in project_modules() if not name.startswith(('tools.',
                                                                                          'classification.studies'))])


def test_no_test_imports_a_tool():
    """The tests reach a command's code through the library (`classification.train.main`, ...) or run the tool as a
    user does; none imports a tool's module, and the tools' folder is on no import path."""
    tools = {path.stem for path in (ROOT / 'tools').glob('*.py')} | {'tools'}
    found = []
    for path in sorted((ROOT / 'tests').rglob('*.py')):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module or ''] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f'{path.relative_to(ROOT)}:{node.lineno} {name}' for name in names
                      if name.split('.')[0] in tools]
    assert len(tools) > 15 and found == []
    assert '/tools' not in [p.rstrip('/')[-6:] for p in sys.path]


def paths_under_tools(source: str) -> list[int]:
    """The lines where code (not a docstring) names a path under tools/: the string 'tools' (a path part, as in
    `root / 'tools'`) or a string starting 'tools/'."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings and (node.value == 'tools' or node.value.startswith('tools/'))]


def test_the_libraries_reach_the_tools_through_the_launcher_alone():
    """No module of the packages but the studies' launcher (`classification.studies.launcher.tool_command`) names a
    path under tools/ in its code: a library running a tool by its path is an arrow up to the tools that the import
    test cannot see."""
    assert paths_under_tools('"""Runs tools/train_cls.py."""\nx = f"see tools/x.py"\n') == []  # words about a tool
    assert paths_under_tools("ROOT / 'tools' / 'x.py'\nrun(['python', 'tools/x.py'])\n") == [1, 2]
    named = [f'{name}:{line}' for name, path in project_modules().items()
             if not name.startswith('tools.') and name != 'classification.studies.launcher'
             for line in paths_under_tools(path.read_text())]
    assert named == []
    assert paths_under_tools((ROOT / 'classification' / 'studies' / 'launcher.py').read_text())  # where they are named


def test_a_tool_is_a_usage_text_and_a_call():
    """The tools hold no logic of their own: each under 200 lines (the logic lives in the libraries)."""
    lines = {path.name: len(path.read_text().splitlines()) for path in (ROOT / 'tools').glob('*.py')}
    assert len(lines) > 15 and {name: count for name, count in lines.items() if count > 200} == {}


def test_the_embedded_data_lives_in_one_package():
    """Only `classification.digits` (and the tools and studies that hand it to the trainers) knows the embedded set:
    no library module outside it names digits, in code or in words, and the config files do not either."""
    named = re.compile(r'\bdigits?\b', re.I)
    outside = [(name, path) for name, path in project_modules().items()
               if not name.startswith(('classification.digits', 'classification.studies', 'tools.'))]
    outside += [(path.name, path) for path in (ROOT / 'seg_configs').rglob('*.py')]
    assert len(outside) > 60
    mentions = [f'{name}:{n}' for name, path in outside
                for n, line in enumerate(path.read_text().splitlines(), 1) if named.search(line)]
    assert mentions == []


def test_segmentation_gets_config_edits_and_a_checkpoint_and_calls_no_trainer():
    """Control runs one way: `backbones` never imports `classification` (above), and what a tool hands the
    segmentation library for its data (`EmbeddedSegData`) only edits a config: no member returns anything (a
    backbone, a checkpoint) that it would have to train. The backbone a run on that data needs comes from the tool's
    first stage, as a checkpoint the trainer takes."""
    from typing import get_type_hints

    from mmengine.config import Config

    from backbones.common.cli import EmbeddedData
    from backbones.dense.run_data import EmbeddedSegData
    from backbones.dense.train import PretrainedBackbone, train
    role = EmbeddedSegData
    members = sorted(name for name in vars(role) if not name.startswith('_') and name not in vars(EmbeddedData))
    assert {'use_data', 'use_schedule', 'use_model'} <= set(members)
    # each member edits a config, but for the data itself kept in another folder (where a checkpoint was trained)
    assert all(get_type_hints(getattr(role, name)) == {'cfg': Config, 'return': type(None)} for name in members
               if name != 'moved_to')
    assert get_type_hints(role.moved_to) == {'root': Path, 'return': role}
    assert get_type_hints(train)['backbone'] == PretrainedBackbone | None


def parameter_count(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's parameters, a method's `self` or `cls` aside."""
    args = function.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    return len(names) - (names[:1] in (['self'], ['cls']))


def test_no_engine_function_takes_more_than_eight_parameters():
    """The engine's functions take the dataclasses it has (`PassOptions`, `Batching`, ...), not long argument lists."""
    crowded = [f'{name}.{node.name} ({parameter_count(node)})' for name, path in project_modules().items()
               if name.startswith('classification.engine') for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and parameter_count(node) > 8]
    assert crowded == []
    nine = ast.parse('def f(a, b, c, d, e, f, g, h, i=0): pass').body[0]
    assert parameter_count(nine) == 9  # the counter counts


def test_library_code_neither_prints_nor_exits():
    """Library modules log through the suite's logger and raise the suite's errors; only the commands' runner
    (`backbones.common.commands.run_command`) prints an error line and sets the exit status."""
    offending = []
    for name, path in project_modules().items():
        if name.startswith('tools'):
            continue
        tree = ast.parse(path.read_text())
        runner = [node for node in tree.body if isinstance(node, ast.FunctionDef)
                  and node.name in ('run_command', 'write_document')]
        allowed = {id(n) for node in runner for n in ast.walk(node)} if name == 'backbones.common.commands' else set()
        for node in ast.walk(tree):
            if id(node) in allowed:
                continue
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == 'print':
                offending.append(f'{name}:{node.lineno} print')
            if isinstance(node, ast.Name) and node.id == 'SystemExit':
                offending.append(f'{name}:{node.lineno} SystemExit')
            if isinstance(node, ast.Attribute) and node.attr == 'exit' and getattr(node.value, 'id', '') == 'sys':
                offending.append(f'{name}:{node.lineno} sys.exit')
    assert offending == []


def layout_entries() -> dict[str, list[str]]:
    """The layout page's block (docs/layout.md): folder -> the file names listed under it."""
    text = (ROOT / 'docs' / 'layout.md').read_text()
    block = re.search(r'# Layout\n.*?```\n(.*?)```', text, re.S).group(1)
    entries: dict[str, list[str]] = {}
    folder = None
    for line in block.splitlines():
        top = re.match(r'^(\S+)/\s', line + ' ')
        if top:
            folder = top.group(1)
            entries[folder] = []
            continue
        names = re.match(r'^  ([\w.]+(?:, [\w.]+)*)\s', line + ' ')
        if names and folder is not None:
            entries[folder] += [n.strip() for n in names.group(1).split(',')]
    return entries


def test_the_readme_layout_is_the_tree():
    entries = layout_entries()
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith('.')} - {'data', 'output',
                                                                                             'work_dirs'}
    folders = {f for f in folders if not f.endswith('.egg-info') and f != '__pycache__'}
    assert {folder.split('/')[0] for folder in entries} == folders
    packages = sorted({str(p.parent.relative_to(ROOT)) for name in PACKAGES for p in (ROOT / name).rglob('*.py')
                       if '__pycache__' not in p.parts})
    assert sorted(f for f in entries if f.split('/')[0] in PACKAGES) == packages
    for package in packages:
        modules = sorted(p.name for p in (ROOT / package).glob('*.py') if p.name != '__init__.py')
        assert sorted(entries[package]) == modules, package


@pytest.mark.slow
def test_the_readme_points_at_every_docs_page_and_every_link_resolves():
    """The README is the front door: each page under docs/ is linked from it, and no link (README or docs) points at a
    file that is not there."""
    readme = (ROOT / 'README.md').read_text()
    pages = sorted(p.name for p in (ROOT / 'docs').glob('*.md') if p.name != 'reproduce_token_labeling.md')
    assert [p for p in pages if f'](docs/{p})' not in readme] == []
    for page in [ROOT / 'README.md', *(ROOT / 'docs').glob('*.md')]:
        for target in re.findall(r'\]\(([^)#]+?)\)', page.read_text()):
            if '://' not in target:
                assert (page.parent / target).exists(), f'{page.name}: {target}'
    assert len(readme.splitlines()) <= 250


def test_importing_the_suite_leaves_timms_models_alone():
    """Every name timm had before `import backbones` keeps timm's own entrypoint and builds timm's own class."""
    result = succeeded(run_python(['-c', '''
import torch, timm
from timm.models import _registry
before = dict(_registry._model_entrypoints)
import backbones, backbones.dense
after = _registry._model_entrypoints
changed = [name for name, fn in before.items() if after[name] is not fn]
added = sorted(set(after) - set(before))
taken = [name for name in added if name in before]
with torch.device('meta'):
    kinds = {name: type(timm.create_model(name, depth=1)).__module__ for name in
             ('cait_xxs24_224', 'cait_s24_384', 'vit_base_patch16_224', 'deit_small_patch16_224')}
    suite = {name: type(backbones.create_model(name, depth=1)).__module__ for name in ('cait_xxs24_224',)}
print(len(before), changed, taken, kinds, suite, sorted(backbones.suite_models()) == sorted(
    set(backbones.suite_models())), sep='|')
''']))
    count, changed, taken, kinds, suite, unique = result.stdout.strip().splitlines()[-1].split('|')
    assert int(count) > 1000 and changed == '[]' and taken == '[]' and unique == 'True'
    assert kinds == str({'cait_xxs24_224': 'timm.models.cait', 'cait_s24_384': 'timm.models.cait',
                         'vit_base_patch16_224': 'timm.models.vision_transformer',
                         'deit_small_patch16_224': 'timm.models.vision_transformer'})
    assert suite == str({'cait_xxs24_224': 'backbones.cait'})  # the suite's contract comes through create_model


@pytest.mark.slow
def test_importing_and_drawing_leave_matplotlibs_backend_alone():
    """A notebook's backend (here 'svg') stays after importing the trainer, the tools' picture code and drawing a
    picture, and no figure is left in pyplot's registry."""
    result = succeeded(run_python(['-c', '''
import matplotlib
matplotlib.use('svg')
import numpy as np
import classification.train, backbones.dense.pictures, classification.pictures.curves
from backbones.common.drawing import class_colours, figure, finished
fig, axes = figure(1, 2)
axes[0, 0].imshow(np.zeros((4, 4, 3), np.uint8) + class_colours(3)[1])
picture = finished(fig, 'title')
import matplotlib.pyplot as plt
print(matplotlib.get_backend(), picture.ndim, picture.dtype, len(plt.get_fignums()), sep='|')
''']))
    assert result.stdout.strip().splitlines()[-1] == 'svg|3|uint8|0'


@pytest.mark.slow
def test_plain_pytest_collects_the_suite_too():
    """`pytest` (the console script, which puts no folder on the path itself) finds the helpers."""
    command = [Path(sys.executable).with_name('pytest'), '--collect-only', '-q', '-p', 'no:cacheprovider']
    result = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r'^\d+ tests collected', result.stdout.splitlines()[-1])


def test_the_package_and_its_citation_have_the_changelogs_version():
    """pyproject.toml's version and CITATION.cff's (with its release date) are those of CHANGELOG.md's newest
    release: one version, however it is looked up."""
    import tomllib
    import yaml
    release = re.search(r'^## (\d+\.\d+\.\d+) \((\d{4}-\d\d-\d\d)\)', (ROOT / 'CHANGELOG.md').read_text(), re.M)
    package = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['version']
    citation = yaml.safe_load((ROOT / 'CITATION.cff').read_text())
    assert (package, citation['version'], str(citation['date-released'])) == (release[1], release[1], release[2])
