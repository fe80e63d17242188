"""A model family declared in one module (tests/helpers/toy_family.py: its models and its `Family` record) runs through
the suite's unchanged entry points: it trains on its record's recipe, distills as a student with a distillation token,
evaluates and exports, builds a windowed dense backbone, and its checkpoints are recognised as its own.

The module is imported where a user's is: first thing in a user's script that then calls the functions the tools
call, and through a dense config's custom_imports in the tools themselves. Never in the test process, where the
family would join every other test's (`backbones.families()`)."""
from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence

import pytest
import torch

from backbones.registry import families
from classification.recipes import RECIPES
from helpers.cls_data import make_image_folder
from helpers.commands import ENV, ROOT, one_line_error, run_python, run_tool, succeeded
from helpers.seg_data import write_tiny_ade, write_tiny_config
from helpers.training_runs import read_log

NAME = 'toy_vit_tiny'
FAMILY_ENV = {**ENV, 'PYTHONPATH': str(ROOT / 'tests' / 'helpers')}  # where the family's module is found


def users_script(*calls: tuple[str, Sequence]) -> subprocess.CompletedProcess:
    """A user's script in a process of its own: the family's module imported, then each (module, argv)'s
    `main(argv)`, the library function its tool calls, in turn."""
    lines = ['import importlib', 'import toy_family  # noqa: F401'] + [
        f'importlib.import_module({module!r}).main({[str(arg) for arg in argv]!r})' for module, argv in calls]
    return succeeded(run_python(['-c', '\n'.join(lines)], env=FAMILY_ENV))


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """One user's script on a tiny image folder: the toy trained for an epoch, a student of it distilled from that
    run, the student evaluated, the trained toy exported."""
    root = tmp_path_factory.mktemp('toy_family')
    data = make_image_folder(root / 'data')
    tiny = ['--data-dir', data, '--img-size', '32', '--batch-size', '4', '--epochs', '1', '--warmup-epochs', '0',
            '--workers', '0', '--device', 'cpu']
    trained = root / 'run' / 'last.pth'
    users_script(('classification.train', [NAME, *tiny, '--output', root / 'run']),
                 ('classification.train', [NAME, *tiny, '--output', root / 'student', '--teacher', NAME,
                                           '--teacher-checkpoint', trained]),
                 ('classification.evaluate', [NAME, '--checkpoint', root / 'student' / 'last.pth', '--data-dir', data,
                                              '--workers', '0', '--json', root / 'student.json']),
                 ('classification.export', ['classifier', NAME, '--checkpoint', trained, '--out', root / 'export',
                                            '--torch-export']))
    return root


def test_every_familys_record_names_a_recipe():
    assert {family.recipe for family in families()} <= set(RECIPES)


@pytest.mark.slow  # a user's script: two tiny trainings, an evaluation and an export
def test_the_family_trains_on_its_records_recipe(runs):
    checkpoint = torch.load(runs / 'run' / 'last.pth', weights_only=True)
    assert checkpoint['args']['model'] == NAME and 'norm_pre.weight' in checkpoint['state_dict']
    recipe = {key: checkpoint['args'][key] for key in ('token_labeling', 'aug_repeats', 'cooldown_epochs', 'drop_path')}
    assert recipe == {'token_labeling': False, 'aug_repeats': 0, 'cooldown_epochs': 0, 'drop_path': 0.1}  # DeiT's
    assert 0 <= read_log(runs / 'run')[1]['top1'] <= 100


@pytest.mark.slow
def test_a_student_of_the_family_distills_with_a_distillation_token_and_evaluates(runs):
    metrics = json.loads((runs / 'student' / 'metrics.json').read_text())
    assert metrics['teacher'] == NAME and not metrics['token_labeling']
    student = torch.load(runs / 'student' / 'last.pth', weights_only=True)['state_dict']
    assert student['dist_token'].shape == (1, 1, 32) and student['head_dist.weight'].shape == (3, 32)
    evaluated = json.loads((runs / 'student.json').read_text())
    assert evaluated['top1'] == pytest.approx(read_log(runs / 'student')[1]['top1'])


@pytest.mark.slow
def test_the_family_exports_for_timm(runs):
    config = json.loads((runs / 'export' / 'config.json').read_text())
    assert config['architecture'] == NAME
    assert {'model.safetensors', 'config.json', 'model.pt2'} <= {path.name for path in (runs / 'export').iterdir()}
    program = torch.export.load(runs / 'export' / 'model.pt2').module()
    with torch.no_grad():
        assert program(torch.zeros(2, 3, 32, 32)).shape == (2, 3)


@pytest.mark.slow  # train_seg and test_seg end to end
def test_the_tools_build_it_windowed_and_know_its_checkpoints_by_its_keys(runs, tmp_path):
    """A dense config names the family's module in its custom_imports, as it would a task's: train_seg builds the
    toy as a windowed backbone (relative positions in every block, windows in all but the last) from the toy's
    classification run; test_seg, given that classifier, names its family (from its keys) before any work."""
    config = write_tiny_config(tmp_path / 'toy.py', 'upernet_deit_s.py', write_tiny_ade(tmp_path / 'ade'))
    config.write_text(config.read_text() + (
        f"model['backbone'].update(model_name={NAME!r}, model_kwargs={{}}, window_size=2, global_blocks=(3,), "
        f"rel_pos=True, pretrained={str(runs / 'run' / 'last.pth')!r})\n"
        "custom_imports = dict(imports=['backbones.dense', 'toy_family'], allow_failed_imports=False)\n"))
    succeeded(run_tool('train_seg.py', [config, '--work-dir', tmp_path / 'work', '--iters', '2'], env=FAMILY_ENV))
    segmentor = torch.load(tmp_path / 'work' / 'iter_2.pth', weights_only=False)['state_dict']
    assert sorted(key for key in segmentor if 'rel_pos' in key) == [
        f'backbone.model.blocks.{i}.attn.rel_pos_{axis}' for i in range(4) for axis in 'hw']
    refused = run_tool('test_seg.py', [config, runs / 'run' / 'last.pth'], env=FAMILY_ENV)
    assert 'holds an image classifier (toy_vit weights' in one_line_error(refused)
