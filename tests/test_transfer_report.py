"""tools/transfer_report.py (classification/studies/transfer_report.py): a tiny LV-ViT's battery (both probes, "lin."
segmentation, "lin. 1" depth) on tiny sets in ADE20K's and NYU-v2's layouts, stopped by SIGTERM in its second stage
and run again: the finished stage kept, not redone, and the report's rows the stages' own figures; and the refusals,
each one line before any stage runs."""
from __future__ import annotations

import fcntl
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mmengine.logging import HistoryBuffer

from backbones.common.files import load_weights_only
from classification.engine.checkpoints import ARCHITECTURE
from classification.models import create_classifier
from helpers.cls_data import make_image_folder
from helpers.commands import ENV, ROOT, one_line_error, run_tool, succeeded
from helpers.dense_data import write_tiny_dense_config, write_tiny_nyu
from helpers.seg_data import TINY_MODELS, write_tiny_ade, write_tiny_config

TINY = TINY_MODELS['upernet_lvvit_s.py']
PROTOCOLS = ['knn', 'linear', 'seg-linear', 'depth-linear']


@pytest.fixture(scope='module')
def battery(tmp_path_factory) -> tuple[Path, list[str]]:
    """A tiny LV-ViT classifier's checkpoint as train_cls writes its architecture, and the report's arguments."""
    root = tmp_path_factory.mktemp('battery')
    torch.manual_seed(0)
    # a training setting among the recorded arguments, as train_cls records them: not the model the configs build
    model = create_classifier('lvvit_s', num_classes=4, img_size=64, drop_path_rate=0.1, **TINY)
    checkpoint = root / 'tiny.pth'
    torch.save({'state_dict': model.state_dict(), ARCHITECTURE: model.architecture, 'args': {'img_size': 64}},
               checkpoint)
    images = make_image_folder(root / 'images', {'train': 10, 'val': 4})
    seg = write_tiny_config(root / 'lin.py', 'linear_lvvit_s.py', write_tiny_ade(root / 'ade'))
    depth = write_tiny_dense_config(root / 'lin1.py', 'depth_linear_lvvit_s.py', write_tiny_nyu(root / 'nyu'))
    return root, [checkpoint, '--protocols', *PROTOCOLS, '--config', f'seg-linear={seg}', f'depth-linear={depth}',
                  '--data', f'knn={images}', '--iters', '2', '--probe-epochs', '2', '--workers', '0']


@pytest.mark.slow  # the tools of three stages, twice
def test_a_sigterm_in_the_second_stage_keeps_the_first_and_the_rerun_reports_every_stages_figures(battery):
    root, argv = battery
    out = root / 'report'
    command = [sys.executable, str(ROOT / 'tools' / 'transfer_report.py'), *map(str, argv), '--out', str(out)]
    proc = subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 600
    while not (out / 'stages' / 'seg-linear.log').exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)  # the probes' stage is done, the segmentation's has started
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 75 and 'interrupted: SIGTERM' in output and 'Traceback' not in output, output[-3000:]
    probes = out / 'stages' / 'probes.json'
    assert probes.is_file() and not (out / 'stages' / 'seg-linear.json').exists()
    assert not (out / 'results.json').exists()
    written = probes.stat().st_mtime_ns

    rerun = succeeded(run_tool('transfer_report.py', [*argv, '--out', out]))
    log = rerun.stdout + rerun.stderr
    assert 'probes: done in an earlier run' in log and 'tools/probe_features.py' not in log
    assert probes.stat().st_mtime_ns == written
    assert 'seg-linear: lin. (DINOv2), training' in log and 'depth-linear: lin. 1 (DINOv2), test' in log

    rows = {row['protocol']: row for row in json.loads((out / 'results.json').read_text())['figures']['rows']}
    assert list(rows) == PROTOCOLS
    probed = json.loads((out / 'stages' / 'probes' / 'results.json').read_text())
    for kind in ('knn', 'linear'):
        assert rows[kind]['score'] == round(probed[kind]['chosen']['test'], 2)
    for name, metric, scale in (('seg-linear', 'mIoU', 1), ('depth-linear', 'd1', 100)):
        scores = json.loads((out / 'stages' / name / 'scores.json').read_text())
        assert rows[name]['score'] == round(scores[metric] * scale, 2) and rows[name]['metric'].startswith(metric)
    table = (out / 'report.md').read_text().splitlines()
    assert [line.split('|')[1].strip() for line in table[4:]] == PROTOCOLS
    assert (out / 'report.png').read_bytes()[:4] == b'\x89PNG'


def test_bad_input_is_one_line_before_any_stage(battery, tmp_path):
    root, argv = battery
    checkpoint, *options = argv
    out = ['--out', tmp_path / 'out']
    model = create_classifier('lvvit_s', num_classes=4, img_size=64, **TINY)
    detector = tmp_path / 'iter_2.pth'  # a dense model's checkpoint, as mmengine writes it
    torch.save({'meta': {'buffer': HistoryBuffer()}, 'state_dict': model.state_dict()}, detector)
    release = tmp_path / 'release.pth'  # weights alone: no model recorded
    torch.save(load_weights_only(checkpoint)['state_dict'], release)
    other = write_tiny_config(tmp_path / 'dinov2.py', 'linear_dinov2_s.py', root / 'ade')
    refusals = {
        'an mmengine checkpoint': [detector, *options],
        'does not record its model (a release file): give --model': [release, *options],
        "--config knn=...: the probes take no config": [checkpoint, '--config', 'knn=x.py'],
        "--data segm=/data: no protocol 'segm'": [checkpoint, '--data', 'segm=/data'],
        '--config: seg-linear given twice': [checkpoint, '--config', 'seg-linear=a.py', 'seg-linear=b.py'],
        'builds vit_small_patch14_reg4_dinov2': [checkpoint, '--protocols', 'seg-linear', '--config',
                                                 f'seg-linear={other}'],
        'is the model pretrained on the embedded scans': ['lvvit_s', '--data', 'knn=/data/imagenet'],
        'tiny.pth: classifier checkpoint not found': [tmp_path / 'tiny.pth'],
        "--pretrained takes timm's weights of a model name": [checkpoint, '--pretrained'],
        '--data upernet=/data: upernet is not among the protocols run': [checkpoint, '--data', 'upernet=/data'],
        '--model deit_small_patch16_224: ': [checkpoint, '--model', 'deit_small_patch16_224'],
        '--iters 2: none of the protocols run (knn linear) takes it': [checkpoint, '--protocols', 'knn', 'linear',
                                                                        '--iters', '2'],
    }
    for expected, args in refusals.items():
        message = one_line_error(run_tool('transfer_report.py', [*args, *out]))
        assert expected in message, (expected, message)
    assert not (tmp_path / 'out').exists()
    unknown = run_tool('transfer_report.py', [checkpoint, '--protocols', 'segmentation', *out])
    assert unknown.returncode == 2 and "invalid choice: 'segmentation'" in unknown.stderr


def test_a_stage_that_failed_takes_other_settings_and_a_done_one_other_workers(battery, tmp_path):
    """Nothing made: the stage runs with the corrected settings (what the failed try left is dropped); done: kept
    when only how it runs changes (--workers); an --out in use by another report is refused."""
    _, argv = battery
    checkpoint, images = argv[0], next(arg for arg in argv if str(arg).startswith('knn='))
    out = tmp_path / 'report'
    probes = [checkpoint, '--protocols', 'knn', 'linear', '--probe-epochs', '2', '--out', out]
    failed = run_tool('transfer_report.py', [*probes, '--data', 'knn=/nonexistent', '--workers', '0'])
    assert failed.returncode == 2 and '/nonexistent' in failed.stderr
    succeeded(run_tool('transfer_report.py', [*probes, '--data', images, '--workers', '0']))
    again = succeeded(run_tool('transfer_report.py', [*probes, '--data', images, '--workers', '1']))
    assert 'probes: done in an earlier run' in again.stdout + again.stderr
    with open(out / '.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        message = one_line_error(run_tool('transfer_report.py', [*probes, '--data', images]))
    assert f'{out} is in use by another transfer report' in message
