"""`DetectionTTAModel`: a detector's test-time augmentation as mmdet's `DetTTAModel` does it: every scale of the
config's `tta_pipeline`, and its mirror image where `flip`, detected on its own and brought back to the original
image, then NMS per class at the RoI heads' threshold keeps at most `detections_per_img`, each with its pass's mask."""
from __future__ import annotations

import torch
from mmengine.structures import BaseDataElement, InstanceData
from mmseg.registry import MODELS
from torchvision.ops import batched_nms

from backbones.dense.tta import MirroredViewsTTAModel


def unflipped(sample: BaseDataElement) -> InstanceData:
    """A pass's detections on the original image: a mirror image's boxes and masks flipped back."""
    found = sample.pred_instances
    if not sample.metainfo.get('flip'):
        return found
    width = sample.metainfo['ori_shape'][1]
    boxes = found.bboxes
    return InstanceData(bboxes=torch.stack([width - boxes[:, 2], boxes[:, 1], width - boxes[:, 0], boxes[:, 3]], 1),
                        labels=found.labels, scores=found.scores, masks=found.masks.flip(-1))


@MODELS.register_module()
class DetectionTTAModel(MirroredViewsTTAModel):
    """The detections of every pass merged by class-wise NMS at the RoI heads' `nms_thresh`."""

    def merge_preds(self, data_samples_list: list[list[BaseDataElement]]) -> list[BaseDataElement]:
        merged = []
        for samples in data_samples_list:
            sample = samples[0]  # the first scale's unflipped pass: the image's meta data
            sample.pred_instances = self.merged([unflipped(view) for view in samples])
            merged.append(sample)
        return merged

    def merged(self, passes: list[InstanceData]) -> InstanceData:
        found = InstanceData.cat(passes)
        heads = self.module.roi_heads
        keep = batched_nms(found.bboxes, found.scores, found.labels, heads.nms_thresh)  # by score, highest first
        return found[keep[:heads.detections_per_img]]
