"""ViTDet's simple feature pyramid (Li et al. 2022): the multi-scale maps a plain backbone lacks, made from its last
map alone."""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule
from mmseg.registry import MODELS
from timm.layers import LayerNorm2d

from backbones.common.errors import UsageError

SCALES = (4.0, 2.0, 1.0, 0.5)  # ViTDet's: strides 4, 8, 16, 32 from a stride-16 map


def resampling(channels: int, scale: float) -> tuple[nn.Module, int]:
    """The layers that bring a map to `scale` times its resolution (ViTDet's), and the channels they leave."""
    if scale == 4:
        return nn.Sequential(nn.ConvTranspose2d(channels, channels // 2, 2, stride=2), LayerNorm2d(channels // 2),
                             nn.GELU(), nn.ConvTranspose2d(channels // 2, channels // 4, 2, stride=2)), channels // 4
    if scale == 2:
        return nn.ConvTranspose2d(channels, channels // 2, 2, stride=2), channels // 2
    if scale == 1:
        return nn.Identity(), channels
    if scale == 0.5:
        return nn.MaxPool2d(2), channels
    raise UsageError(f'SimpleFeaturePyramid scales are 4, 2, 1 or 0.5 (ViTDet\'s), not {scale}')


@MODELS.register_module()
class SimpleFeaturePyramid(BaseModule):
    """ViTDet's pyramid: one level per scale of the backbone's last map, and `p6`; levels named `p<log2 stride>`."""

    def __init__(self, in_channels: int, out_channels: int = 256, scales: Sequence[float] = SCALES,
                 in_stride: int = 16, init_cfg: dict | None = None) -> None:
        super().__init__(init_cfg)
        if in_channels % 4:
            raise UsageError(f'SimpleFeaturePyramid: in_channels {in_channels} must be a multiple of 4')
        self.out_channels = out_channels
        self.levels = nn.ModuleList()
        strides = []
        for scale in scales:
            resample, channels = resampling(in_channels, float(scale))
            self.levels.append(nn.Sequential(
                resample,
                nn.Conv2d(channels, out_channels, 1, bias=False), LayerNorm2d(out_channels),
                nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False), LayerNorm2d(out_channels)))
            strides.append(in_stride / scale)
        self.strides = strides  # of the RoI levels
        self.names = [f'p{round(math.log2(stride))}' for stride in strides]
        self.names.append(f'p{round(math.log2(strides[-1])) + 1}')

    @property
    def roi_levels(self) -> list[str]:
        """The levels the RoI heads pool from (all but the pooled extra one)."""
        return self.names[:-1]

    def forward(self, maps: Sequence[torch.Tensor]) -> OrderedDict[str, torch.Tensor]:
        last = maps[-1]
        outs = [level(last) for level in self.levels]
        outs.append(F.max_pool2d(outs[-1], kernel_size=1, stride=2))
        return OrderedDict(zip(self.names, outs))
