"""The dense tasks' seam: a config's task is found by its model's type, the three tasks each register from their own
folder, nothing outside those folders compares task names, and a task of a test's own, registered from one module,
trains, tests, predicts and exports through the unchanged tools."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.config import Config

import backbones.dense  # noqa: F401  (registration)
from backbones.dense.run_data import checkpoint_record
from backbones.dense.tasks import TASKS, task_of, task_recognised_by
from helpers.commands import ENV, ROOT, run_tool, succeeded
from helpers.dense_data import write_tiny_dense_config, write_tiny_nyu
from helpers.seg_data import CONFIGS

TASK_FOLDERS = ('backbones/dense/semantic', 'backbones/dense/instances', 'backbones/dense/depth')


@pytest.mark.parametrize('config, name', [('upernet_lvvit_s.py', 'semantic'), ('fcn_lvvit_s.py', 'semantic'),
                                          ('maskrcnn_lvvit_s.py', 'instances'), ('depth_lvvit_s.py', 'depth')])
def test_a_configs_task_is_found_by_its_models_type(config, name):
    cfg = Config.fromfile(CONFIGS / config)
    assert task_of(cfg) is TASKS[name]
    wrapped = Config(dict(model=dict(type='FlipBatchTTAModel', module=cfg.model.to_dict())))  # a test-time wrapper
    assert task_of(wrapped) is TASKS[name]


def test_each_task_lives_in_its_folder_and_its_heads_weights_name_it():
    assert {name: Path(type(task).__module__.replace('.', '/')).parent.as_posix() for name, task in TASKS.items()
            if name in ('semantic', 'instances', 'depth')} == dict(zip(('semantic', 'instances', 'depth'),
                                                                       TASK_FOLDERS))
    assert task_recognised_by(['backbone.x', 'roi_heads.box_head.fc.weight']) is TASKS['instances']
    assert task_recognised_by(['decode_head.depth_layer.weight']) is TASKS['depth']
    assert task_recognised_by(['decode_head.conv_seg.weight']) is TASKS['semantic']
    assert task_recognised_by(['backbone.x']) is None


def test_no_code_outside_the_task_folders_compares_task_names():
    """The names are data (checkpoints and export folders record them); only a task's own folder and the registry
    speak of one. A quoted task name beside ==, !=, `in` or a dict key is a branch on it."""
    names = r"""['"](?:semantic|instances|depth)['"]"""
    pattern = re.compile(rf'(?:==|!=|\bin\s*[(\[{{]?)\s*{names}|{names}\s*(?:==|!=|:)')
    found = []
    for package in ('backbones', 'classification', 'tools'):
        for path in sorted((ROOT / package).rglob('*.py')):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith(TASK_FOLDERS) or relative == 'backbones/dense/tasks.py':
                continue
            found += [f'{relative}:{n}' for n, line in enumerate(path.read_text().splitlines(), 1)
                      if pattern.search(line)]
    assert found == []


@pytest.fixture(scope='module')
def nearness(tmp_path_factory) -> tuple[Path, Path, Path, dict]:
    """The test-only task's config (a tiny depth config whose model is the task's type, naming the task's module
    in its custom_imports) on a tiny NYU-layout set, trained for two iterations by train_seg; the environment that
    finds the module."""
    root = tmp_path_factory.mktemp('nearness')
    data = write_tiny_nyu(root / 'nyu')
    config = write_tiny_dense_config(root / 'nearness.py', 'depth_lvvit_s.py', data)
    config.write_text(config.read_text() + "model['type'] = 'NearnessEstimator'\n"
                      "custom_imports = dict(imports=['backbones.dense', 'toy_dense_task'], "
                      "allow_failed_imports=False)\n")
    env = {**ENV, 'PYTHONPATH': str(ROOT / 'tests' / 'helpers')}
    trained = succeeded(run_tool('train_seg.py', [config, '--work-dir', root / 'work', '--iters', '2'], env=env))
    return config, root / 'work' / 'iter_2.pth', data, {'env': env, 'log': trained.stdout + trained.stderr}


@pytest.mark.slow  # tools run end to end
def test_a_task_registered_in_one_module_runs_through_the_unchanged_tools(nearness, tmp_path):
    config, checkpoint, data, run = nearness
    env = run['env']
    assert checkpoint_record(str(checkpoint))['task'] == 'nearness'  # what later tools find the task by

    tested = succeeded(run_tool('test_seg.py', [config, checkpoint, '--out', tmp_path / 'scores.json', '--work-dir',
                                                 tmp_path / 'work'], env=env))
    scores = json.loads((tmp_path / 'scores.json').read_text())
    assert 0 <= scores['near_agreement'] <= 1
    assert f"single-scale: near_agreement {scores['near_agreement']:.4f}" in tested.stdout + tested.stderr

    image = sorted((data / 'images' / 'test').glob('*.jpg'))[0]
    succeeded(run_tool('predict_seg.py', [config, checkpoint, image, '--out', tmp_path / 'near'], env=env))
    written = json.loads((tmp_path / 'near' / f'{image.stem}.json').read_text())
    assert written['image'] == str(image) and 0 <= written['near_share'] <= 1

    succeeded(run_tool('export.py', ['segmentor', config, checkpoint, '--out', tmp_path / 'export', '--size', '48',
                                     '64', '--torch-export'], env=env))
    description = json.loads((tmp_path / 'export' / 'export.json').read_text())
    assert description['task'] == 'nearness' and description['near_metres'] == 4.5
    program = torch.export.load(tmp_path / 'export' / 'model.pt2').module()
    with torch.no_grad():
        near = program(torch.zeros(1, 3, 48, 64))
    assert near.shape == (1, 1, 48, 64) and set(np.unique(near.numpy())) <= {0.0, 1.0}

    for option in ('--ms', '--show-dir'):  # what the task has no use for is refused before any work
        args = [config, checkpoint, option] + ([str(tmp_path / 'pictures')] if option == '--show-dir' else [])
        refused = run_tool('test_seg.py', args, env=env)
        assert refused.returncode == 2 and 'is a nearness config' in refused.stderr.strip().splitlines()[-1]


@pytest.mark.slow  # tools run end to end
def test_the_tools_without_the_tasks_module_name_it(nearness, tmp_path):
    """A config whose task module does not import is a one-line error naming it, before any work."""
    config = nearness[0]
    result = run_tool('test_seg.py', [config, nearness[1]], env={**ENV, 'PYTHONPATH': os.devnull})
    assert result.returncode == 2
    assert "custom_imports names toy_dense_task, which does not import" in result.stderr.strip().splitlines()[-1]
