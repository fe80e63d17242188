"""One training epoch and one evaluation pass; the trainer and `tools/eval_cls.py` share them."""
from __future__ import annotations

import contextlib
import math
import sys
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import torch
import torch.nn as nn
from tqdm import tqdm

from backbones import TokenLabelingOutput

from .augment import CropGeometry
from .distributed import DistInfo, all_reduce_sum
from .loss import TokenLabelingLoss, soft_cross_entropy
from .targets import TokenTargetBuilder, one_hot_targets


def autocast(device: torch.device, amp: str) -> contextlib.AbstractContextManager:
    if amp == 'none':
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if amp == 'bf16' else torch.float16)


def show_progress(info: DistInfo) -> bool:
    """Progress bars on the main process in a terminal; logs (non-tty) get the per-epoch lines only."""
    return info.is_main and sys.stderr.isatty()


BatchTransform = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Objective:
    """Turns a batch and the model's output into the loss: token labeling, or soft targets (mixup/cutmix).

    With `token_loss` the model has a token head; its per-token targets come from the annotator's score maps
    when `token_builder` is set, otherwise every token gets the image label (CIFAR transfer of an LV-ViT).
    """

    num_classes: int
    smoothing: float
    token_builder: Optional[TokenTargetBuilder] = None
    token_loss: Optional[TokenLabelingLoss] = None  # token labeling when set
    cls_target: str = 'map'
    mixup: Optional[Callable] = None  # timm Mixup for the vanilla recipe

    def prepare(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Images and soft labels before the forward (vanilla: mixup/cutmix; token labeling: as they are)."""
        if self.token_loss is not None:
            return images, None
        if self.mixup is not None:
            return self.mixup(images, labels)
        return images, one_hot_targets(labels, self.num_classes, self.smoothing)

    def loss(self, output, batch: dict, soft_labels: Optional[torch.Tensor], device: torch.device) -> torch.Tensor:
        if self.token_loss is None:
            return soft_cross_entropy(output, soft_labels)
        if not isinstance(output, TokenLabelingOutput):
            raise TypeError('token labeling needs a model with a token head in training mode')
        grid = output.token_logits.shape[1:3]
        if self.token_builder is None:
            label_target = self.label_target(batch, device)
            return self.token_loss(output, label_target, label_target[:, None, None].expand(-1, *grid, -1))
        geometry = CropGeometry(*(t.to(device, non_blocking=True) for t in batch['geometry']))
        cls_target, token_target = self.token_builder(
            batch['scores'].to(device, non_blocking=True), batch['classes'].to(device, non_blocking=True),
            geometry, grid)
        if self.cls_target == 'label':
            cls_target = self.label_target(batch, device)
        return self.token_loss(output, cls_target, token_target)

    def label_target(self, batch: dict, device: torch.device) -> torch.Tensor:
        """The (smoothed) one-hot target of each image's label."""
        return one_hot_targets(batch['label'].to(device), self.num_classes, self.smoothing)


def model_input(batch: dict, info: DistInfo, transform: Optional[BatchTransform]) -> torch.Tensor:
    """The batch's images on the device, through `transform` when there is one (CIFAR: upsample and augment)."""
    images = batch['image'].to(info.device, non_blocking=True)
    return images if transform is None else transform(images)


@dataclass
class StepState:
    optimizer: torch.optim.Optimizer
    scheduler: object  # timm scheduler, stepped per update
    scaler: Optional[torch.amp.GradScaler]
    ema: Optional[nn.Module]
    num_updates: int = 0
    skipped: int = 0


def train_one_epoch(
        model: nn.Module,
        loader: Iterable[dict],
        objective: Objective,
        state: StepState,
        info: DistInfo,
        amp: str = 'none',
        clip_grad: Optional[float] = None,
        log: Optional[Callable[[int, float, float], None]] = None,
        desc: str = 'train',
        transform: Optional[BatchTransform] = None,
) -> float:
    """Train for one pass over `loader`; returns the mean loss over all processes."""
    model.train()
    total, steps = 0.0, 0
    bar = tqdm(loader, desc=desc, disable=not show_progress(info), dynamic_ncols=True, leave=False)
    for batch in bar:
        state.skipped += batch['skipped']
        if 'image' not in batch:
            continue
        images = model_input(batch, info, transform)
        labels = batch['label'].to(info.device, non_blocking=True)
        images, soft_labels = objective.prepare(images, labels)
        with autocast(info.device, amp):
            output = model(images)
        loss = objective.loss(output, batch, soft_labels, info.device)
        value = loss.item()  # the step's one host-device sync
        if not math.isfinite(value):
            raise FloatingPointError(f'loss is {value} at update {state.num_updates}; lower the learning rate '
                                     f'or use bf16 instead of fp16')
        state.optimizer.zero_grad(set_to_none=True)
        if state.scaler is not None:
            state.scaler.scale(loss).backward()
            state.scaler.unscale_(state.optimizer)
        else:
            loss.backward()
        if clip_grad:
            nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
        if state.scaler is not None:
            state.scaler.step(state.optimizer)
            state.scaler.update()
        else:
            state.optimizer.step()
        state.num_updates += 1
        if state.ema is not None:
            state.ema.update(model.module if hasattr(model, 'module') else model, step=state.num_updates)
        state.scheduler.step_update(state.num_updates)
        total, steps = total + value, steps + 1
        lr = state.optimizer.param_groups[0]['lr']
        bar.set_postfix(loss=f'{value:.4f}', lr=f'{lr:.2e}')
        if log is not None:
            log(state.num_updates, value, lr)
    total, steps = all_reduce_sum([total, steps], info)
    return total / max(steps, 1)


@torch.no_grad()
def evaluate(
        model: nn.Module,
        loader: Iterable[dict],
        info: DistInfo,
        amp: str = 'none',
        on_batch: Optional[Callable[[torch.Tensor, torch.Tensor], None]] = None,
        desc: str = 'eval',
        transform: Optional[BatchTransform] = None,
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
