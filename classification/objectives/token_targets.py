"""Per-token soft targets for a batch, cut from the annotator's top-k score maps along each crop's geometry.

RoIAlign generalised to the affine pre-image of each token, evaluated on the sparse top-k maps: every token averages
`r x r` bilinear samples of the map's class distributions, taken at the points its pixels came from. Samples outside
the crop (RandAugment's fill) or outside the part of the image the map covers (`extent`) carry no label; a token
with no sample inside gets the class-token target, the crop's average (RoIAlign of the crop box to 1x1). For
axis-aligned crops the result is identical to RoIAlign (a test checks it). The stored top-k logits become
probabilities over those k classes (renormalised). docs/imagenet.md tells where this departs from the reference."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from backbones.layers import Grid
from classification.data.augment import CropGeometry


def smooth(target: torch.Tensor, smoothing: float) -> torch.Tensor:
    return target * (1.0 - smoothing) + smoothing / target.shape[-1] if smoothing > 0 else target


def sample_points(geometry: CropGeometry, grid: Grid, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each token's sub-samples came from, as whole-image [-1, 1] points, and whether each is in the crop."""
    box, flip, warp = geometry
    B = box.shape[0]
    H, W = grid
    in_crop = F.affine_grid(warp.float(), [B, 1, H * samples, W * samples], align_corners=False)
    inside = (in_crop.abs() <= 1).all(dim=-1)
    x = torch.where(flip.view(B, 1, 1), -in_crop[..., 0], in_crop[..., 0])
    x1, y1, x2, y2 = box.float().unbind(dim=1)
    x = (x1 + x2 - 1).view(B, 1, 1) + x * (x2 - x1).view(B, 1, 1)
    y = (y1 + y2 - 1).view(B, 1, 1) + in_crop[..., 1] * (y2 - y1).view(B, 1, 1)
    return torch.stack([x, y], dim=-1), inside


def in_extent(points: torch.Tensor, inside: torch.Tensor, extent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole-image [-1, 1] points in the coordinates of maps covering `extent` (B, 4), and which they cover."""
    B = extent.shape[0]
    centre = ((extent[:, :2] + extent[:, 2:]) / 2).view(B, 1, 1, 2)
    half = ((extent[:, 2:] - extent[:, :2]) / 2).view(B, 1, 1, 2)
    points = (points - centre) / half
    return points, inside & (points.abs() <= 1).all(dim=-1)


def bilinear_corners(points: torch.Tensor, map_size: Grid) -> tuple[torch.Tensor, torch.Tensor]:
    """Cell indices and weights (.., 4) of the bilinear samples of an (h, w) map at [-1, 1] points (`grid_sample`'s)."""
    h, w = map_size
    ix = ((points[..., 0] + 1) * w - 1).div(2).clamp(0, w - 1)
    iy = ((points[..., 1] + 1) * h - 1).div(2).clamp(0, h - 1)
    x0, y0 = ix.floor(), iy.floor()
    fx, fy = ix - x0, iy - y0
    x0, y0 = x0.long(), y0.long()
    x1, y1 = (x0 + 1).clamp(max=w - 1), (y0 + 1).clamp(max=h - 1)
    cells = torch.stack([y0 * w + x0, y0 * w + x1, y1 * w + x0, y1 * w + x1], dim=-1)
    weights = torch.stack([(1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy], dim=-1)
    return cells, weights


class TokenTargetBuilder:
    """Builds (class-token target (B, C), patch targets (B, H, W, C)) from top-k maps and crop geometry."""

    def __init__(self, num_classes: int, smoothing: float = 0.1, samples: int = 2) -> None:
        self.num_classes = num_classes
        self.smoothing = smoothing
        self.samples = samples

    def __call__(
            self,
            scores: torch.Tensor,
            classes: torch.Tensor,
            geometry: CropGeometry,
            grid: Grid,
            extent: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`scores`/`classes`: (B, h, w, k) top-k logits and class indices of each image's score map; `extent`
        (B, 4): the box each map covers in whole-image [-1, 1] coordinates (x1, y1, x2, y2; default: all of it)."""
        B, h, w, k = scores.shape
        H, W = grid
        C, r = self.num_classes, self.samples
        probs = scores.float().softmax(dim=-1).reshape(B, h * w, k)
        points, inside = sample_points(geometry, grid, r)
        if extent is not None:
            points, inside = in_extent(points, inside, extent.float())
        cells, weights = bilinear_corners(points, (h, w))  # (B, H*r, W*r, 4)
        weights = weights * inside.unsqueeze(-1)

        # every (sample, corner, top-k entry) adds weight * probability to (its token, its class)
        token = (torch.arange(H * r, device=scores.device) // r).view(H * r, 1) * W \
            + (torch.arange(W * r, device=scores.device) // r).view(1, W * r)
        token = token.view(1, H * r, W * r, 1, 1).expand(B, -1, -1, 4, k)
        corner_probs = probs.gather(1, cells.view(B, -1, 1).expand(-1, -1, k)).view(B, H * r, W * r, 4, k)
        corner_classes = classes.reshape(B, h * w, k).long().gather(
            1, cells.view(B, -1, 1).expand(-1, -1, k)).view(B, H * r, W * r, 4, k)
        sums = torch.zeros(B, H * W * C, device=scores.device)
        sums.scatter_add_(1, (token * C + corner_classes).reshape(B, -1),
                          (weights.unsqueeze(-1) * corner_probs).reshape(B, -1))
        sums = sums.view(B, H * W, C)
        coverage = inside.view(B, H, r, W, r).sum(dim=(2, 4)).view(B, H * W, 1).float()

        cls_target = sums.sum(dim=1) / coverage.sum(dim=1).clamp_min(1)
        whole_map = torch.zeros(B, C, device=scores.device).scatter_add_(
            1, classes.reshape(B, -1).long(), probs.reshape(B, -1)) / (h * w)
        cls_target = torch.where(coverage.sum(dim=1) > 0, cls_target, whole_map)
        token_target = torch.where(coverage > 0, sums / coverage.clamp_min(1), cls_target.unsqueeze(1))
        return smooth(cls_target, self.smoothing), smooth(token_target, self.smoothing).view(B, H, W, C)
