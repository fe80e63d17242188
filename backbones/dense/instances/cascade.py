"""`TokenCascadeMaskRCNN`: Cascade Mask R-CNN (Cai and Vasconcelos 2018) as ViTDet runs it (detectron2's
`CascadeROIHeads`), on `TokenMaskRCNN`'s backbone, pyramid, RPN and data handling, from torchvision's detection parts.

Three box stages at IoU 0.5, 0.6 and 0.7 (box weights (10, 10, 5, 5), (20, 20, 10, 10), (30, 30, 15, 15)), each
refining the boxes of the one before with its own head, class-agnostic regression and sampler; each stage's head
gradient is scaled by 1 / the number of stages, as detectron2 does. The mask head trains on the last stage's
positives. At test the scores are the mean of the stages' class probabilities, the boxes the last stage's."""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmseg.registry import MODELS
from torchvision.models.detection.roi_heads import (
    RoIHeads,
    fastrcnn_loss,
    maskrcnn_inference,
    maskrcnn_loss,
)
from torchvision.ops import MultiScaleRoIAlign
from torchvision.ops import boxes as box_ops

from backbones.common.errors import UsageError
from backbones.dense.instances.detector import TokenMaskRCNN
from backbones.dense.instances.static_detection import StaticMaskRCNN, clipped, pooled

# ViTDet's (detectron2's) cascade: each stage's foreground IoU and box-regression weights
STAGE_IOUS = (0.5, 0.6, 0.7)
STAGE_BOX_WEIGHTS = ((10.0, 10.0, 5.0, 5.0), (20.0, 20.0, 10.0, 10.0), (30.0, 30.0, 15.0, 15.0))
PER_STAGE = ('fg_iou_thresh', 'bg_iou_thresh', 'bbox_reg_weights')  # RoIHeads settings a stage takes from its own


class AgnosticBoxPredictor(nn.Module):
    """A box head's features to class logits (background first) and one box's 4 deltas, whatever the class."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.cls_score = nn.Linear(in_channels, num_classes)
        self.bbox_pred = nn.Linear(in_channels, 4)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = features.flatten(1)
        return self.cls_score(features), self.bbox_pred(features)


def for_every_class(deltas: torch.Tensor, classes: int) -> torch.Tensor:
    """Class-agnostic deltas (N, 4) as torchvision's class-wise ones (N, classes x 4): one box for every class."""
    return deltas.repeat(1, classes)


def refined_proposals(stage: RoIHeads, deltas: torch.Tensor, proposals: list[torch.Tensor],
                      image_shapes: list[tuple[int, int]], drop_empty: bool) -> list[torch.Tensor]:
    """`stage`'s boxes decoded from its `deltas` as the next stage's proposals: per image, detached, clipped to the
    image, empty ones left out if `drop_empty` (in training: they would have no regression target)."""
    boxes = stage.box_coder.decode(deltas.detach(), proposals).reshape(-1, 4)
    refined = []
    for image_boxes, shape in zip(boxes.split([len(p) for p in proposals]), image_shapes):
        image_boxes = box_ops.clip_boxes_to_image(image_boxes, shape)
        if drop_empty:
            image_boxes = image_boxes[(image_boxes[:, 2] > image_boxes[:, 0]) & (image_boxes[:, 3] > image_boxes[:, 1])]
        refined.append(image_boxes)
    return refined


class CascadeRoIHeads(nn.Module):
    """The cascade's box stages (each a torchvision `RoIHeads` without masks) and one mask head on the last stage."""

    def __init__(self, stages: Sequence[RoIHeads], mask_roi_pool: MultiScaleRoIAlign, mask_head: nn.Module,
                 mask_predictor: nn.Module) -> None:
        super().__init__()
        self.stages = nn.ModuleList(stages)
        self.mask_roi_pool, self.mask_head, self.mask_predictor = mask_roi_pool, mask_head, mask_predictor

    @property
    def last(self) -> RoIHeads:
        """The last stage, whose test settings (score threshold, NMS, detections kept) are the cascade's."""
        return self.stages[-1]

    score_thresh = property(lambda self: self.last.score_thresh)
    nms_thresh = property(lambda self: self.last.nms_thresh)
    detections_per_img = property(lambda self: self.last.detections_per_img)

    def forward(self, features: dict[str, torch.Tensor], proposals: list[torch.Tensor],
                image_shapes: list[tuple[int, int]], targets: list[dict[str, torch.Tensor]] | None = None,
                ) -> tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor]]:
        if self.training:
            return [], self.losses(features, proposals, image_shapes, targets)
        return self.detections(features, proposals, image_shapes), {}

    def run_stage(self, stage: RoIHeads, features: dict[str, torch.Tensor], proposals: list[torch.Tensor],
                  image_shapes: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """A stage's class logits and class-agnostic deltas for `proposals`."""
        pooled = stage.box_roi_pool(features, proposals, image_shapes)
        if pooled.requires_grad:  # detectron2's 1 / stages on the gradient entering each stage's head
            pooled.register_hook(lambda grad: grad / len(self.stages))
        return stage.box_predictor(stage.box_head(pooled))

    def losses(self, features: dict[str, torch.Tensor], proposals: list[torch.Tensor],
               image_shapes: list[tuple[int, int]], targets: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Each stage's classification and box losses (`_stageN`), and the mask loss on the last stage's positives."""
        losses = {}
        for number, stage in enumerate(self.stages, start=1):
            proposals, matched, labels, regression_targets = stage.select_training_samples(proposals, targets)
            logits, deltas = self.run_stage(stage, features, proposals, image_shapes)
            classified, regressed = fastrcnn_loss(logits, for_every_class(deltas, logits.shape[1]), labels,
                                                  regression_targets)
            losses.update({f'loss_classifier_stage{number}': classified, f'loss_box_reg_stage{number}': regressed})
            if number < len(self.stages):
                proposals = refined_proposals(stage, deltas, proposals, image_shapes, drop_empty=True)
        positive = [torch.where(image_labels > 0)[0] for image_labels in labels]
        regions = [p[i] for p, i in zip(proposals, positive)]
        losses['loss_mask'] = maskrcnn_loss(self.mask_logits(features, regions, image_shapes), regions,
                                            [t['masks'] for t in targets], [t['labels'] for t in targets],
                                            [m[i] for m, i in zip(matched, positive)])
        return losses

    def detections(self, features: dict[str, torch.Tensor], proposals: list[torch.Tensor],
                   image_shapes: list[tuple[int, int]]) -> list[dict[str, torch.Tensor]]:
        """Every image's boxes, labels, scores and mask probabilities, through torchvision's post-processing."""
        probabilities = []
        for number, stage in enumerate(self.stages, start=1):
            logits, deltas = self.run_stage(stage, features, proposals, image_shapes)
            probabilities.append(logits.softmax(-1))
            if number < len(self.stages):
                proposals = refined_proposals(stage, deltas, proposals, image_shapes, drop_empty=False)
        mean = torch.stack(probabilities).mean(0)
        # torchvision's post-processing takes logits: the logarithms of probabilities give them back by softmax
        boxes, scores, labels = self.stages[-1].postprocess_detections(
            mean.log(), for_every_class(deltas, mean.shape[1]), proposals, image_shapes)
        masks = maskrcnn_inference(self.mask_logits(features, boxes, image_shapes), labels)
        return [dict(boxes=b, labels=la, scores=s, masks=m) for b, la, s, m in zip(boxes, labels, scores, masks)]

    def mask_logits(self, features: dict[str, torch.Tensor], boxes: list[torch.Tensor],
                    image_shapes: list[tuple[int, int]]) -> torch.Tensor:
        return self.mask_predictor(self.mask_head(self.mask_roi_pool(features, boxes, image_shapes)))


class StaticCascadeMaskRCNN(StaticMaskRCNN):
    """The cascade's inference with static shapes: `StaticMaskRCNN`'s, its box stage the cascade's."""

    def box_stage(self, features: dict[str, torch.Tensor], proposals: torch.Tensor, sizes: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        stages = self.detector.roi_heads.stages
        count, number = proposals.shape[:2]
        probabilities, boxes = [], proposals
        for stage in stages:
            if probabilities:  # the previous stage's boxes, as `refined_proposals` gives them
                boxes = clipped(boxes, sizes)
            logits, deltas = stage.box_predictor(stage.box_head(pooled(stage.box_roi_pool, features, boxes)))
            probabilities.append(F.softmax(logits, -1).reshape(count, number, -1))
            boxes = stage.box_coder.decode_single(deltas, boxes.reshape(-1, 4)).reshape(count, number, 4)
        return boxes[:, :, None], torch.stack(probabilities).mean(0)


@MODELS.register_module()
class TokenCascadeMaskRCNN(TokenMaskRCNN):
    """Cascade Mask R-CNN: `TokenMaskRCNN`'s arguments, one stage per entry of `stage_ious` (its foreground IoU) and
    `stage_box_weights` (its box coder's); `roi_heads` takes torchvision's `RoIHeads` settings but those two."""

    static_network = StaticCascadeMaskRCNN

    def __init__(self, *args, stage_ious: Sequence[float] = STAGE_IOUS,
                 stage_box_weights: Sequence[Sequence[float]] = STAGE_BOX_WEIGHTS, **kwargs) -> None:
        if not stage_ious or len(stage_ious) != len(stage_box_weights):
            raise UsageError(f'TokenCascadeMaskRCNN: one IoU and one box-weight quadruple per stage, got stage_ious '
                             f'{tuple(stage_ious)} and stage_box_weights {tuple(map(tuple, stage_box_weights))}')
        if any(len(weights) != 4 for weights in stage_box_weights):
            raise UsageError(f'TokenCascadeMaskRCNN: stage_box_weights are (x, y, w, h) quadruples, got '
                             f'{tuple(map(tuple, stage_box_weights))}')
        clashing = sorted(set(PER_STAGE) & set(kwargs.get('roi_heads') or {}))
        if clashing:
            raise UsageError(f'TokenCascadeMaskRCNN: roi_heads {", ".join(clashing)} is each stage\'s own: set '
                             'stage_ious and stage_box_weights instead')
        self.stage_settings = list(zip(stage_ious, stage_box_weights))
        super().__init__(*args, **kwargs)

    def build_roi_heads(self, head_convs: int, fc_channels: int, settings: dict) -> nn.Module:
        """One torchvision `RoIHeads` per stage, sharing the region pool (it holds no weights), and the mask head."""
        pool = self.region_pool(7)
        stages = [RoIHeads(box_roi_pool=pool, box_head=self.box_head(head_convs, fc_channels),
                           box_predictor=AgnosticBoxPredictor(fc_channels, self.num_classes + 1),
                           **{**settings, 'fg_iou_thresh': iou, 'bg_iou_thresh': iou, 'bbox_reg_weights': weights})
                  for iou, weights in self.stage_settings]
        return CascadeRoIHeads(stages, self.region_pool(14), **self.mask_heads(head_convs))
