"""`TokenDepthEstimator`: mmseg's DepthEstimator whose `slide` test runs (mmseg 1.2.2 computes the sliding windows,
then overwrites them with a whole-image inference); `DepthTTAModel`, its test-time augmentation: the depth of every
scale and mirror image averaged on the original image, as the depth papers report NYU-v2 and KITTI (flip-averaged)."""
from __future__ import annotations

import torch
from mmengine.structures import PixelData
from mmseg.models.segmentors import DepthEstimator
from mmseg.registry import MODELS
from mmseg.structures import SegDataSample

from backbones.common.errors import UsageError
from backbones.dense.tta import MirroredViewsTTAModel

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


@MODELS.register_module()
class DepthTTAModel(MirroredViewsTTAModel):
    """The config's scales (mirrored where `flip`) of each image, back at its size: the depth maps averaged."""

    def merge_preds(self, data_samples_list: list[list[SegDataSample]]) -> list[SegDataSample]:
        merged = []
        for samples in data_samples_list:
            sample = samples[0]  # the first scale's unflipped view: the image's ground truth and meta data
            depth = torch.stack([view.pred_depth_map.data for view in samples]).mean(0)
            sample.pred_depth_map = PixelData(data=depth)
            merged.append(sample)
        return merged
