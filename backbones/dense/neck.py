"""The neck that turns a token backbone's stride-16 maps into the multi-level pyramid UperNet (or FCN) reads."""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn as nn
from mmcv.cnn import ConvModule, build_activation_layer, build_norm_layer
from mmengine.model import BaseModule
from mmseg.registry import MODELS

from backbones.common.errors import UsageError


@MODELS.register_module()
class TokenPyramidNeck(BaseModule):
    """One level per input map: upsampled by `scales[i]` (transposed convs), a 1x1 conv to `out_channels[i]`."""

    def __init__(
            self,
            in_channels: int,
            out_channels: Sequence[int],
            scales: Sequence[int] = (4, 2, 1, 1),
            norm_cfg: dict = dict(type='SyncBN', requires_grad=True),
            act_cfg: dict = dict(type='ReLU'),
            init_cfg: dict | None = None,
    ) -> None:
        super().__init__(init_cfg)
        if len(out_channels) != len(scales):
            raise UsageError(f'one scale per output level: out_channels {tuple(out_channels)}, scales {tuple(scales)}')
        if any(int(s) != s or s < 1 for s in scales):
            raise UsageError(f'scales must be positive integers (upsampling factors), got {tuple(scales)}')
        self.levels = nn.ModuleList(
            nn.Sequential(*self._upsample(in_channels, int(scale), norm_cfg, act_cfg),
                          ConvModule(in_channels, channels, 1, bias=False, norm_cfg=norm_cfg, act_cfg=act_cfg))
            for channels, scale in zip(out_channels, scales))

    @staticmethod
    def _upsample(channels: int, scale: int, norm_cfg: dict, act_cfg: dict) -> list[nn.Module]:
        if scale == 1:
            return []
        return [nn.ConvTranspose2d(channels, channels, scale, stride=scale, bias=False),
                build_norm_layer(norm_cfg, channels)[1], build_activation_layer(act_cfg)]

    def forward(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        if len(inputs) != len(self.levels):
            raise UsageError(f'{type(self).__name__} has {len(self.levels)} levels but got {len(inputs)} maps; '
                             "the backbone's out_indices and the neck's scales must have the same length")
        return tuple(level(x) for level, x in zip(self.levels, inputs))
