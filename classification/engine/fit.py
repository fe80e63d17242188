"""The epoch loop shared by ImageNet training and CIFAR transfer (`Fit`): train, validate, keep the best, checkpoint,
resume.

Every epoch writes `last.pth` (everything a resume needs) and `best.pth` (weights only) when validation top-1
improved; `--resume` continues from `last.pth` to the same losses as an uninterrupted run. With an EMA, the EMA is
the run's model. SIGTERM or SIGUSR1 writes `last.pth` mid-epoch and exits with status 75. docs/imagenet.md tells
each in full (the EMA rule, preemption, crash consistency)."""
from __future__ import annotations

import datetime
import json
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from backbones import bare_model
from backbones.common.distributed import DistInfo, LaggingSum, barrier
from backbones.common.errors import AlreadyDone, CheckpointError, DataError, Interrupted, UsageError
from backbones.common.files import remove_partial_writes, save_atomic, write_text_atomic
from backbones.common.lifecycle import StopRequests, restarted_by_torchrun
from backbones.common.log import logger
from backbones.common.outputs import check_output_folder
from backbones.common.random_state import hash_seed, preserved_rng, rng_state, seed_all, set_rng_state
from backbones.weights import MODEL_WEIGHTS, TRAINED_WEIGHTS
from classification.engine.checkpoints import (
    ARCHITECTURE,
    BEST,
    LAST,
    LOG,
    METRICS,
    read_training_checkpoint,
    write_summary,
)
from classification.engine.prefetch import BatchTransform, Objective
from classification.engine.steps import (
    EpochProgress,
    PassHooks,
    PassOptions,
    StepState,
    TrainingStep,
    evaluate,
    train_one_epoch,
)
from classification.engine.trackers import Tracker


def resume_path(resume: str | None, output: Path) -> Path | None:
    """The checkpoint `--resume` names (OUTPUT/last.pth when given without a path); never overwrite a run silently.
    A run torchrun restarted continues from its own last.pth, as `--resume` would."""
    check_output_folder(output)
    if resume is None and restarted_by_torchrun() and (output / LAST).exists():
        logger.info(f'torchrun restarted the run: resuming from {output / LAST}')
        resume = 'auto'
    if resume == 'auto' and not (output / LAST).exists():
        logger.info(f'--resume: {output} holds no {LAST} yet; starting the run from the beginning')
        return None
    if resume:
        resume_from = output / LAST if resume == 'auto' else Path(resume)
        if (output / METRICS).exists() and resume_from.resolve() == (output / LAST).resolve():
            raise AlreadyDone(f'{output} holds a finished run ({METRICS} is written after its last epoch): a new run '
                              f'(more epochs, other settings) needs another --output')
        return resume_from
    if (output / LAST).exists():
        raise UsageError(f'{output} already holds a run ({LAST}): pass --resume to continue it, or another --output')
    return None


def gather_objects(value, info: DistInfo) -> list:
    if not info.distributed:
        return [value]
    values = [None] * info.world_size
    torch.distributed.all_gather_object(values, value)
    return values


Pictures = Callable[[], dict[str, np.ndarray]]  # tag -> (H, W, 3) uint8 image
def step_line(step: TrainingStep) -> str:
    """A training log line: `update 150 batch 150/1251 loss 6.1234 lr 1.00e-03 1234 img/s data 12% ETA 0:04:31`."""
    batch = f'{step.batch}/{step.batches}' if step.batches is not None else str(step.batch)
    eta = '' if step.seconds_left is None else f'  ETA {datetime.timedelta(seconds=round(step.seconds_left))}'
    return (f'update {step.update}  batch {batch}  loss {step.loss:.4f}  lr {step.lr:.2e}  '
            f'{step.images_per_second:.0f} img/s  data {step.data_wait:.0%}{eta}')


STEP_LINE = re.compile(r'\bupdate (\d+)  batch \d')  # what `step_line` writes first: the update count


def update_of_step_line(line: str) -> int | None:
    """The update count a `step_line` reports, or None for other lines."""
    found = STEP_LINE.search(line)
    return None if found is None else int(found[1])


class RunLog:
    """log.jsonl with summary.csv, TensorBoard scalars and the `trackers`, written by the main process only; and,
    after every validation, the run's `pictures` (drawn without touching the run's random streams)."""

    def __init__(self, output: Path, info: DistInfo, interval: int, pictures: Pictures | None = None,
                 trackers: Sequence[Tracker] = ()) -> None:
        self.output, self.enabled, self.interval, self.pictures = output, info.is_main, interval, pictures
        self.writer, self.trackers = None, []
        if self.enabled:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(str(output / 'tensorboard'))
            self.trackers = list(trackers)

    def step(self, step: TrainingStep) -> None:
        """Every `interval` updates: loss, lr and pace to TensorBoard, and a log line where no progress bar shows."""
        if self.writer is None or step.update % self.interval:
            return
        scalars = {f'train/{key}': value for key, value in (('loss', step.loss), ('lr', step.lr),
                                                            ('img_s', step.images_per_second),
                                                            ('data_wait', step.data_wait))}
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step.update)
        for tracker in self.trackers:
            tracker.log(scalars, step.update, 'update')
        if not sys.stderr.isatty():
            logger.info(step_line(step))

    def epoch(self, record: dict) -> None:
        if not self.enabled:
            return
        epoch = record['epoch']
        scalars = {f'epoch/{key}': value for key, value in record.items() if isinstance(value, float) and key != 'time'}
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, epoch)
        pictures = {}
        if self.pictures is not None:
            with preserved_rng():
                pictures = self.pictures()
            for tag, image in pictures.items():
                self.writer.add_image(tag, image, epoch, dataformats='HWC')
        self.writer.flush()
        for tracker in self.trackers:
            tracker.log(scalars, epoch, 'epoch')
            tracker.log_images(pictures, epoch)
        with open(self.output / LOG, 'a') as f:
            f.write(json.dumps(record) + '\n')
        write_summary(self.output)
        parts = [f'{k} {v:.4f}' if isinstance(v, float) else f'{k} {v}' for k, v in record.items()]
        logger.info('  '.join(parts))

    def close(self, finished: bool = True) -> None:
        if self.writer is not None:
            self.writer.close()
        for tracker in self.trackers:
            tracker.close(finished)
        self.writer, self.trackers = None, []


@dataclass
class Fit:
    """One training run: the model as built, its optimisation state, where it writes, its settings (`config`)."""

    model: nn.Module
    state: StepState
    objective: Objective
    info: DistInfo
    output: Path
    config: dict
    amp: str = 'none'
    clip_grad: float | None = None
    train_transform: BatchTransform | None = None
    eval_transform: BatchTransform | None = None
    accumulate: int = 1  # batches per optimizer update
    checkpoint_minutes: float | None = None  # a mid-epoch checkpoint at most this often
    overlap: bool = True  # batches prepared ahead of their step (engine.prefetch.Prefetcher)
    epochs_done: int = 0  # epochs are numbered from 1 everywhere: checkpoints, logs, seeds, the scheduler
    best: dict = field(default_factory=lambda: {'top1': -1.0, 'epoch': -1})
    record: dict = field(default_factory=dict)
    seed: int = 0
    resume_progress: EpochProgress | None = None  # the epoch a mid-epoch checkpoint stopped in
    resume_rng: dict | None = None  # its random streams, restored once the epoch's loader has started

    def start(self, resume: Path | None, seed: int) -> None:
        """Restore `resume` (weights, optimizer, scheduler, scaler, epoch, best, RNG), or seed a fresh run."""
        if self.info.is_main:
            remove_partial_writes(self.output)
        self.seed = seed
        if resume is None:
            seed_all(seed + self.info.rank)  # augmentation and MixToken differ between processes
            return
        ckpt = read_training_checkpoint(resume)
        for key in ('state_dict', 'optimizer', 'scheduler', 'epochs_done', 'num_updates', 'best', 'rng', 'args'):
            if key not in ckpt:
                raise CheckpointError(f'{resume} is not a training checkpoint of this suite (it has no {key!r}); '
                                      f'--resume takes the last.pth of a run, --finetune other weights')
        check_same_settings(resume, ckpt['args'], self.config)
        if self.info.is_main:
            repair_best(self.output, ckpt)
            repair_log(self.output, ckpt)
        bare_model(self.model).load_state_dict(ckpt.get(TRAINED_WEIGHTS, ckpt['state_dict']))
        if self.state.ema is not None and 'state_dict_ema' in ckpt:
            bare_model(self.state.ema.module).load_state_dict(ckpt['state_dict_ema'])
        self.state.optimizer.load_state_dict(ckpt['optimizer'])
        self.state.scheduler.load_state_dict(ckpt['scheduler'])
        if self.state.scaler is not None and 'scaler' in ckpt:
            self.state.scaler.load_state_dict(ckpt['scaler'])
        self.epochs_done, self.state.num_updates = ckpt['epochs_done'], ckpt['num_updates']
        self.best, self.record = ckpt['best'], ckpt['metrics']
        rng = ckpt['rng'][self.info.rank] if self.info.rank < len(ckpt['rng']) else ckpt['rng'][0]
        if 'batch' in ckpt:  # mid-epoch
            loss_sum, steps = ckpt['epoch_loss'][self.info.rank]
            self.resume_progress, self.resume_rng = EpochProgress(ckpt['batch'], loss_sum, steps), rng
            where = f', {ckpt["batch"]} batches into the next'
        else:
            set_rng_state(rng)
            where = ''
        logger.info(f'resumed {resume} after {self.epochs_done} epoch(s){where}')

    def run(self, train_loader, val_loader: Iterable[dict], num_epochs: int, runlog: RunLog) -> dict:
        """Train the epochs after `epochs_done` up to `num_epochs`; the last record."""
        info = self.info
        train_model = DistributedDataParallel(
            self.model, device_ids=[info.device.index] if info.device.type == 'cuda' else None) \
            if info.distributed else self.model
        agreement = LaggingSum(info, 2)
        with StopRequests() as stops:
            for epoch in range(self.epochs_done + 1, num_epochs + 1):
                self.run_epoch(train_model, epoch, num_epochs, train_loader, val_loader, runlog, stops, agreement)
        runlog.close()
        barrier(self.info)  # best.pth and last.pth are complete for every process
        return self.record

    def run_epoch(self, train_model: nn.Module, epoch: int, num_epochs: int, train_loader,
                  val_loader: Iterable[dict], runlog: RunLog, stops: StopRequests, agreement: LaggingSum) -> None:
        """One epoch (or its rest), its validation and checkpoints; a stop on a signal agreed on by all processes."""
        info, state = self.info, self.state
        started, updates = time.time(), state.num_updates
        progress, rng = self.resume_progress, self.resume_rng
        self.resume_progress = self.resume_rng = None
        train_loader.sampler.set_epoch(epoch)
        if progress is not None:
            train_loader.sampler.skip(progress.batches * train_loader.batch_size)
        if hasattr(train_loader.dataset, 'set_epoch'):
            train_loader.dataset.set_epoch(self.seed, epoch)
        last_save = time.time()

        def after_update(done: EpochProgress) -> None:
            nonlocal last_save
            due = self.checkpoint_minutes is not None and time.time() - last_save >= 60 * self.checkpoint_minutes
            stop = stops.received is not None
            if info.distributed:  # every process stops or saves at the same update (the one after it was asked)
                stop, due = (bool(v) for v in agreement.exchange([stop, due]))
            if stop or due:
                self.save(epoch - 1, False, done)
                last_save = time.time()
            if stop:
                runlog.close(finished=False)
                raise Interrupted(f'{stops.received or "a stop signal"} at epoch {epoch}, batch {done.batches}: '
                                  f'{self.output / LAST} holds the run; the same command with --resume continues it')

        options = PassOptions(self.amp, self.clip_grad, self.accumulate, self.train_transform, self.overlap,
                              hash_seed(self.seed, epoch, info.rank), f'epoch {epoch}/{num_epochs}')
        hooks = PassHooks(runlog.step, None if rng is None else lambda: set_rng_state(rng), after_update)
        trained = train_one_epoch(train_model, train_loader, self.objective, state, info, options, progress, hooks)
        if state.num_updates == updates and (progress is None or progress.steps == 0):
            raise DataError(f'epoch {epoch} trained on no image: all {state.skipped} images read were '
                            f'unreadable and skipped; check the data folder')
        state.scheduler.step(epoch)
        record = {'epoch': epoch, 'train_loss': trained.loss, 'lr': state.optimizer.param_groups[0]['lr'],
                  'img_s': trained.images_per_second, 'data_wait': trained.data_wait}
        record.update(evaluate(self.model, val_loader, info, self.amp, desc='val', transform=self.eval_transform))
        if record['images'] == 0:
            raise DataError(f'no validation image could be read ({record["skipped"]} skipped); check the data '
                            f'folder')
        if state.ema is not None:
            ema = evaluate(state.ema.module, val_loader, info, self.amp, desc='val ema',
                           transform=self.eval_transform)
            record.update(ema_top1=ema['top1'], ema_top5=ema['top5'])
        record['skipped_train'] = state.skipped
        record['time'] = round(time.time() - started, 1)
        chosen = record['ema_top1'] if state.ema is not None else record['top1']  # the run's model's
        is_best = chosen > self.best['top1']
        if is_best:
            self.best = {'top1': chosen, 'epoch': epoch}
        self.record = record
        self.save(epoch, is_best)
        runlog.epoch(record)

    def save(self, epochs_done: int, is_best: bool, progress: EpochProgress | None = None) -> None:
        """last.pth after `epochs_done` epochs (mid-epoch: with the next one's `progress`); best.pth if `is_best`."""
        rng = gather_objects(rng_state(), self.info)  # every process's (index = rank): a resumed DDP run continues each
        if progress is not None:
            progress.settle()
        epoch_loss = gather_objects((progress.loss_sum, progress.steps), self.info) if progress else None
        if not self.info.is_main:
            return
        state = self.state
        trained = bare_model(self.model).state_dict()
        if state.ema is not None:  # the EMA is the run's model (see the module docstring)
            ema = bare_model(state.ema.module).state_dict()
            weights = {'state_dict': ema, 'state_dict_ema': ema, TRAINED_WEIGHTS: trained, MODEL_WEIGHTS: 'ema'}
        else:
            weights = {'state_dict': trained, MODEL_WEIGHTS: 'trained'}
        ckpt = {**weights, ARCHITECTURE: getattr(self.model, 'architecture', None),
                'optimizer': state.optimizer.state_dict(), 'scheduler': state.scheduler.state_dict(),
                'epochs_done': epochs_done, 'num_updates': state.num_updates, 'best': self.best, 'rng': rng,
                'args': self.config, 'metrics': self.record}
        if state.scaler is not None:
            ckpt['scaler'] = state.scaler.state_dict()
        if progress is not None:
            ckpt.update(batch=progress.batches, epoch_loss=epoch_loss)
        save_atomic(ckpt, self.output / LAST)  # first: see the module docstring
        if is_best:
            save_atomic(best_checkpoint(ckpt), self.output / BEST)


def best_checkpoint(last: dict) -> dict:
    """What best.pth holds: the model of a last.pth, its epoch, metrics and settings."""
    return {k: v for k, v in last.items()
            if k in ('state_dict', 'state_dict_ema', MODEL_WEIGHTS, ARCHITECTURE, 'epochs_done', 'metrics', 'args')}


def check_same_settings(resume: Path, stored: dict, current: dict) -> None:
    """A resumed run must keep the settings it started with (a changed schedule would be printed, not followed)."""
    changed = [key for key in current if key in stored and stored[key] != current[key]]
    if changed:
        was = ', '.join(f'{key}={stored[key]!r}' for key in changed if key != 'classes')
        now = ', '.join(f'{key}={current[key]!r}' for key in changed if key != 'classes')
        if 'classes' in changed:
            was, now = f'{was} its class list'.strip(), f'{now} another class list'.strip()
        raise UsageError(f'--resume {resume}: the run was started with {was}; this command gives {now}. Resume '
                         f'with the run\'s settings, or start a new run in another --output')


def repair_log(output: Path, last: dict) -> None:
    """Make log.jsonl hold one line per epoch up to last.pth's, after a kill cut a line or came before it."""
    path, done = output / LOG, last['epochs_done']
    records = {}
    for line in (path.read_text().splitlines() if path.exists() else []):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short
        if isinstance(record, dict) and isinstance(record.get('epoch'), int) and record['epoch'] <= done:
            records[record['epoch']] = record
    if done >= 1:  # a mid-epoch checkpoint of the first epoch has no epoch record yet
        records[done] = last['metrics']
    write_text_atomic(path, ''.join(json.dumps(records[epoch]) + '\n' for epoch in sorted(records)))
    write_summary(output)


def repair_best(output: Path, last: dict) -> None:
    """Make best.pth hold the best epoch last.pth records, after a kill between the two writes."""
    best_epoch = last['best']['epoch']
    if best_epoch < 1:
        return
    path = output / BEST
    try:
        held = read_training_checkpoint(path, mmap=True)['epochs_done']
    except (CheckpointError, KeyError):  # absent, damaged, or not a best.pth
        held = None
    if held == best_epoch:
        return
    if last['epochs_done'] != best_epoch or 'batch' in last:  # mid-epoch: last.pth holds later weights
        raise CheckpointError(f'{path} does not hold epoch {best_epoch}, the best one {output / LAST} records, and '
                              f'its weights are nowhere else; restore {path} or start a new run')
    logger.info(f'rewriting {path} from {output / LAST}: it held ' +
                (f'epoch {held}' if held else 'no readable weights') + f', the best epoch is {best_epoch}')
    save_atomic(best_checkpoint(last), path)
