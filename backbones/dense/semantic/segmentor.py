"""Batched tests: `SlideBatchEncoderDecoder`, mmseg's EncoderDecoder whose sliding-window test runs the windows in
batches (`test_cfg.window_batch` of them at once; 1 is mmseg's behaviour), and `FlipBatchTTAModel`, the multi-scale
test that decodes each scale and its mirror image as one batch (`tta.MirroredViewsTTAModel`). Both give mmseg's
results (the model in eval mode mixes no samples); docs/segmentation.md gives the speed."""
from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from mmseg.models.segmentors import EncoderDecoder, SegTTAModel
from mmseg.registry import MODELS

from backbones.common.errors import UsageError
from backbones.dense.tta import MirroredViewsTTAModel

Window = tuple[int, int, int, int]  # y1, y2, x1, x2


def slide_windows(size: tuple[int, int], crop: tuple[int, int], stride: tuple[int, int]) -> list[Window]:
    """mmseg's window grid: `crop` windows every `stride`, the last of a row or column ending at the border."""
    def starts(length: int, crop_len: int, step: int) -> list[tuple[int, int]]:
        count = max(length - crop_len + step - 1, 0) // step + 1
        spans = []
        for i in range(count):
            end = min(i * step + crop_len, length)
            spans.append((max(end - crop_len, 0), end))
        return spans
    return [(y1, y2, x1, x2) for y1, y2 in starts(size[0], crop[0], stride[0])
            for x1, x2 in starts(size[1], crop[1], stride[1])]


def chunks(items: list[Window], size: int) -> Iterator[list[Window]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


@MODELS.register_module()
class SlideBatchEncoderDecoder(EncoderDecoder):
    """EncoderDecoder whose `slide` test decodes up to `test_cfg.window_batch` windows (default 32) per forward."""

    def slide_inference(self, inputs: torch.Tensor, batch_img_metas: list[dict]) -> torch.Tensor:
        window_batch = int(self.test_cfg.get('window_batch', 32))
        if window_batch < 1:
            raise UsageError(f'model.test_cfg.window_batch must be at least 1, got {window_batch}')
        batch_size, _, height, width = inputs.shape
        windows = slide_windows((height, width), tuple(self.test_cfg.crop_size), tuple(self.test_cfg.stride))
        preds = inputs.new_zeros((batch_size, self.out_channels, height, width))
        counts = inputs.new_zeros((batch_size, 1, height, width))
        y1, y2, x1, x2 = windows[0]
        # a torch.Size img_shape is what makes mmseg's heads resize their logits to the window (not to pad_shape)
        crop_metas = [dict(meta, img_shape=torch.Size((y2 - y1, x2 - x1))) for meta in batch_img_metas]
        for group in chunks(windows, max(1, window_batch // batch_size)):
            crops = torch.cat([inputs[:, :, y1:y2, x1:x2] for y1, y2, x1, x2 in group])
            logits = self.encode_decode(crops, crop_metas * len(group)).split(batch_size)
            for (y1, y2, x1, x2), logit in zip(group, logits):
                preds += F.pad(logit, (x1, width - x2, y1, height - y2))
                counts[:, :, y1:y2, x1:x2] += 1
        return preds / counts


@MODELS.register_module()
class FlipBatchTTAModel(MirroredViewsTTAModel, SegTTAModel):
    """mmseg's SegTTAModel over one view per scale, each with its mirror in one batch where `flip`; softmax averaged."""
