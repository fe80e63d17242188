"""Runs that survive preemption: SIGTERM mid-epoch writes a checkpoint and exits with status 75; resumed, the run
continues at the next batch to the same losses and weights as an uninterrupted one (token labeling with the full
recipe and loader workers; CIFAR transfer; segmentation stopped on any iteration, its validating ones and the last
included, or signalled as a whole job); torchrun restarts resume by themselves."""
from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mmengine.hooks import Hook

from backbones.common.errors import Interrupted
from helpers.cifar_data import tiny_cifar
from helpers.commands import ENV, ROOT, free_port, run_tool, succeeded
from helpers.models import FAMILIES, TINY_DEIT
from helpers.training_runs import assert_same_run, mid_epoch_point, resume_after_stops

pytestmark = pytest.mark.slow  # tools run end to end here: make test-fast leaves this file out

# the full recipe: RandAugment, random erasing, MixToken, drop-path, EMA, two loader processes, accumulation
FULL = ['--epochs', '3', '--workers', '2', '--ema-decay', '0.9', '--drop-path', '0.1', '--img-size', '32',
        '--batch-size', '2', '--lr-base', '1e-3', '--lr-base-batch', '4', '--warmup-epochs', '1', '--device', 'cpu',
        '--grad-accum-steps', '2']


@pytest.mark.parametrize('augment', ['pil', 'batched'])
def test_token_labeling_run_stopped_twice_mid_epoch_ends_like_an_uninterrupted_one(labeled_images, tmp_path, augment):
    """Batches prepared two ahead by the prefetcher (on the batched path its device half too, erasing's noise drawn
    from each batch's own seed) are trained on again after the stop as the uninterrupted run trained on them."""
    data, labels = labeled_images
    args = [*TINY_DEIT, '--data-dir', data, '--token-label-dir', labels, '--token-labeling', *FULL, '--augment',
            augment]
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
                             '1', '--master-port', str(free_port()), ROOT / 'tools' / 'train_cls.py', *args, '--output',
                             cut, '--checkpoint-minutes', '1e-6'], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
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


class SignalAt(Hook):
    """Sends this process `signum` during iteration `iteration` (before the suite's hook ends the iteration), as a
    scheduler might at that moment."""

    priority = 'NORMAL'

    def __init__(self, iteration: int, signum: int) -> None:
        self.iteration, self.signum = iteration, signum

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if runner.iter + 1 == self.iteration:
            os.kill(os.getpid(), self.signum)


SEG_ITERS = 5
# train_seg on the tiny config: validation every 2 iterations (and after the last), an interval checkpoint every 3;
# two persistent loader processes over the 6 training images (3 batches a pass) under the configs' own
# InfiniteSampler (which train_seg places where a resumed run starts), one validation loader process kept (as the
# configs do). REPLAYED: a sampler the loop cannot place, whose loader it replays (two loader processes started anew
# for each pass)
SEG_OPTIONS = ('--pictures', '0', '--cfg-options', 'randomness.seed=3', f'train_cfg.max_iters={SEG_ITERS}',
               'train_cfg.val_interval=2', 'default_hooks.checkpoint.interval=3', 'train_dataloader.batch_size=2',
               'train_dataloader.num_workers=2', 'val_dataloader.num_workers=1',
               'val_dataloader.persistent_workers=True')
REPLAYED = ('train_dataloader.persistent_workers=False', 'train_dataloader.sampler.type=DefaultSampler',
            'train_dataloader.num_workers=0', 'val_dataloader.num_workers=0', 'val_dataloader.persistent_workers=False')
RUNS = itertools.count()


def seg_run(config: Path, work: Path, stop_at: int | None = None, options: tuple = ()) -> None:
    """tools/train_seg.py CONFIG SEG_OPTIONS `options`, in this process (so that a stop lands on a chosen iteration:
    a SIGUSR1 at `stop_at`); with --resume where `work` holds a run."""
    from backbones.dense.runner import SuiteRunner
    from backbones.dense.train import build_parser, prepare
    resume = ['--resume'] if (work / 'last_checkpoint').is_file() else []
    argv = [str(config), '--work-dir', str(work), *resume, *SEG_OPTIONS, *options]
    cfg = prepare(build_parser().parse_args(argv)).cfg
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
            kind = 'val' if {'mIoU', 'mask_AP', 'abs_rel'} & set(line) else 'train'
            lines[(line['step'], kind)] = {k: v for k, v in line.items() if k not in ('time', 'data_time')}
    return lines


@pytest.fixture(scope='module')
def seg_straight(tmp_path_factory):
    """The tiny config, and its run never stopped."""
    from helpers.seg_data import write_tiny_ade, write_tiny_config
    root = tmp_path_factory.mktemp('seg_resume')
    data = write_tiny_ade(root / 'ade', counts=(('training', 6), ('validation', 2)))
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


def assert_same_seg_run(straight: Path, cut: Path, score: str = 'mIoU') -> None:
    """The stopped and resumed run logged what the run never stopped logged (every training and validation line,
    the last validation's too), kept the same best checkpoint (by `score`) and ended on the same weights, optimizer
    and schedule, bit for bit."""
    assert logged_metrics(cut) == logged_metrics(straight)
    assert (SEG_ITERS, 'val') in logged_metrics(cut)
    best = sorted(p.name for p in straight.glob(f'best_{score}_iter_*.pth'))
    assert len(best) == 1 and sorted(p.name for p in cut.glob(f'best_{score}_iter_*.pth')) == best
    assert_same_checkpoint(straight / best[0], cut / best[0], optimizer=False)
    assert_same_checkpoint(straight / f'iter_{SEG_ITERS}.pth', cut / f'iter_{SEG_ITERS}.pth')


@pytest.mark.parametrize('stop', [4, SEG_ITERS], ids=['validating-in-a-new-pass', 'last'])
def test_segmentation_stopped_on_a_validating_iteration_resumes_into_its_validation(seg_straight, stop, tmp_path):
    """A stop (SIGUSR1) on a validating iteration, the last one included, leaves a checkpoint written before the
    validation; --resume runs that validation, then goes on as the run never stopped. At 4 the resumed run starts
    in a new pass over the data, and starts its validation loader there (drawing from torch's stream: each
    validation is kept out of training's random streams)."""
    config, straight = seg_straight
    cut = tmp_path / 'cut'
    with pytest.raises(Interrupted, match=f'SIGUSR1 at iteration {stop}'):
        seg_run(config, cut, stop_at=stop)
    seg_run(config, cut)
    assert_same_seg_run(straight, cut)


def test_segmentation_resumed_reads_only_the_images_it_trains_on_and_ends_as_the_run_never_stopped(
        seg_straight, tmp_path, monkeypatch):
    """Stopped on iteration 2 (a validating one) of 5, the run resumed reads the 3 x 2 training images it trains on
    and no other (mmengine's resume reads the 2 x 2 done again, to drop them), yet ends on the run never stopped:
    each sample is augmented from (seed, pass, index), the same in the loader processes of the straight run and
    in the training process of this one, which has none (`train_dataloader.num_workers=0`)."""
    from mmcv.transforms import LoadImageFromFile
    config, straight = seg_straight
    cut = tmp_path / 'cut'
    with pytest.raises(Interrupted, match='SIGUSR1 at iteration 2'):
        seg_run(config, cut, stop_at=2)
    read = []
    load = LoadImageFromFile.transform
    monkeypatch.setattr(LoadImageFromFile, 'transform', lambda self, results: read.append(results['img_path'])
                        or load(self, results))
    seg_run(config, cut, options=('train_dataloader.num_workers=0',))
    assert len([path for path in read if '/training/' in path]) == (SEG_ITERS - 2) * 2
    assert_same_seg_run(straight, cut)


def test_segmentation_on_a_sampler_the_loop_cannot_place_resumes_by_replaying_its_loader(seg_straight, tmp_path):
    """Under another sampler than InfiniteSampler (an epoch's DefaultSampler, its loader restarted for each pass) the
    resumed run replays the loader through the iterations done, and ends on that sampler's run never stopped: the
    replay starts a new pass (drawing from torch's stream before the run takes the checkpoint's back)."""
    config, _ = seg_straight
    seg_run(config, tmp_path / 'straight', options=REPLAYED)
    with pytest.raises(Interrupted, match='SIGUSR1 at iteration 4'):
        seg_run(config, tmp_path / 'cut', stop_at=4, options=REPLAYED)
    seg_run(config, tmp_path / 'cut', options=REPLAYED)
    assert_same_seg_run(tmp_path / 'straight', tmp_path / 'cut')


@pytest.mark.parametrize('config_name, score', [('maskrcnn_lvvit_s.py', 'mask_AP'), ('depth_lvvit_s.py', 'abs_rel')],
                         ids=['detector', 'depth'])
def test_a_detector_and_a_depth_model_stopped_resume_to_the_run_never_stopped(config_name, score, tmp_path):
    """The detector's (torchvision's region sampling draws from torch's stream) and the depth model's runs, stopped
    on a validating iteration at the start of a new pass over the data, resume into the run never stopped."""
    from helpers.dense_data import write_tiny_coco, write_tiny_dense_config, write_tiny_nyu
    detector = config_name.startswith('maskrcnn')
    data = write_tiny_coco(tmp_path / 'coco') if detector else write_tiny_nyu(tmp_path / 'nyu')
    config = write_tiny_dense_config(tmp_path / 'tiny.py', config_name, data)
    seg_run(config, tmp_path / 'straight')
    with pytest.raises(Interrupted, match='SIGUSR1 at iteration 4'):
        seg_run(config, tmp_path / 'cut', stop_at=4)
    seg_run(config, tmp_path / 'cut')
    assert_same_seg_run(tmp_path / 'straight', tmp_path / 'cut', score)


def test_segmentation_job_signalled_mid_schedule_stops_and_resumes_to_the_run_never_stopped(seg_straight, tmp_path):
    """SIGTERM to the whole job (its process group, as SLURM's scancel sends it) while train_seg trains with loader
    processes: they leave the signal to the training process, which finishes the iteration, writes a checkpoint and
    exits 75 (the loader processes died with the signal: a traceback, exit status 1, no checkpoint); --resume then
    ends on the run never stopped."""
    config, straight = seg_straight
    cut = tmp_path / 'cut'
    with open(tmp_path / 'stderr', 'w') as errors:  # a file, not a pipe the test would have to keep reading
        proc = subprocess.Popen([sys.executable, ROOT / 'tools' / 'train_seg.py', config, '--work-dir', cut,
                                 *SEG_OPTIONS], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=errors,
                                start_new_session=True)  # a process group of its own: the job
        try:
            deadline = time.time() + 300
            while proc.poll() is None and time.time() < deadline and not logged_metrics(cut):
                time.sleep(0.02)
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:  # a job that does not end (its loader processes waited for) is not left behind
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    stderr = (tmp_path / 'stderr').read_text()
    assert proc.returncode == 75, stderr[-2000:]
    assert 'Traceback' not in stderr and '--resume continues it' in stderr
    stop = int(re.search(r'SIGTERM at iteration (\d+)', stderr).group(1))
    assert stop < SEG_ITERS and (cut / f'iter_{stop}.pth').is_file()
    seg_run(config, cut)
    assert_same_seg_run(straight, cut)


STARTING_COMMAND = '''
import os, signal, time
from backbones.common.commands import run_command

def main():
    child = os.fork()
    if child == 0:  # a loader-like child that sets no handler: the signal's default action ends it
        time.sleep(60)
        os._exit(0)
    time.sleep(1)  # past the fork's own set-up (Python drops a signal that arrives before it)
    os.kill(child, signal.SIGTERM)
    _, status = os.waitpid(child, 0)
    print('child', os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, flush=True)
    time.sleep(60)  # the start-up of a command: no training loop notes the signals yet

run_command(main)
'''


def test_a_command_signalled_before_its_loop_stops_with_a_word_not_status_143():
    """SIGTERM during a command's start-up (before a training loop notes it, or in an evaluation or export) ended it
    with status 143 and no word: it is one 'interrupted' line and status 75, and forked children keep the default."""
    process = subprocess.Popen([sys.executable, '-c', STARTING_COMMAND], cwd=ROOT, env=ENV, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    assert process.stdout.readline().strip() == 'child True'
    os.killpg(process.pid, signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 75, stderr
    assert stderr.strip().splitlines() == ["interrupted: SIGTERM before the command's work was done (nothing "
                                           "half-written is left): run the same command again"]


FORMATTING_COMMAND = '''
import os, signal
import yapf.yapflib.yapf_api as yapf_api
from mmengine.config import config as mmengine_config
from backbones.common.commands import run_command
from backbones.dense.config import load_config

format_code = yapf_api.FormatCode

def signalled_format(*args, **kwargs):  # the stop arrives while yapf formats the config's text
    os.kill(os.getpid(), signal.{signal})
    return format_code(*args, **kwargs)

mmengine_config.FormatCode = signalled_format
run_command(lambda: print(len(load_config('seg_configs/upernet_lvvit_s.py').pretty_text)))
'''


def test_a_stop_while_mmengine_formats_the_config_is_the_one_line_interrupted_exit():
    """mmengine turns anything raised while yapf formats a config (a bare except) into 'SyntaxError: Failed to format
    the config file': a stop signal then was three tracebacks and status 1, which a scheduler requeuing on 75 takes
    for a failure. The signal waits for the formatting, then stops the command as anywhere else in its start-up
    (Ctrl-C is held back the same way)."""
    result = subprocess.run([sys.executable, '-c', FORMATTING_COMMAND.replace('{signal}', 'SIGTERM')], cwd=ROOT,
                            env=ENV, capture_output=True, text=True, timeout=120)
    assert result.returncode == 75, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith('interrupted: SIGTERM')
    assert 'Traceback' not in result.stderr and 'SyntaxError' not in result.stderr


def test_a_stop_while_weights_are_copied_is_the_stop_not_a_checkpoint_that_does_not_fit(monkeypatch):
    """torch records any Exception raised while a weight is copied as a load error, which mmengine's strict load
    turned into 'does not fit the model' (exit 2, no keys named): a stop is no exception of that kind."""
    from mmengine.runner.checkpoint import load_state_dict
    model = torch.nn.Linear(2, 2)
    state = {key: value.clone() for key, value in model.state_dict().items()}

    def stopped(*_args, **_kwargs):
        raise Interrupted('SIGTERM before the command\'s work was done')

    monkeypatch.setattr(torch.Tensor, 'copy_', stopped)
    with pytest.raises(Interrupted):
        load_state_dict(model, state, strict=True)
