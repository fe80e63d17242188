"""The depth heads: `DepthFusionHead`, a DPT-style head over the neck's pyramid (Ranftl et al. 2021, "reassemble and
fuse"), and `LinearDepthHead`, DINOv2's linear depth of frozen features (a classification over depth bins).

DepthFusionHead projects each level to `channels`; from the coarsest, each is upsampled to the next finer level, added
to it and refined by a residual unit of two 3x3 convolutions; two more convolutions give the depth at stride 4, as
`max_depth` x sigmoid (VPD's output in mmseg). mmseg's `VPDDepthHead` serves both heads' loss (SiLog by default,
invalid pixels, 0, left out) and prediction; its own layers expect VPD's diffusion features.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmseg.models.decode_heads import VPDDepthHead
from mmseg.models.decode_heads.decode_head import BaseDecodeHead
from mmseg.registry import MODELS


class ResidualUnit(nn.Sequential):
    """x + conv(relu(conv(relu(x)))), DPT's refinement."""

    def __init__(self, channels: int) -> None:
        super().__init__(nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(channels, channels, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + super().forward(x)


class DepthHead(VPDDepthHead):
    """VPD's loss and prediction without its layers: depth up to `max_depth`; a subclass's last is `depth_layer`."""

    def __init__(self, in_channels: Sequence[int], channels: int, max_depth: float, align_corners: bool,
                 loss_decode: dict | Sequence[dict], init_cfg: dict | None) -> None:
        super(BaseDecodeHead, self).__init__(init_cfg=init_cfg)  # VPD's layers left out
        self.in_channels, self.channels = list(in_channels), channels
        self.max_depth, self.align_corners = max_depth, align_corners
        losses = [loss_decode] if isinstance(loss_decode, dict) else list(loss_decode)
        built = [MODELS.build(loss) for loss in losses]
        self.loss_decode = built[0] if isinstance(loss_decode, dict) else nn.ModuleList(built)

    def extra_repr(self) -> str:  # BaseDecodeHead's names attributes of a class head this one does not have
        return f'channels={self.channels}, max_depth={self.max_depth}, align_corners={self.align_corners}'


@MODELS.register_module()
class DepthFusionHead(DepthHead):
    """Depth from the pyramid's levels `in_channels` (finest first), fused top-down in `channels`."""

    def __init__(self, in_channels: Sequence[int], channels: int = 256, max_depth: float = 10.0,
                 align_corners: bool = False, loss_decode: dict | Sequence[dict] = dict(type='SiLogLoss'),
                 init_cfg: dict | None = dict(type='TruncNormal', std=0.02, layer=['Conv2d'])) -> None:
        super().__init__(in_channels, channels, max_depth, align_corners, loss_decode, init_cfg)
        self.projections = nn.ModuleList(nn.Conv2d(c, channels, 1) for c in in_channels)
        self.refinements = nn.ModuleList(ResidualUnit(channels) for _ in in_channels)
        self.depth_layer = nn.Sequential(nn.Conv2d(channels, channels // 2, 3, padding=1), nn.ReLU(),
                                         nn.Conv2d(channels // 2, 1, 3, padding=1))

    def forward(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        levels = [project(x) for project, x in zip(self.projections, inputs)]
        fused = self.refinements[-1](levels[-1])
        for level, refine in zip(reversed(levels[:-1]), reversed(list(self.refinements)[:-1])):
            fused = refine(level + F.interpolate(fused, size=level.shape[-2:], mode='bilinear',
                                                 align_corners=self.align_corners))
        return torch.sigmoid(self.depth_layer(fused)) * self.max_depth


@MODELS.register_module()
class LinearDepthHead(DepthHead):
    """DINOv2's linear depth head (its hub's `BNHead`, `classify=True`): the maps of `in_channels`
    (`TokenBackbone(class_token=True)`) upsampled and concatenated, a 1x1 convolution to `n_bins` scores, "linear"
    normalisation (relu + 0.1, over their sum), the mean over bins from `min_depth` to `max_depth`."""

    def __init__(self, in_channels: Sequence[int], n_bins: int = 256, upsample: int = 4, min_depth: float = 1e-3,
                 max_depth: float = 10.0, align_corners: bool = False,
                 loss_decode: dict | Sequence[dict] = dict(type='SiLogLoss'), init_cfg: dict | None = None) -> None:
        super().__init__(in_channels, sum(in_channels), max_depth, align_corners, loss_decode, init_cfg)
        self.n_bins, self.upsample, self.min_depth = n_bins, upsample, min_depth
        self.depth_layer = nn.Conv2d(self.channels, n_bins, 1)

    def bins(self, device: torch.device) -> torch.Tensor:
        """The bins' depths: `n_bins` evenly spaced from `min_depth` to `max_depth` (DINOv2's 'UD')."""
        return torch.linspace(self.min_depth, self.max_depth, self.n_bins, device=device)

    def forward(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        size = [side * self.upsample for side in inputs[0].shape[-2:]]
        features = torch.cat([F.interpolate(x, size=size, mode='bilinear', align_corners=self.align_corners)
                              for x in inputs], 1)
        scores = torch.relu(self.depth_layer(features)) + 0.1
        weights = scores / scores.sum(1, keepdim=True)
        return torch.einsum('bkhw,k->bhw', weights, self.bins(weights.device))[:, None]
