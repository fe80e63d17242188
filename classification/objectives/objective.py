"""The loss of a classification batch (the engine's `Objective`), one type a mode, chosen once by the recipe: the image
label as a soft target mixed by MixUp/CutMix (`LabelObjective`, the vanilla recipe), DeiT's hard distillation
(`DistillationObjective`), ReLabel's label pooling (`LabelPoolingObjective`: the annotator's map pooled over the crop,
mixed by CutMix), and token labeling (`TokenLabelingObjective`: score-map, pooled-map or image-label targets per
token, from a store's maps or an online annotator's)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.data.mixup import cutmix_bbox_and_lam, mixup_target

from backbones import TokenLabelingOutput
from classification.data.augment import CropGeometry, identity_geometry
from classification.objectives.token_loss import TokenLabelingLoss, soft_cross_entropy
from classification.objectives.token_targets import TokenTargetBuilder

POOLING_GRID = (4, 4)  # label pooling: the crop's map averaged over (4 x 2)^2 RoIAlign samples


def cutmix(images: torch.Tensor, alpha: float) -> tuple[torch.Tensor, float]:
    """CutMix within the batch (timm's box and lambda rule): a box of each image replaced by the same box of image
    B-1-i; lambda, the share of each image that stayed its own, corrected for the clipped box."""
    lam = float(np.random.beta(alpha, alpha))
    (y1, y2, x1, x2), lam = cutmix_bbox_and_lam(images.shape, lam, correct_lam=True)
    images = images.clone()
    images[:, :, y1:y2, x1:x2] = images.flip(0)[:, :, y1:y2, x1:x2]
    return images, lam


def mix_within_batch(mixup: Callable, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor,
                                                                                         torch.Tensor]:
    """timm's MixUp/CutMix on a batch of any size: an odd batch gets a copy of its first image, dropped after."""
    if len(images) % 2 == 0:
        return mixup(images, labels)
    images, targets = mixup(torch.cat([images, images[:1]]), torch.cat([labels, labels[:1]]))
    return images[:-1], targets[:-1]


class AnnotatorMaps(NamedTuple):
    """An online annotator's dense map of the batch the model sees, as a store keeps one: top-k, best first."""
    scores: torch.Tensor  # (B, h, w, k) logits
    classes: torch.Tensor  # (B, h, w, k)


class DistillationTargets(NamedTuple):
    labels: torch.Tensor  # (B, C) soft image labels (mixed like the images)
    teacher: torch.Tensor  # (B,) the teacher's class of every image the student sees


@dataclass
class LabelObjective:
    """The image label as a (smoothed) soft target, mixed by timm's MixUp/CutMix where `mixup` is set."""

    num_classes: int
    smoothing: float
    mixup: Callable | None = None

    def prepare(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, object]:
        if self.mixup is not None:
            return mix_within_batch(self.mixup, images, labels)
        return images, self.label_target(labels)

    def loss(self, output, batch: dict, targets: object, device: torch.device) -> torch.Tensor:
        return soft_cross_entropy(output, targets)

    def targets_ahead(self, batch: dict, device: torch.device) -> dict:
        """`batch` with what the loss needs made before the forward (nothing for the image label)."""
        return batch

    def label_target(self, labels: torch.Tensor) -> torch.Tensor:
        return mixup_target(labels, self.num_classes, smoothing=self.smoothing)


@dataclass
class DistillationObjective(LabelObjective):
    """DeiT's hard distillation: half the label term, half cross-entropy with the `teacher`'s class."""

    teacher: nn.Module | None = None  # images -> the teacher's class (classification.models.Teacher)

    def prepare(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, DistillationTargets]:
        images, soft_labels = super().prepare(images, labels)
        return images, DistillationTargets(soft_labels, self.teacher(images))

    def loss(self, output, batch: dict, targets: DistillationTargets, device: torch.device) -> torch.Tensor:
        cls_logits, dist_logits = output
        return 0.5 * soft_cross_entropy(cls_logits, targets.labels) + 0.5 * F.cross_entropy(dist_logits.float(),
                                                                                            targets.teacher)


@dataclass
class MapTargetObjective(LabelObjective):
    """What the modes that learn from an annotator's maps share: targets cut from each batch's maps along its crops
    (`token_builder`), made before the forward where the grid is known (`targets_ahead`), else in the loss."""

    token_builder: TokenTargetBuilder | None = None

    def ahead_grid(self) -> tuple[int, int] | None:
        """The grid the next batches' targets are cut for before the forward (None: not known, or not ahead)."""
        return None

    def targets_ahead(self, batch: dict, device: torch.device) -> dict:
        """`batch` with its 'map_targets' where the grid is known before the forward."""
        grid = self.ahead_grid()
        if grid is None or self.token_builder is None:
            return batch
        return {**batch, 'map_targets': (grid, self.map_targets(batch, grid, device))}

    def batch_map_targets(self, batch: dict, grid: tuple[int, int], device: torch.device) -> tuple[torch.Tensor,
                                                                                                   torch.Tensor]:
        """The map targets on `grid` made ahead for `batch` (`targets_ahead`), else made now."""
        ahead = batch.get('map_targets')
        return ahead[1] if ahead is not None and ahead[0] == grid else self.map_targets(batch, grid, device)

    def map_targets(self, batch: dict, grid: tuple[int, int], device: torch.device) -> tuple[torch.Tensor,
                                                                                             torch.Tensor]:
        """(class target, token targets on `grid`) cut from the batch's maps; an image without a map: its label."""
        geometry = CropGeometry(*(t.to(device, non_blocking=True) for t in batch['geometry']))
        cls_target, token_target = self.token_builder(
            batch['scores'].to(device, non_blocking=True), batch['classes'].to(device, non_blocking=True),
            geometry, grid, batch['extent'].to(device, non_blocking=True))
        mapped = batch['has_map'].to(device, non_blocking=True)
        label_target = self.label_target(batch['label'].to(device, non_blocking=True))
        cls_target = torch.where(mapped[:, None], cls_target, label_target)
        token_target = torch.where(mapped[:, None, None, None], token_target, label_target[:, None, None])
        return cls_target, token_target


@dataclass
class LabelPoolingObjective(MapTargetObjective):
    """ReLabel's label pooling: the map pooled over the crop as the target, mixed by CutMix (`cutmix_alpha`)."""

    cutmix_alpha: float = 0.0

    def prepare(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The images, CutMix-ed, and the CutMix lambda (1 without CutMix)."""
        return cutmix(images, self.cutmix_alpha) if self.cutmix_alpha > 0 else (images, 1.0)

    def loss(self, output, batch: dict, targets: float, device: torch.device) -> torch.Tensor:
        pooled, _ = self.batch_map_targets(batch, POOLING_GRID, device)
        return soft_cross_entropy(output, targets * pooled + (1 - targets) * pooled.flip(0))

    def ahead_grid(self) -> tuple[int, int] | None:
        return POOLING_GRID


@dataclass
class TokenLabelingObjective(MapTargetObjective):
    """Token labeling: per-token targets from the maps (`token_builder`; 'pooled': pooled over the crop), else the
    image label; an online `annotator` gives the maps of the very images the model sees."""

    token_loss: TokenLabelingLoss | None = None
    cls_target: str = 'map'
    token_target: str = 'map'
    annotator: nn.Module | None = None  # online token labeling: a Teacher whose dense_map gives the token targets
    annotator_topk: int = 5  # the classes kept per position, as a store keeps them
    # the model's token grid, from its first output: the grid `targets_ahead` cuts the next batches' map targets for
    token_grid: tuple[int, int] | None = field(default=None, init=False)

    def prepare(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, AnnotatorMaps | None]:
        """The images as they are (MixToken mixes inside the model), and an online annotator's maps of them."""
        return images, self.annotator_maps(images) if self.annotator is not None else None

    def loss(self, output, batch: dict, targets: AnnotatorMaps | None, device: torch.device) -> torch.Tensor:
        if not isinstance(output, TokenLabelingOutput):
            raise TypeError('token labeling needs a model with a token head in training mode')
        grid = self.token_grid = tuple(output.token_logits.shape[1:3])
        if self.token_builder is None:
            label_target = self.label_target(batch['label'].to(device, non_blocking=True))
            return self.token_loss(output, label_target, label_target[:, None, None].expand(-1, *grid, -1))
        cls_target, token_target = self.online_targets(targets, grid) if isinstance(targets, AnnotatorMaps) \
            else self.batch_map_targets(batch, grid, device)
        if self.token_target == 'pooled':
            token_target = cls_target[:, None, None].expand(-1, *grid, -1)
        if self.cls_target == 'label':
            cls_target = self.label_target(batch['label'].to(device, non_blocking=True))
        return self.token_loss(output, cls_target, token_target)

    def ahead_grid(self) -> tuple[int, int] | None:
        return None if self.annotator is not None else self.token_grid

    def annotator_maps(self, images: torch.Tensor) -> AnnotatorMaps:
        return AnnotatorMaps(*self.annotator.dense_map(images, self.annotator_topk))

    def online_targets(self, maps: AnnotatorMaps, grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(class target, token targets on `grid`) from the annotator's map of the very images the model saw."""
        B = maps.scores.shape[0]
        geometry = CropGeometry(*(t.to(maps.scores.device).expand(B, *t.shape) for t in identity_geometry()))
        return self.token_builder(maps.scores, maps.classes, geometry, grid)


ClassificationObjective = LabelObjective | DistillationObjective | LabelPoolingObjective | TokenLabelingObjective
