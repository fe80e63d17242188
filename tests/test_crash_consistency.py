"""A kill at any checkpoint write, then --resume, ends where the uninterrupted run ends: the same losses, weights,
best epoch and metrics, and best.pth holding the best epoch's weights (train_cls and transfer_cifar)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.cifar_data import tiny_cifar
from helpers.cls_data import make_image_folder
from helpers.commands import ROOT, run_python, succeeded
from helpers.models import TINY_DEIT
from helpers.training_runs import assert_same_run

pytestmark = pytest.mark.slow  # tools run end to end here: make test-fast leaves this file out



def kill_everywhere(tool: str, args, out_root: Path) -> dict:
    killer = ROOT / 'tests' / 'helpers' / 'kill_at_write.py'
    result = succeeded(run_python([killer, tool, out_root, *args], timeout=900))
    return json.loads(result.stdout.strip().splitlines()[-1])


def assert_every_kill_recovers(summary: dict, out_root: Path, epochs: int) -> None:
    points = summary['points']
    # Every epoch writes last.pth (then best.pth when it improved), and the run ends with metrics.json.
    assert points[:4] == ['before last.pth', 'after last.pth', 'before best.pth', 'after best.pth']
    assert points[-2:] == ['before metrics.json', 'after metrics.json']
    assert points.count('after last.pth') == epochs
    assert summary['straight'] == 0
    assert summary['killed'] == [-9] * len(points)
    assert summary['resumed'] == [0] * len(points)
    straight = out_root / 'straight'
    expected = json.loads((straight / 'metrics.json').read_text())
    best = torch.load(straight / 'best.pth', weights_only=True)
    for n in range(1, len(points) + 1):
        out = out_root / f'kill_{n}'
        assert_same_run(straight, out, epochs=epochs)
        assert json.loads((out / 'metrics.json').read_text()) == expected, points[n - 1]
        held = torch.load(out / 'best.pth', weights_only=True)
        assert held['epochs_done'] == expected['best_epoch'], points[n - 1]
        assert all(torch.equal(held['state_dict'][k], v) for k, v in best['state_dict'].items()), points[n - 1]
        assert not [p.name for p in out.iterdir() if '.tmp' in p.name], points[n - 1]


def test_train_cls_recovers_from_a_kill_at_every_write_point(tmp_path):
    data = make_image_folder(tmp_path / 'data')
    # A run whose validation top-1 improves in later epochs too (66.7, 66.7, 83.3, 100 here): best.pth is rewritten.
    args = [*TINY_DEIT, '--data-dir', str(data), '--no-token-labeling', '--img-size', '32', '--batch-size', '4',
            '--lr-base', '1e-3', '--lr-base-batch', '4', '--epochs', '4', '--warmup-epochs', '1', '--workers', '0',
            '--device', 'cpu', '--ema-decay', '0']
    summary = kill_everywhere('train_cls.py', args, tmp_path / 'runs')
    assert_every_kill_recovers(summary, tmp_path / 'runs', epochs=4)


def test_transfer_cifar_recovers_from_a_kill_at_every_write_point(tmp_path):
    root, _ = tiny_cifar(tmp_path / 'c10', 'cifar10', per_class_train=6, per_class_test=2, archive=True)
    args = [*TINY_DEIT, '--dataset', 'cifar10', '--data-dir', str(root), '--img-size', '32', '--batch-size', '8',
            '--workers', '0', '--device', 'cpu', '--epochs', '3']
    summary = kill_everywhere('transfer_cifar.py', args, tmp_path / 'runs')
    assert_every_kill_recovers(summary, tmp_path / 'runs', epochs=3)
