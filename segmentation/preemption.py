"""Segmentation training that survives preemption, as classification's does (engine/fit.py).

SIGTERM or SIGUSR1 (what cluster schedulers send before they kill a job) lets the current iteration finish; then a
checkpoint is written (atomically: segmentation/mmengine_io.py) and the command exits with status 75 saying how to
continue. `--checkpoint-minutes M` writes such a checkpoint at most every M minutes (each replacing the previous
timed one). Resuming continues to the same losses and weights as a run that was never stopped:

- the seed is the run's own (recorded in its checkpoints; a new run without one in its config draws one and keeps
  it), so the sampler's order and the loader workers' augmentation seeds are the stopped run's;
- mmengine replays the iterations done through the loader (it reads and drops their batches), which puts the
  sampler and every augmentation random stream where the stopped run left them;
- the one stream the replay does not advance, torch's (dropout, drop path, in the training step), is saved in every
  checkpoint and put back on resume: mmengine restores neither.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from common.distributed import DistInfo, all_reduce_sum
from common.errors import CheckpointReadError, Interrupted
from common.files import remove_partial_writes, write_text_atomic
from engine.fit import StopRequests

from .runner import checkpoint_meta, iteration_checkpoints

RNG_KEY = 'torch_rng'  # the checkpoint entry holding torch's random states


def torch_rng_state() -> dict:
    state = {'cpu': torch.get_rng_state()}
    if torch.cuda.is_available():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_torch_rng_state(state: dict) -> None:
    torch.set_rng_state(state['cpu'])
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])


def recorded_seed(work_dir: str | Path) -> int | None:
    """The seed of the run a work dir holds (its newest readable checkpoint's: resuming passes over damaged ones
    too), or None."""
    for checkpoint in iteration_checkpoints(work_dir):
        try:
            seed = checkpoint_meta(str(checkpoint)).get('seed')
        except CheckpointReadError:
            continue
        return int(seed) if seed is not None else None
    return None


def run_seed(configured: int | None, work_dir: str | Path, resume: bool) -> int:
    """The seed a run takes: its config's; on resume the run's own; else a new one, kept in its checkpoints."""
    if configured is not None:
        return int(configured)
    if resume and (seed := recorded_seed(work_dir)) is not None:
        return seed
    return int(np.random.SeedSequence().entropy % 2 ** 31)


@HOOKS.register_module()
class PreemptionCheckpoints(Hook):
    """A checkpoint and exit 75 on SIGTERM/SIGUSR1, a checkpoint every `minutes` (see the module docstring); and
    torch's random state in every checkpoint, put back on resume."""

    priority = 'VERY_LOW'  # after the other hooks' after_train_iter (the interval checkpoint, the log line)

    def __init__(self, minutes: float | None = None) -> None:
        self.minutes = minutes
        self.stops = StopRequests()
        self.last_save = time.time()
        self.timed: Path | None = None  # the previous timed checkpoint, replaced by the next
        self.info = DistInfo()  # the processes training together, known at before_train

    def before_train(self, runner) -> None:
        self.stops.__enter__()
        self.last_save = time.time()
        nccl = dist.is_available() and dist.is_initialized() and dist.get_backend() == 'nccl'
        self.info = DistInfo(rank=runner.rank, world_size=runner.world_size,
                             device=torch.device('cuda', torch.cuda.current_device()) if nccl else torch.device('cpu'))

    def after_train(self, runner) -> None:
        self.stops.__exit__()

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint[RNG_KEY] = torch_rng_state()

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if RNG_KEY in checkpoint and getattr(runner, '_resume', False):  # a resume, not load_from's weights
            set_torch_rng_state(checkpoint[RNG_KEY])

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        due = self.minutes is not None and time.time() - self.last_save >= 60 * self.minutes
        stop = self.stops.received is not None
        stop, due = (bool(v) for v in all_reduce_sum([stop, due], self.info))  # every process at the same iteration
        if not (stop or due):
            return
        done = runner.iter + 1
        path = Path(runner.work_dir) / f'iter_{done}.pth'
        if not path.is_file():  # the interval checkpoint of this iteration, when there is one, is the same state
            runner.save_checkpoint(runner.work_dir, path.name, by_epoch=False, save_optimizer=True,
                                   save_param_scheduler=True)
            if runner.rank == 0:
                if self.timed is not None and self.timed != path:
                    self.timed.unlink(missing_ok=True)
                self.timed = path
        if runner.rank == 0:
            write_text_atomic(Path(runner.work_dir) / 'last_checkpoint', str(path))
            remove_partial_writes(runner.work_dir)
        self.last_save = time.time()
        if stop:
            raise Interrupted(f'{self.stops.received or "a stop signal"} at iteration {done}: {path} holds the run; '
                              'the same command with --resume continues it')
