"""The instance pipelines' transforms: instances loaded as boxes and bitmap masks, ViTDet's large-scale jitter, a
horizontal flip, and the packing into the model's inputs.

They draw from NumPy's global random stream, as mmcv's transforms do, which mmengine seeds in every loader worker:
a resumed run replays them exactly (`preemption.py`).
"""
from __future__ import annotations

import cv2
import numpy as np
import torch
from mmcv.transforms import BaseTransform
from mmengine.structures import BaseDataElement, InstanceData
from mmseg.registry import TRANSFORMS
from pycocotools import mask as mask_utils

from backbones.common.errors import DataError, UsageError
from backbones.dense.instances.coco import mask_rle

META_KEYS = ('img_path', 'img_id', 'ori_shape', 'img_shape', 'scale_factor', 'flip')


def decode_mask(mask, height: int, width: int) -> np.ndarray:
    """A COCO mask (polygons, uncompressed or compressed RLE) as a (height, width) uint8 bitmap."""
    return mask_utils.decode(mask_rle(mask, height, width))


@TRANSFORMS.register_module()
class LoadInstances(BaseTransform):
    """`gt_bboxes` (N, 4: x1, y1, x2, y2), `gt_labels` and `gt_masks` (N, H, W uint8) of the image's instances, crowd
    regions (as torchvision's and detectron2's trainers) and boxes without width or height left out."""

    def transform(self, results: dict) -> dict:
        height, width = results['img'].shape[:2]
        if (height, width) != (results['height'], results['width']):
            raise DataError(f'{results["img_path"]}: {width}x{height} pixels, its annotation says '
                            f'{results["width"]}x{results["height"]}')
        # crowd regions and boxes of no extent (which torchvision's box coder cannot encode) left out
        kept = [i for i in results['instances'] if not i['ignore_flag']
                and i['bbox'][2] > i['bbox'][0] and i['bbox'][3] > i['bbox'][1]]
        results['gt_bboxes'] = np.array([i['bbox'] for i in kept], np.float32).reshape(-1, 4)
        results['gt_labels'] = np.array([i['bbox_label'] for i in kept], np.int64)
        masks = [decode_mask(i['mask'], height, width) for i in kept]
        results['gt_masks'] = np.stack(masks) if masks else np.zeros((0, height, width), np.uint8)
        return results


@TRANSFORMS.register_module()
class LargeScaleJitter(BaseTransform):
    """ViTDet's large-scale jitter: resized by a factor of `scale_range`, cropped to at most `size`, boxes cut."""

    def __init__(self, size: tuple[int, int] = (1024, 1024), scale_range: tuple[float, float] = (0.1, 2.0)) -> None:
        if not (0 < scale_range[0] <= scale_range[1]) or min(size) < 1:
            raise UsageError(f'LargeScaleJitter: size {size} and scale_range {scale_range} must be positive, '
                             'the range in order')
        self.size, self.scale_range = tuple(size), tuple(scale_range)

    def transform(self, results: dict) -> dict:
        image = results['img']
        height, width = image.shape[:2]
        factor = np.random.uniform(*self.scale_range) * min(self.size[0] / width, self.size[1] / height)
        new_w, new_h = max(1, round(width * factor)), max(1, round(height * factor))
        image = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
        masks = results['gt_masks']
        if len(masks):
            masks = np.stack([cv2.resize(m, (new_w, new_h), interpolation=cv2.INTER_NEAREST) for m in masks])
        else:
            masks = np.zeros((0, new_h, new_w), np.uint8)
        boxes = results['gt_bboxes'] * np.float32([new_w / width, new_h / height] * 2)
        crop_w, crop_h = min(new_w, self.size[0]), min(new_h, self.size[1])
        left, top = np.random.randint(new_w - crop_w + 1), np.random.randint(new_h - crop_h + 1)
        results['img'] = image[top:top + crop_h, left:left + crop_w]
        results['gt_masks'] = masks[:, top:top + crop_h, left:left + crop_w]
        boxes = (boxes - np.float32([left, top, left, top])).clip(0, np.float32([crop_w, crop_h] * 2))
        results['gt_bboxes'] = boxes
        keep = (boxes[:, 2] - boxes[:, 0] >= 1) & (boxes[:, 3] - boxes[:, 1] >= 1) \
            & results['gt_masks'].any(axis=(1, 2))
        for key in ('gt_bboxes', 'gt_labels', 'gt_masks'):
            results[key] = results[key][keep]
        results['img_shape'] = (crop_h, crop_w)
        results['scale_factor'] = (new_w / width, new_h / height)
        return results


@TRANSFORMS.register_module()
class RandomInstanceFlip(BaseTransform):
    """A horizontal mirror image with probability `prob`: image, boxes and masks."""

    def __init__(self, prob: float = 0.5) -> None:
        if not 0 <= prob <= 1:
            raise UsageError(f'RandomInstanceFlip: prob must lie in [0, 1], got {prob}')
        self.prob = prob

    def transform(self, results: dict) -> dict:
        results['flip'] = bool(np.random.rand() < self.prob)
        if results['flip']:
            width = results['img'].shape[1]
            results['img'] = results['img'][:, ::-1]
            results['gt_masks'] = results['gt_masks'][:, :, ::-1]
            boxes = results['gt_bboxes'].copy()
            boxes[:, 0], boxes[:, 2] = width - results['gt_bboxes'][:, 2], width - results['gt_bboxes'][:, 0]
            results['gt_bboxes'] = boxes
        return results


@TRANSFORMS.register_module()
class PackInstanceInputs(BaseTransform):
    """The image as a (3, H, W) uint8 tensor and a data sample with its meta and, when loaded, its instances."""

    def transform(self, results: dict) -> dict:
        image = np.ascontiguousarray(results['img'].transpose(2, 0, 1))
        meta = {key: results[key] for key in META_KEYS if key in results}
        meta['img_shape'] = tuple(results['img'].shape[:2])
        sample = BaseDataElement(metainfo=meta)
        if 'gt_bboxes' in results:
            sample.gt_instances = InstanceData(
                bboxes=torch.from_numpy(results['gt_bboxes']), labels=torch.from_numpy(results['gt_labels']),
                masks=torch.from_numpy(np.ascontiguousarray(results['gt_masks'])))
        return dict(inputs=torch.from_numpy(image), data_samples=sample)
