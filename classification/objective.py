"""The loss of a classification batch: token labeling (score-map or image-label targets per token), or the image
label as a soft target, mixed by MixUp/CutMix in the vanilla recipe, and with a teacher DeiT's hard distillation."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.data.mixup import mixup_target

from backbones import TokenLabelingOutput
from token_labeling.augment import CropGeometry
from token_labeling.loss import TokenLabelingLoss, soft_cross_entropy
from token_labeling.targets import TokenTargetBuilder


class DistillationTargets(NamedTuple):
    labels: torch.Tensor  # (B, C) soft image labels (mixed like the images)
    teacher: torch.Tensor  # (B,) the teacher's class of every image the student sees


@dataclass
class ClassificationObjective:
    """Turns a batch and the model's output into the loss (the engine's `Objective`).

    With `token_loss` the model has a token head; its per-token targets come from the annotator's score maps
    when `token_builder` is set, otherwise every token gets the image label (MixToken with the image label only,
    CIFAR transfer of an LV-ViT). With a `teacher` (DeiT's hard distillation) the model returns class and
    distillation logits: the loss is half the class term and half the cross-entropy of the distillation logits
    with the teacher's class of the same (mixed) image.
    """

    num_classes: int
    smoothing: float
    token_builder: Optional[TokenTargetBuilder] = None
    token_loss: Optional[TokenLabelingLoss] = None  # token labeling when set
    cls_target: str = 'map'
    mixup: Optional[Callable] = None  # timm's Mixup for the vanilla recipe
    teacher: Optional[nn.Module] = None  # images -> the teacher's class (classification.models.Teacher)

    def prepare(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, object]:
        """Images and their targets before the forward (vanilla: mixup/cutmix; token labeling: as they are)."""
        if self.token_loss is not None:
            return images, None
        images, soft_labels = self.mixup(images, labels) if self.mixup is not None else (images,
                                                                                         self.label_target(labels))
        if self.teacher is not None:
            return images, DistillationTargets(soft_labels, self.teacher(images))
        return images, soft_labels

    def loss(self, output, batch: dict, targets: object, device: torch.device) -> torch.Tensor:
        if self.teacher is not None:
            cls_logits, dist_logits = output
            return (0.5 * soft_cross_entropy(cls_logits, targets.labels)
                    + 0.5 * F.cross_entropy(dist_logits.float(), targets.teacher))
        if self.token_loss is None:
            return soft_cross_entropy(output, targets)
        if not isinstance(output, TokenLabelingOutput):
            raise TypeError('token labeling needs a model with a token head in training mode')
        grid = output.token_logits.shape[1:3]
        labels = batch['label'].to(device, non_blocking=True)
        if self.token_builder is None:
            label_target = self.label_target(labels)
            return self.token_loss(output, label_target, label_target[:, None, None].expand(-1, *grid, -1))
        geometry = CropGeometry(*(t.to(device, non_blocking=True) for t in batch['geometry']))
        cls_target, token_target = self.token_builder(
            batch['scores'].to(device, non_blocking=True), batch['classes'].to(device, non_blocking=True),
            geometry, grid, batch['extent'].to(device, non_blocking=True))
        if not batch['has_map'].all():  # images the store has no map for learn their image label
            mapped, label_target = batch['has_map'].to(device), self.label_target(labels)
            cls_target = torch.where(mapped[:, None], cls_target, label_target)
            token_target = torch.where(mapped[:, None, None, None], token_target, label_target[:, None, None])
        if self.cls_target == 'label':
            cls_target = self.label_target(labels)
        return self.token_loss(output, cls_target, token_target)

    def label_target(self, labels: torch.Tensor) -> torch.Tensor:
        """The (smoothed) one-hot target of each image's label."""
        return mixup_target(labels, self.num_classes, smoothing=self.smoothing)
