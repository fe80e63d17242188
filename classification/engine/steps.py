"""One training epoch and one evaluation pass, under mixed precision if asked; the trainers and the evaluation
tool share them."""
from __future__ import annotations

import contextlib
import itertools
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn as nn
from tqdm import tqdm

from backbones.common.distributed import DistInfo, HostCopy, all_reduce_sum
from backbones.common.errors import DivergedError
from classification.engine.prefetch import DEPTH, BatchTransform, Objective, Prefetcher


def autocast(device: torch.device, amp: str) -> contextlib.AbstractContextManager:
    if amp == 'none':
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if amp == 'bf16' else torch.float16)


def show_progress(info: DistInfo) -> bool:
    """Progress bars on the main process in a terminal; logs (non-tty) get the per-epoch lines only."""
    return info.is_main and sys.stderr.isatty()


def model_input(batch: dict, info: DistInfo, transform: BatchTransform | None) -> torch.Tensor:
    """The batch's images on the device, through `transform` when there is one (CIFAR: upsample and augment)."""
    images = batch['image'].to(info.device, non_blocking=True)
    return images if transform is None else transform(images)


@dataclass
class StepState:
    optimizer: torch.optim.Optimizer
    scheduler: object  # timm scheduler, stepped per update
    scaler: torch.amp.GradScaler | None
    ema: nn.Module | None
    num_updates: int = 0
    skipped: int = 0


class PendingLoss(NamedTuple):
    """A step's loss on its way to the host (`HostCopy`: reading it waits for that step only), and its update."""

    copy: HostCopy
    update: int

    @classmethod
    def of(cls, loss: torch.Tensor, update: int) -> 'PendingLoss':
        return cls(HostCopy.of(loss.detach()), update)

    def read(self) -> float:
        value = self.copy.read().item()
        if not math.isfinite(value):
            raise DivergedError(f'loss is {value} at update {self.update}; lower the learning rate or use '
                                f'bf16 instead of fp16')
        return value


@dataclass
class EpochProgress:
    """Where a training pass stands: batches done, this process's loss sum and count. Each loss is read one step late
    (`add`), so nothing between two updates waits for the device; `settle` reads the pending one."""

    batches: int = 0
    loss_sum: float = 0.0
    steps: int = 0
    pending: PendingLoss | None = field(default=None, repr=False, compare=False)
    latest: float | None = field(default=None, repr=False, compare=False)  # the last loss read

    def add(self, loss: torch.Tensor, update: int) -> float:
        """This step's loss queued and the previous one read; returns the latest loss read."""
        self.settle()
        self.pending = PendingLoss.of(loss, update)
        if self.latest is None:
            self.settle()
        return self.latest

    def settle(self) -> None:
        """The pending loss read into the sum (a loss that is not finite stops the run here)."""
        if self.pending is not None:
            self.latest, self.pending = self.pending.read(), None
            self.loss_sum, self.steps = self.loss_sum + self.latest, self.steps + 1


@dataclass
class Pace:
    """How fast a pass goes: images trained on by all processes, seconds waiting for the loader, time since it began."""

    started: float = field(default_factory=time.perf_counter)
    images: int = 0
    waiting: float = 0.0

    def images_per_second(self) -> float:
        return self.images / max(time.perf_counter() - self.started, 1e-9)

    def data_wait(self) -> float:
        """The share of the time spent waiting for batches (near 1: the input pipeline is the bound)."""
        return self.waiting / max(time.perf_counter() - self.started, 1e-9)

    def seconds_left(self, done: int, left: int) -> float:
        """The time the pass needs for `left` more batches at its pace over the `done` it has trained on."""
        return (time.perf_counter() - self.started) / max(done, 1) * left


class TrainingStep(NamedTuple):
    """What a training log line reports: update, latest loss, lr, batch and length (None: unknown), pace."""

    update: int
    loss: float
    lr: float
    batch: int
    batches: int | None
    images_per_second: float
    data_wait: float
    seconds_left: float | None


class PassResult(NamedTuple):
    loss: float  # the mean over all processes
    images_per_second: float  # of all processes together
    data_wait: float  # the share of the pass spent waiting for batches (this process's)


@dataclass(frozen=True)
class PassOptions:
    """How a training pass runs: autocast, clipping, accumulation, device transform, `overlap`, `seed`, its label."""

    amp: str = 'none'
    clip_grad: float | None = None
    accumulate: int = 1
    transform: BatchTransform | None = None
    overlap: bool = True
    seed: int = 0
    desc: str = 'train'


@dataclass(frozen=True)
class PassHooks:
    """What a training pass calls: `log` every update; `on_start` once the loader's iterator exists (it draws its
    workers' seed); `after_update(progress)` after every update (it raises to stop the run there)."""

    log: Callable[[TrainingStep], None] | None = None
    on_start: Callable[[], None] | None = None
    after_update: Callable[[EpochProgress], None] | None = None


def train_one_epoch(model: nn.Module, loader: Iterable[dict], objective: Objective, state: StepState, info: DistInfo,
                    options: PassOptions = PassOptions(), progress: EpochProgress | None = None,
                    hooks: PassHooks = PassHooks()) -> PassResult:
    """Train for one pass over `loader`, one update every `options.accumulate` batches (the leftover ones at the end
    untrained); the mean loss over all processes and the pass's pace. A resumed pass continues `progress`."""
    amp, clip_grad, accumulate = options.amp, options.clip_grad, options.accumulate
    log, on_start, after_update = hooks.log, hooks.on_start, hooks.after_update
    model.train()
    progress = progress or EpochProgress()
    # the batches of the whole pass that complete an update (an iterator without a length: all it yields)
    usable = (progress.batches + len(loader)) // accumulate * accumulate if hasattr(loader, '__len__') else None
    batches = iter(loader)
    if on_start is not None:
        on_start()
    if usable is not None:  # the batches after the last complete update are not even prepared
        batches = itertools.islice(batches, max(usable - progress.batches, 0))
    prefetch = Prefetcher(info, options.transform, objective, depth=DEPTH if options.overlap else 0)
    pending = 0  # batches whose gradients wait for the update
    pace, first_batch = Pace(), progress.batches
    ready = time.perf_counter()
    with contextlib.closing(prefetch(batches, options.seed, progress.batches)) as prepared:
        bar = tqdm(prepared, desc=options.desc, disable=not show_progress(info), dynamic_ncols=True, leave=False,
                   initial=progress.batches, total=usable)
        for batch in bar:
            pace.waiting += time.perf_counter() - ready
            state.skipped += batch['skipped']
            pace.images += len(batch.get('label', ())) * info.world_size
            progress.batches += 1
            updating = progress.batches % accumulate == 0
            if 'image' in batch:
                loss = train_step(model, batch, objective, state, info, amp, accumulate, updating)
                value, pending = progress.add(loss, state.num_updates), pending + 1
            if updating and pending:
                update(model, state, clip_grad)
                pending = 0
                lr = state.optimizer.param_groups[0]['lr']
                bar.set_postfix(loss=f'{value:.4f}', lr=f'{lr:.2e}', img_s=f'{pace.images_per_second():.0f}',
                                data=f'{pace.data_wait():.0%}')
                if log is not None:
                    left = None if usable is None else pace.seconds_left(progress.batches - first_batch,
                                                                         usable - progress.batches)
                    log(TrainingStep(state.num_updates, value, lr, progress.batches, usable, pace.images_per_second(),
                                     pace.data_wait(), left))
            if updating and after_update is not None:
                after_update(progress)
            ready = time.perf_counter()
    progress.settle()
    total, steps = all_reduce_sum([progress.loss_sum, progress.steps], info)
    return PassResult(total / max(steps, 1), pace.images_per_second(), pace.data_wait())


def train_step(model: nn.Module, batch: dict, objective: Objective, state: StepState, info: DistInfo, amp: str,
               accumulate: int, updating: bool) -> torch.Tensor:
    """Forward and backward of one prepared batch, its gradients added to those waiting; its loss, on the device."""
    images, labels = batch['image'], batch['label']
    # DDP reduces the gradients only in the backward pass that completes an update
    reduce = updating or not hasattr(model, 'no_sync')
    with contextlib.nullcontext() if reduce else model.no_sync():
        with autocast(info.device, amp):  # the objective's own forward passes (a teacher's) too
            images, targets = objective.prepare(images, labels)
            output = model(images)
        loss = objective.loss(output, batch, targets, info.device)
        scaled = loss / accumulate if accumulate > 1 else loss
        (state.scaler.scale(scaled) if state.scaler is not None else scaled).backward()
    return loss


def update(model: nn.Module, state: StepState, clip_grad: float | None) -> None:
    """One optimizer update: clip, step (through the fp16 scaler), clear, then the EMA and the schedule."""
    if state.scaler is not None:
        state.scaler.unscale_(state.optimizer)
    if clip_grad:
        nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
    if state.scaler is not None:
        state.scaler.step(state.optimizer)
        state.scaler.update()
    else:
        state.optimizer.step()
    state.optimizer.zero_grad(set_to_none=True)
    state.num_updates += 1
    if state.ema is not None:
        state.ema.update(model.module if hasattr(model, 'module') else model, step=state.num_updates)
    state.scheduler.step_update(state.num_updates)


@torch.no_grad()
def evaluate(
        model: nn.Module,
        loader: Iterable[dict],
        info: DistInfo,
        amp: str = 'none',
        on_batch: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
        desc: str = 'eval',
        transform: BatchTransform | None = None,
) -> dict:
    """Top-1 / top-5 accuracy (percent) over the shards of all processes; `on_batch(logits, indices)` sees each."""
    model.eval()
    correct1 = correct5 = count = skipped = 0
    for batch in tqdm(loader, desc=desc, disable=not show_progress(info), dynamic_ncols=True, leave=False):
        skipped += batch['skipped']
        if 'image' not in batch:
            continue
        with autocast(info.device, amp):
            logits = model(model_input(batch, info, transform)).float()
        labels = batch['label'].to(info.device)
        top = logits.topk(min(5, logits.shape[1]), dim=1).indices
        hits = top == labels[:, None]
        correct1 += hits[:, 0].sum().item()
        correct5 += hits.any(dim=1).sum().item()
        count += labels.numel()
        if on_batch is not None:
            on_batch(logits, batch['index'])
    correct1, correct5, count, skipped = all_reduce_sum([correct1, correct5, count, skipped], info)
    return {'top1': 100.0 * correct1 / max(count, 1), 'top5': 100.0 * correct5 / max(count, 1),
            'images': int(count), 'skipped': int(skipped)}
