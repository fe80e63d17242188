"""A `TokenMaskRCNN`'s inference with static shapes, for torch.export and ONNX (`StaticMaskRCNN`): zero-padded images
(B, 3, H, W) of one size and `image_sizes` (B, 2) -> `boxes` (B, K, 4), `scores` (B, K), `labels` (B, K; from 0, -1
for padding) and `masks` (B, K, H, W) of the K = `top_k` best detections (default `detections_per_img`), padded.

It is the detector's own inference in pieces (`proposals`, `box_stage`, which a cascade replaces, `detections`,
`masks`), every number of boxes fixed, and equals the model's `predict` up to float rounding within its bounds
(`CANDIDATES`). docs/export.md ("Detectors whole") says how and why."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.rpn import concat_box_prediction_layers
from torchvision.ops import nms, roi_align
from torchvision.ops.poolers import MultiScaleRoIAlign

CANDIDATES = 2000  # the box stage's class candidates that enter NMS, per image
DROPPED = -1.0  # the score of a candidate flagged out: below every probability
BOX_MIN_SIZE = 1e-2  # what RoIHeads.postprocess_detections drops as empty


def clipped(boxes: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """Boxes (B, ..., 4) clipped to each image's (height, width) in `sizes` (B, 2)."""
    limits = sizes.flip(-1).repeat(1, 2).to(boxes.dtype).reshape(-1, *[1] * (boxes.dim() - 2), 4)
    return torch.minimum(boxes.clamp(min=0), limits)  # x1, y1, x2, y2 against width, height, width, height


def within(sizes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Which pixels of an input of `size` (H, W) each image of `sizes` (B, 2; height, width) covers: (B, H, W)."""
    rows = torch.arange(size[0], device=sizes.device)[None, :, None] < sizes[:, 0, None, None]
    columns = torch.arange(size[1], device=sizes.device)[None, None, :] < sizes[:, 1, None, None]
    return rows & columns


def large_enough(boxes: torch.Tensor, min_size: float) -> torch.Tensor:
    """Whether both sides of each box (..., 4) are `min_size` or more (torchvision's `remove_small_boxes`)."""
    return (boxes[..., 2] - boxes[..., 0] >= min_size) & (boxes[..., 3] - boxes[..., 1] >= min_size)


def nms_kept(boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor, valid: torch.Tensor,
             iou_threshold: float) -> torch.Tensor:
    """Which candidates (B, N) greedy NMS keeps per image and `groups` (a level, a class) among the `valid` ones: one
    `nms` over the batch, groups offset along x (`batched_nms`'s trick), images along y; the others score `DROPPED`."""
    count, number = scores.shape
    largest = torch.where(valid[..., None], boxes, torch.zeros_like(boxes)).amax(dim=(1, 2))  # (B,)
    x_offsets = groups.to(boxes) * (largest[:, None] + 1)
    image = torch.arange(count, device=boxes.device).to(boxes)[:, None]
    y_offsets = (image * (boxes.flatten().amax(0) + 1)).expand_as(x_offsets)
    moved = boxes + torch.stack([x_offsets, y_offsets, x_offsets, y_offsets], dim=-1)
    keep = nms(moved.reshape(-1, 4), torch.where(valid, scores, DROPPED).reshape(-1), iou_threshold)
    kept = torch.zeros(count * number, dtype=torch.bool, device=boxes.device).index_fill(0, keep, True)
    return kept.reshape(count, number) & valid


def best(scores: torch.Tensor, flags: torch.Tensor, count: int) -> torch.Tensor:
    """The indices (B, count) of the `count` best scores (B, N) among the flagged candidates, best first."""
    return torch.where(flags, scores, DROPPED).topk(min(count, scores.shape[1]), dim=1).indices


def taken(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values (B, N, ...) at index (B, M): (B, M, ...)."""
    return values[torch.arange(values.shape[0], device=values.device)[:, None], index]


def padded(values: torch.Tensor, count: int) -> torch.Tensor:
    """values (B, N, ...) with zeros (False) appended to `count` along N (when fewer candidates than K exist)."""
    missing = count - values.shape[1]
    if missing == 0:
        return values
    return torch.cat([values, values.new_zeros((values.shape[0], missing, *values.shape[2:]))], dim=1)


def pooled(pool: MultiScaleRoIAlign, features: dict[str, torch.Tensor], boxes: torch.Tensor) -> torch.Tensor:
    """The detector's multi-level RoIAlign of boxes (B, N, 4) -> (B * N, C, S, S), with static shapes."""
    count, number = boxes.shape[:2]
    flat = boxes.reshape(-1, 4)
    image = torch.arange(count, device=boxes.device).to(boxes).repeat_interleave(number)
    rois = torch.cat([image[:, None], flat], dim=1)
    levels = pool.map_levels([flat])
    result = None
    for level, (name, scale) in enumerate(zip(pool.featmap_names, pool.scales)):
        one = roi_align(features[name], rois, pool.output_size, spatial_scale=scale,
                        sampling_ratio=pool.sampling_ratio, aligned=pool.aligned)
        result = one if result is None else torch.where((levels == level)[:, None, None, None], one, result)
    return result


def interpolation_weights(starts: torch.Tensor, ends: torch.Tensor, source: int, length: int) -> torch.Tensor:
    """(N, length, source): the weight of each of a padded mask's `source` rows in each of an image's `length` rows,
    for masks resized bilinearly (align_corners False) to span the integer rows starts .. ends (N) inclusive, zero
    outside them: torch's `interpolate` on the resized size torchvision's `paste_mask_in_image` gives."""
    size = (ends - starts + 1).clamp(min=1).to(torch.float32)
    rows = torch.arange(length, device=starts.device)
    inside = (rows >= starts[:, None]) & (rows <= ends[:, None])
    where = ((source / size)[:, None] * ((rows - starts[:, None]).to(torch.float32) + 0.5) - 0.5).clamp(min=0)
    low = where.floor()
    fraction = where - low
    low = low.to(torch.int64).clamp(max=source - 1)
    high = (low + 1).clamp(max=source - 1)
    indices = torch.arange(source, device=starts.device)
    weights = ((indices == low[..., None]) * (1 - fraction)[..., None]
               + (indices == high[..., None]) * fraction[..., None])
    return weights * inside[..., None]


def pasted(masks: torch.Tensor, boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Masks (N, M, M) pasted into images of `size` at boxes (N, 4) as `paste_masks_in_image`, with static shapes."""
    padded = F.pad(masks, (1, 1, 1, 1))
    source = padded.shape[-1]
    scale = source / masks.shape[-1]
    half_w, half_h = (boxes[:, 2] - boxes[:, 0]) * 0.5 * scale, (boxes[:, 3] - boxes[:, 1]) * 0.5 * scale
    centre_x, centre_y = (boxes[:, 2] + boxes[:, 0]) * 0.5, (boxes[:, 3] + boxes[:, 1]) * 0.5
    # torchvision's integer box: truncated towards zero, as .to(torch.int64) does
    x0, x1 = (centre_x - half_w).to(torch.int64), (centre_x + half_w).to(torch.int64)
    y0, y1 = (centre_y - half_h).to(torch.int64), (centre_y + half_h).to(torch.int64)
    rows = interpolation_weights(y0, y1, source, size[0])  # (N, H, source)
    columns = interpolation_weights(x0, x1, source, size[1])  # (N, W, source)
    return rows @ padded @ columns.transpose(1, 2)


class StaticMaskRCNN(nn.Module):
    """A `TokenMaskRCNN`'s inference with static shapes (see the module's docstring)."""

    output_names = ('boxes', 'scores', 'labels', 'masks')

    def __init__(self, detector: nn.Module, top_k: int | None = None, candidates: int = CANDIDATES) -> None:
        super().__init__()
        self.detector = detector
        self.top_k = top_k or detector.roi_heads.detections_per_img
        self.candidates = max(candidates, self.top_k)

    input_names = ('images', 'image_sizes')

    def forward(self, images: torch.Tensor, image_sizes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """`image_sizes` (B, 2): each image's height and width in the input, at its top left (the rest padding), as
        the detector's `img_shape`: its proposals and boxes are clipped to it, its masks zero outside it."""
        features = self.detector.extract_feat(images)
        proposals, valid = self.proposals(images, features, image_sizes)
        boxes, scores = self.box_stage(features, proposals, image_sizes)
        boxes, scores, labels, kept = self.detections(boxes, scores, valid, image_sizes)
        masks = self.masks(features, boxes, labels, kept, tuple(images.shape[-2:]), image_sizes)
        return boxes, scores, torch.where(kept, labels - 1, -1), masks

    def proposals(self, images: torch.Tensor, features: dict[str, torch.Tensor], sizes: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """The RPN's proposals (B, P, 4), best first, and which are proposals (B, P), as torchvision's RPN chooses."""
        rpn = self.detector.rpn
        size = tuple(images.shape[-2:])  # the anchors span the padded input, as the detector's own
        levels = list(features.values())
        objectness, deltas = rpn.head(levels)
        # every image's anchors are the same: one image's, for a batch of any size
        (anchors,) = rpn.anchor_generator(ImageList(images[:1], [size]), [level[:1] for level in levels])
        per_level = [o[0].numel() for o in objectness]
        objectness, deltas = concat_box_prediction_layers(objectness, deltas)
        count = images.shape[0]
        boxes = rpn.box_coder.decode_single(deltas, anchors.repeat(count, 1)).reshape(count, -1, 4)
        objectness = objectness.reshape(count, -1)
        chosen, level_of = [], []
        start = 0
        for level, number in enumerate(per_level):
            top = objectness[:, start:start + number].topk(min(rpn.pre_nms_top_n(), number), dim=1).indices
            chosen.append(top + start)
            level_of.append(torch.full_like(top, level))
            start += number
        chosen, level_of = torch.cat(chosen, dim=1), torch.cat(level_of, dim=1)
        boxes = clipped(taken(boxes, chosen), sizes)
        scores = taken(objectness, chosen).sigmoid()
        valid = large_enough(boxes, rpn.min_size) & (scores >= rpn.score_thresh)
        kept = nms_kept(boxes, scores, level_of, valid, rpn.nms_thresh)
        order = best(scores, kept, rpn.post_nms_top_n())
        return taken(boxes, order), taken(kept, order)

    def box_stage(self, features: dict[str, torch.Tensor], proposals: torch.Tensor, sizes: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each proposal's box per class and class probabilities (background first): the box head and predictor."""
        heads = self.detector.roi_heads
        count, number = proposals.shape[:2]
        logits, regression = heads.box_predictor(heads.box_head(pooled(heads.box_roi_pool, features, proposals)))
        boxes = heads.box_coder.decode_single(regression, proposals.reshape(-1, 4))
        return boxes.reshape(count, number, -1, 4), F.softmax(logits, -1).reshape(count, number, -1)

    def detections(self, boxes: torch.Tensor, scores: torch.Tensor, valid: torch.Tensor, sizes: torch.Tensor
                   ) -> tuple[torch.Tensor, ...]:
        """The `top_k` best detections of the `valid` proposals, by the RoI heads' post-processing; zero-padded."""
        heads = self.detector.roi_heads
        count, number, classes = scores.shape
        boxes = clipped(boxes.expand(count, number, classes, 4), sizes)[:, :, 1:].reshape(count, -1, 4)
        labels = torch.arange(1, classes, device=scores.device).repeat(count, number, 1).reshape(count, -1)
        scores = scores[:, :, 1:].reshape(count, -1)
        flags = (valid[:, :, None].expand(count, number, classes - 1).reshape(count, -1)
                 & (scores > heads.score_thresh) & large_enough(boxes, BOX_MIN_SIZE))
        first = best(scores, flags, self.candidates)
        boxes, scores, labels, flags = (taken(values, first) for values in (boxes, scores, labels, flags))
        kept = nms_kept(boxes, scores, labels, flags, heads.nms_thresh)
        order = best(scores, kept, self.top_k)
        boxes, scores, labels, kept = (taken(values, order) for values in (boxes, scores, labels, kept))
        boxes, scores, labels, kept = (padded(values, self.top_k) for values in (boxes, scores, labels, kept))
        return boxes * kept[..., None], scores * kept, labels, kept

    def masks(self, features: dict[str, torch.Tensor], boxes: torch.Tensor, labels: torch.Tensor,
              kept: torch.Tensor, size: tuple[int, int], sizes: torch.Tensor) -> torch.Tensor:
        """The detections' mask probabilities (B, K, H, W) pasted at their boxes, zero outside each image."""
        heads = self.detector.roi_heads
        count, number = boxes.shape[:2]
        logits = heads.mask_predictor(heads.mask_head(pooled(heads.mask_roi_pool, features, boxes)))
        chosen = logits.gather(1, labels.reshape(-1, 1, 1, 1).expand(-1, 1, *logits.shape[-2:]))[:, 0].sigmoid()
        masks = pasted(chosen, boxes.reshape(-1, 4), size).reshape(count, number, *size)
        return masks * (kept[..., None, None] & within(sizes, size)[:, None])
