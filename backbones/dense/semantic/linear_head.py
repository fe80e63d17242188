"""DINOv2's linear segmentation head (its `BNHead`) for frozen features: the chosen blocks' maps resampled to the
first one's size and concatenated ("lin.": the last block; "+ms": the last four), a batch norm, then one 1x1
convolution to class logits. mmseg's segmentor upsamples the logits bilinearly to the image (in the loss and in
tests); docs/frozen_features.md compares it with DINOv2's."""
from __future__ import annotations

import torch
from mmcv.cnn import build_norm_layer
from mmseg.models.decode_heads.decode_head import BaseDecodeHead
from mmseg.registry import MODELS

from backbones.common.errors import UsageError


@MODELS.register_module()
class LinearHead(BaseDecodeHead):
    """A linear classifier of each stride-16 cell (`resize_concat` over `in_index`, a norm, a 1x1 `conv_seg`)."""

    def __init__(self, norm_cfg: dict | None = None, **kwargs) -> None:
        norm_cfg = norm_cfg or dict(type='BN', requires_grad=True)
        super().__init__(input_transform='resize_concat', norm_cfg=norm_cfg, **kwargs)
        if self.channels != self.in_channels:  # mmseg's conv_seg reads `channels`
            raise UsageError(f'LinearHead: channels must be the sum of in_channels, {self.in_channels}, got '
                             f'{self.channels} (a linear head has no layer between them)')
        self.bn = build_norm_layer(norm_cfg, self.in_channels)[1]

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        return self.cls_seg(self.bn(self._transform_inputs(inputs)))
