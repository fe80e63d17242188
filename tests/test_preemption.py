"""Runs that survive preemption: SIGTERM mid-epoch writes a checkpoint and exits with status 75; resumed, the run
continues at the next batch to the same losses and weights as an uninterrupted one (token labeling with the full
recipe and loader workers; CIFAR transfer); torchrun restarts resume by themselves."""
from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mmengine.hooks import Hook

from common.errors import Interrupted

from helpers.cifar_data import tiny_cifar
from helpers.commands import ENV, ROOT, run_tool, succeeded
from helpers.models import FAMILIES, TINY_DEIT
from helpers.training_runs import assert_same_run, mid_epoch_point, resume_after_stops

pytestmark = pytest.mark.slow  # tools run end to end here: make test-fast leaves this file out

# the full recipe: RandAugment, random erasing, MixToken, drop-path, EMA, two loader processes, accumulation
FULL = ['--epochs', '3', '--workers', '2', '--ema-decay', '0.9', '--drop-path', '0.1', '--img-size', '32',
        '--batch-size', '2', '--lr-base', '1e-3', '--lr-base-batch', '4', '--warmup-epochs', '1', '--device', 'cpu',
        '--grad-accum-steps', '2']


def test_token_labeling_run_stopped_twice_mid_epoch_ends_like_an_uninterrupted_one(labeled_images, tmp_path):
    data, labels = labeled_images
    args = [*TINY_DEIT, '--data-dir', data, '--token-label-dir', labels, '--token-labeling', *FULL]
    succeeded(run_tool('train_cls.py', [*args, '--output', tmp_path / 'straight']))
    points = resume_after_stops('train_cls.py', [*args, '--output', tmp_path / 'cut'], tmp_path / 'cut', stops=2)
    assert len(set(points)) == 2 and all(batch > 0 for _, batch in points)
    assert_same_run(tmp_path / 'straight', tmp_path / 'cut', epochs=3)


def test_cifar_transfer_stopped_mid_epoch_ends_like_an_uninterrupted_one(tmp_path):
    root, _ = tiny_cifar(tmp_path / 'c10', 'cifar10', per_class_train=12, per_class_test=4, archive=True)
    lvvit = ['lvvit_s', '--model-kwargs', *(f'{k}={v}' for k, v in FAMILIES['lvvit_s'][0].items())]
    args = [*lvvit, '--dataset', 'cifar10', '--data-dir', root, '--img-size', '32', '--batch-size', '8', '--workers',
            '2', '--device', 'cpu', '--epochs', '3', '--drop-path', '0.1']
    succeeded(run_tool('transfer_cifar.py', [*args, '--output', tmp_path / 'straight']))
    resume_after_stops('transfer_cifar.py', [*args, '--output', tmp_path / 'cut'], tmp_path / 'cut', stops=2)
    assert_same_run(tmp_path / 'straight', tmp_path / 'cut', epochs=3)
    assert json.loads((tmp_path / 'cut' / 'metrics.json').read_text()) == \
        json.loads((tmp_path / 'straight' / 'metrics.json').read_text())


def worker_processes(parent: int) -> list:
    """The processes `parent` started (from /proc)."""
    children = []
    for stat in Path('/proc').glob('[0-9]*/stat'):
        try:
            fields = stat.read_text().rsplit(')', 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            children.append(int(stat.parent.name))
    return children


def test_a_run_torchrun_restarts_resumes_from_its_own_checkpoint(labeled_images, tmp_path):
    """torchrun --max-restarts 1: the training process is killed (SIGKILL, no warning) after a mid-epoch
    checkpoint; torchrun starts it again, and it continues from its last.pth by itself to the same end."""
    data, labels = labeled_images
    args = [*TINY_DEIT, '--data-dir', data, '--token-label-dir', labels, '--token-labeling', *FULL]
    succeeded(run_tool('train_cls.py', [*args, '--output', tmp_path / 'straight']))
    cut = tmp_path / 'cut'
    proc = subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', '--nproc-per-node', '1', '--max-restarts',
                             '1', '--master-port', '29631', ROOT / 'tools' / 'train_cls.py', *args, '--output', cut,
                             '--checkpoint-minutes', '1e-6'], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while mid_epoch_point(cut) is None and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    victims = worker_processes(proc.pid)
    assert victims, 'torchrun started no training process'
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-3000:]
    assert 'torchrun restarted the run: resuming from' in output
    assert_same_run(tmp_path / 'straight', cut, epochs=3)


def test_segmentation_stopped_mid_schedule_ends_like_an_uninterrupted_run(tmp_path):
    """train_seg (UperNet with drop path and dropout, two loader workers, a timed checkpoint every iteration): SIGTERM
    finishes the iteration, writes a checkpoint and exits 75; --resume continues to the very weights and optimizer
    state of a run that was never stopped, which takes the seed the stopped run drew and recorded."""
    from helpers.seg_data import write_tiny_ade, write_tiny_config
    from segmentation.runner import checkpoint_meta
    data = write_tiny_ade(tmp_path / 'ade', counts=(('training', 6), ('validation', 2)))
    config = write_tiny_config(tmp_path / 'tiny.py', 'upernet_lvvit_s.py', data)
    args = [ROOT / 'tools' / 'train_seg.py', config, '--iters', '8', '--pictures', '0', '--cfg-options',
            'default_hooks.checkpoint.interval=80000', 'train_dataloader.num_workers=2',
            'train_dataloader.persistent_workers=True', 'train_dataloader.batch_size=2']
    cut = tmp_path / 'cut'
    proc = subprocess.Popen([sys.executable, *map(str, args), '--work-dir', str(cut), '--checkpoint-minutes', '1e-6'],
                            cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline and not (cut / 'iter_2.pth').is_file():
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 75, stderr[-2000:]
    assert 'SIGTERM at iteration' in stderr and '--resume continues it' in stderr and 'Traceback' not in stderr
    stopped = sorted(cut.glob('iter_*.pth'))
    assert len(stopped) == 1 and stopped[0].name != 'iter_8.pth'  # one timed checkpoint, the previous ones replaced
    seed = checkpoint_meta(str(stopped[0]))['seed']
    succeeded(run_tool('train_seg.py', [*args[1:], '--work-dir', cut, '--resume']))
    succeeded(run_tool('train_seg.py', [*args[1:], f'randomness.seed={seed}', '--work-dir', tmp_path / 'straight']))
    a = torch.load(tmp_path / 'straight' / 'iter_8.pth', weights_only=False)
    b = torch.load(cut / 'iter_8.pth', weights_only=False)
    assert sorted(a['state_dict']) == sorted(b['state_dict'])
    for key, value in a['state_dict'].items():
        assert torch.equal(value, b['state_dict'][key]), key
    for key, state in a['optimizer']['state'].items():
        for name in ('exp_avg', 'exp_avg_sq'):
            assert torch.equal(state[name], b['optimizer']['state'][key][name]), (key, name)



class SignalAt(Hook):
    """Sends this process `signum` during iteration `iteration` (before the suite's hook ends the iteration), as a
    scheduler might at that moment."""

    priority = 'NORMAL'

    def __init__(self, iteration: int, signum: int) -> None:
        self.iteration, self.signum = iteration, signum

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if runner.iter + 1 == self.iteration:
            os.kill(os.getpid(), self.signum)


SEG_ITERS = 4  # 2 batches of 2 a pass over the 4 training images; validation every 2, an interval checkpoint every 3
RUNS = itertools.count()


def seg_run(config: Path, work: Path, *options: str, stop_at: int | None = None) -> None:
    """tools/train_seg.py's run of the tiny config, in this process (so that a stop lands on a chosen iteration: a
    SIGUSR1 at `stop_at`)."""
    from segmentation.runner import SuiteRunner
    from segmentation.train import build_parser, prepare
    args = build_parser().parse_args([str(config), '--work-dir', str(work), '--iters', str(SEG_ITERS), '--pictures',
                                      '0', *options, '--cfg-options', 'randomness.seed=3',
                                      'train_dataloader.batch_size=2'])
    cfg = prepare(args)
    cfg.train_cfg.val_interval, cfg.default_hooks.checkpoint.interval = 2, 3  # --iters validates at the end only
    cfg.experiment_name = cfg.visualizer.name = f'run{next(RUNS)}'  # mmengine keeps them by name: one per run
    cfg.visualizer.vis_backends = [dict(type='LocalVisBackend')]  # the metrics compared, without TensorBoard's
    runner = SuiteRunner.from_cfg(cfg)
    if stop_at is not None:
        runner.register_hook(SignalAt(stop_at, signal.SIGUSR1))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the tools run here (helpers.commands.ENV): several times faster on 2 busy cores
    try:
        runner.train()
    finally:
        torch.set_num_threads(threads)


def logged_metrics(work: Path) -> dict:
    """Every training and validation line of a run's vis_data/scalars.json files (one per session), by step and
    kind, without the timings."""
    lines = {}
    for path in work.glob('*/vis_data/scalars.json'):
        for line in map(json.loads, path.read_text().splitlines()):
            kind = 'val' if 'mIoU' in line else 'train'
            lines[(line['step'], kind)] = {k: v for k, v in line.items() if k not in ('time', 'data_time')}
    return lines


@pytest.fixture(scope='module')
def straight_seg_run(tmp_path_factory):
    """The tiny config and its run, never stopped."""
    from helpers.seg_data import write_tiny_ade, write_tiny_config
    root = tmp_path_factory.mktemp('seg_resume')
    data = write_tiny_ade(root / 'ade', counts=(('training', 4), ('validation', 2)))
    config = write_tiny_config(root / 'tiny.py', 'upernet_lvvit_s.py', data)
    seg_run(config, root / 'straight')
    return config, root / 'straight'


def assert_same_checkpoint(a: Path, b: Path, optimizer: bool = True) -> None:
    """Same weights (and optimizer and schedule state), bit for bit."""
    a, b = torch.load(a, weights_only=False), torch.load(b, weights_only=False)
    assert sorted(a['state_dict']) == sorted(b['state_dict'])
    for key, value in a['state_dict'].items():
        assert torch.equal(value, b['state_dict'][key]), key
    if optimizer:
        for key, state in a['optimizer']['state'].items():
            for name, value in state.items():
                assert torch.equal(value, b['optimizer']['state'][key][name]), (key, name)
        assert a['param_schedulers'] == b['param_schedulers']


@pytest.mark.parametrize('stop', [2, 3, SEG_ITERS], ids=['validating', 'past-a-pass', 'last'])
def test_segmentation_stopped_on_any_iteration_resumes_to_the_run_never_stopped(straight_seg_run, stop, tmp_path):
    """A stop (SIGUSR1) on any iteration, then --resume: the validations (the last one's mIoU too), best checkpoint,
    log lines, weights, optimizer and schedule of the run never stopped. A stop on a validating iteration resumes
    into its validation; a resumed run replays the passes over the data before it takes torch's random state back."""
    config, straight = straight_seg_run
    cut = tmp_path / 'cut'
    with pytest.raises(Interrupted, match=f'SIGUSR1 at iteration {stop}'):
        seg_run(config, cut, stop_at=stop)
    seg_run(config, cut, '--resume')
    assert logged_metrics(cut) == logged_metrics(straight)
    assert (SEG_ITERS, 'val') in logged_metrics(cut)
    best = sorted(p.name for p in straight.glob('best_mIoU_iter_*.pth'))
    assert len(best) == 1 and sorted(p.name for p in cut.glob('best_mIoU_iter_*.pth')) == best
    assert_same_checkpoint(straight / best[0], cut / best[0], optimizer=False)
    assert_same_checkpoint(straight / f'iter_{SEG_ITERS}.pth', cut / f'iter_{SEG_ITERS}.pth')
