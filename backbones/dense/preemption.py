"""Segmentation training that survives preemption, as classification's does (classification/engine/fit.py).

`PreemptionCheckpoints`: on SIGTERM or SIGUSR1 the current iteration finishes, a checkpoint is written and the
command exits with status 75; `--checkpoint-minutes M` writes one at most every M minutes. `ResumableIterLoop`
(`make_resumable` sets a config up for it) resumes to the same losses, validations, best checkpoint and weights as
a run never stopped. docs/segmentation.md ("Preemption") says what that takes."""
from __future__ import annotations

import bisect
import time
from pathlib import Path

import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import HOOKS, LOOPS
from mmengine.runner import IterBasedTrainLoop
from mmengine.runner.loops import _InfiniteDataloaderIterator

from backbones.common.distributed import DistInfo, all_reduce_sum
from backbones.common.errors import CheckpointReadError, Interrupted, UsageError
from backbones.common.files import remove_partial_writes, write_text_atomic
from backbones.common.lifecycle import StopRequests
from backbones.common.log import logger
from backbones.common.random_state import preserved_rng, set_torch_rng_state, torch_rng_state
from backbones.dense.restart import PlacedInfiniteSampler
from backbones.dense.runner import checkpoint_meta, iteration_checkpoints

RNG_KEY = 'torch_rng'  # the checkpoint entry holding torch's random states
VALIDATION_DUE_KEY = 'validation_due'  # the checkpoint entry saying its iteration's validation is still to run


def recorded_seed(work_dir: str | Path) -> int | None:
    """The seed of the run a work dir holds (its newest readable checkpoint's), or None."""
    for checkpoint in iteration_checkpoints(work_dir):
        try:
            seed = checkpoint_meta(str(checkpoint)).get('seed')
        except CheckpointReadError:
            continue
        return int(seed) if seed is not None else None
    return None


def run_seed(configured: int | None, work_dir: str | Path, resume: bool) -> int | None:
    """The seed a run takes: its config's; on resume the run's own; else None: mmengine draws one for all processes."""
    if configured is not None:
        return int(configured)
    if resume and (seed := recorded_seed(work_dir)) is not None:
        return seed
    return None


@LOOPS.register_module()
class ResumableIterLoop(IterBasedTrainLoop):
    """mmengine's iteration loop resuming exactly where its checkpoint was written (the module docstring says how)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.resumed_rng: dict | None = None  # torch's random state of the checkpoint resumed from
        self.resumed_before_validation = False  # that checkpoint precedes its iteration's validation

    def validates(self, iteration: int) -> bool:
        """Whether the loop validates after `iteration` (mmengine's rule, its dynamic intervals included)."""
        interval = self.dynamic_intervals[bisect.bisect(self.dynamic_milestones, iteration + 1) - 1]
        return (self.runner.val_loop is not None and iteration >= self.val_begin
                and (iteration % interval == 0 or iteration == self._max_iters))

    def validation_due(self, saved_iteration: int) -> bool:
        """Whether a checkpoint of `saved_iteration` written now precedes that iteration's validation: it is written by
        the iteration's own hooks (the loop counts an iteration once they have run) and the iteration validates."""
        return saved_iteration == self._iter + 1 and self.validates(saved_iteration)

    def resume_from(self, rng: dict | None, before_validation: bool) -> None:
        self.resumed_rng, self.resumed_before_validation = rng, before_validation

    def run(self):
        """mmengine's `IterBasedTrainLoop.run`, with `start_reading`, `catch_up` and `validate`."""
        self.runner.call_hook('before_train')
        self.runner.call_hook('before_train_epoch')  # the whole run is one epoch of the iteration-based loop
        self.start_reading()
        if self._iter > 0:
            self.catch_up()
        while self._iter < self._max_iters and not self.stop_training:
            self.runner.model.train()
            self.run_iter(next(self.dataloader_iterator))
            if self.validates(self._iter):
                self.validate()
        self.runner.call_hook('after_train_epoch')
        self.runner.call_hook('after_train')
        return self.runner.model

    def start_reading(self) -> None:
        """The loader brought to iteration `_iter`: a `PlacedInfiniteSampler` placed there, any other replayed."""
        sampler = self.dataloader.sampler
        if isinstance(sampler, PlacedInfiniteSampler):
            sampler.start_at(self._iter * self.dataloader.batch_size)
            self.dataloader_iterator = _InfiniteDataloaderIterator(self.dataloader)
            return
        if self._iter > 0:
            logger.info(f'replaying the loader through the {self._iter} iterations done ({type(sampler).__name__} '
                        'cannot start there)')
        for _ in range(self._iter):
            next(self.dataloader_iterator)

    def catch_up(self) -> None:
        """A resumed run, its loader placed, brought to where the stopped one wrote its checkpoint: torch's random state
        put back after the placing (which draws from it), the validation still due run."""
        if self.resumed_rng is not None:
            set_torch_rng_state(self.resumed_rng)
        if self.resumed_before_validation and self.validates(self._iter):  # (a schedule changed on resume may not)
            logger.info(f'the checkpoint precedes the validation of iteration {self._iter}: validating')
            self.validate()

    def validate(self) -> None:
        """The validation, training's random streams left as they were (its loader draws from torch's when its
        persistent workers start, which a resumed run reaches at another validation)."""
        with preserved_rng():
            self.runner.val_loop.run()


@HOOKS.register_module()
class PreemptionCheckpoints(Hook):
    """A checkpoint and exit 75 on SIGTERM/SIGUSR1, a checkpoint every `minutes`; torch's random state kept."""

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
        checkpoint[VALIDATION_DUE_KEY] = runner.train_loop.validation_due(checkpoint['meta']['iter'])

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if getattr(runner, '_resume', False):  # a resume, not load_from's weights
            runner.train_loop.resume_from(checkpoint.get(RNG_KEY), bool(checkpoint.get(VALIDATION_DUE_KEY)))

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
            self.stops.__exit__()  # the handlers before, also for a caller that goes on (after_train is not called)
            raise Interrupted(f'{self.stops.received or "a stop signal"} at iteration {done}: {path} holds the run; '
                              'the same command with --resume continues it')


def make_resumable(cfg: Config, checkpoint_minutes: float | None) -> None:
    """A config's training loop, sampler and hooks made to stop on request and resume exactly and at once."""
    train = cfg.train_cfg
    loop = train.get('type', 'IterBasedTrainLoop' if train.get('by_epoch') is False else 'EpochBasedTrainLoop')
    if loop not in ('IterBasedTrainLoop', ResumableIterLoop.__name__):
        raise UsageError(f'train_cfg: {loop}: train_seg runs iteration-based schedules (IterBasedTrainLoop), the '
                         'ones it can stop and resume exactly')
    train.pop('by_epoch', None)  # mmengine's way of choosing the loop without naming it
    train['type'] = ResumableIterLoop.__name__
    loader = cfg.train_dataloader
    if loader.get('sampler', {}).get('type') == 'InfiniteSampler' and 'batch_sampler' not in loader:
        loader.sampler.type = PlacedInfiniteSampler.__name__
    cfg.custom_hooks = [*cfg.get('custom_hooks', []), dict(type='PreemptionCheckpoints', minutes=checkpoint_minutes)]
