"""`TokenDepthEstimator`: mmseg's DepthEstimator whose `slide` test runs (mmseg 1.2.2 computes the sliding windows,
then overwrites them with a whole-image inference)."""
from __future__ import annotations

import torch
from mmseg.models.segmentors import DepthEstimator
from mmseg.registry import MODELS

from backbones.common.errors import UsageError

MODES = ('whole', 'slide', 'slide_flip')


@MODELS.register_module()
class TokenDepthEstimator(DepthEstimator):
    def inference(self, inputs: torch.Tensor, batch_img_metas: list[dict]) -> torch.Tensor:
        mode = self.test_cfg.get('mode', 'whole')
        if mode not in MODES:
            raise UsageError(f'model.test_cfg.mode is one of {", ".join(MODES)} for depth, not {mode!r}')
        if mode == 'slide':
            return self.slide_inference(inputs, batch_img_metas)
        if mode == 'slide_flip':
            return self.slide_flip_inference(inputs, batch_img_metas)
        return self.whole_inference(inputs, batch_img_metas)
