"""`TokenMaskRCNN`: Mask R-CNN (boxes and masks) from torchvision's detection parts on a suite backbone and
ViTDet's simple feature pyramid, as an mmengine model (its `loss`, `predict` and `tensor` modes), so that the
segmentation runner trains and tests it with the same hooks, resume, layer-wise lr decay, DDP and AMP.

The heads follow ViTDet (docs/instances_and_depth.md); `rpn` and `roi_heads` take torchvision's
`RegionProposalNetwork` and `RoIHeads` arguments. Predictions go back to the original image (`ori_shape`)."""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn as nn
from mmengine.model import BaseModel
from mmengine.structures import BaseDataElement, InstanceData
from mmseg.registry import MODELS
from timm.layers import LayerNorm2d
from torchvision.models.detection.faster_rcnn import FastRCNNConvFCHead, FastRCNNPredictor
from torchvision.models.detection.image_list import ImageList
from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
from torchvision.models.detection.roi_heads import RoIHeads
from torchvision.models.detection.rpn import AnchorGenerator, RegionProposalNetwork, RPNHead
from torchvision.models.detection.transform import paste_masks_in_image
from torchvision.ops import MultiScaleRoIAlign, roi_align
from torchvision.ops.poolers import initLevelMapper

from backbones.common.errors import UsageError
from backbones.dense.instances.static_detection import StaticMaskRCNN

# ViTDet's (detectron2's) RPN and RoI-head settings, in torchvision's terms
RPN = dict(fg_iou_thresh=0.7, bg_iou_thresh=0.3, batch_size_per_image=256, positive_fraction=0.5,
           pre_nms_top_n=dict(training=2000, testing=1000), post_nms_top_n=dict(training=1000, testing=1000),
           nms_thresh=0.7)
ROI_HEADS = dict(fg_iou_thresh=0.5, bg_iou_thresh=0.5, batch_size_per_image=512, positive_fraction=0.25,
                 bbox_reg_weights=None, score_thresh=0.05, nms_thresh=0.5, detections_per_img=100)
MASK_THRESHOLD = 0.5  # a pasted mask's probability from which a pixel belongs to the instance


class RegionAlign(MultiScaleRoIAlign):
    """torchvision's multi-level RoIAlign, its levels' scales set from the pyramid's strides (inferred, they are a
    level off for some padded heights); `aligned` samples at pixel centres (detectron2's ROIAlignV2)."""

    def __init__(self, levels: Sequence[str], strides: Sequence[float], size: int, aligned: bool = False) -> None:
        super().__init__(list(levels), output_size=size, sampling_ratio=0)
        self.scales = [1 / stride for stride in strides]
        self.map_levels = initLevelMapper(round(math.log2(strides[0])), round(math.log2(strides[-1])))
        self.aligned = aligned

    def forward(self, x: dict[str, torch.Tensor], boxes: list[torch.Tensor],
                image_shapes: list[tuple[int, int]]) -> torch.Tensor:
        if not self.aligned:
            return super().forward(x, boxes, image_shapes)
        rois = torch.cat([torch.cat([box.new_full((len(box), 1), image), box], 1) for image, box in enumerate(boxes)])
        levels = self.map_levels(boxes)
        first = x[self.featmap_names[0]]
        result = first.new_zeros((len(rois), first.shape[1], *self.output_size))
        for level, (name, scale) in enumerate(zip(self.featmap_names, self.scales)):
            index = torch.where(levels == level)[0]
            result[index] = roi_align(x[name], rois[index], self.output_size, scale, self.sampling_ratio,
                                      aligned=True).to(result.dtype)
        return result


@MODELS.register_module()
class TokenMaskRCNN(BaseModel):
    """Mask R-CNN for `num_classes` categories (labels 0 .. num_classes - 1; torchvision's 0 is the background)."""

    static_network = StaticMaskRCNN  # its inference with static shapes, which its export holds

    def __init__(
            self,
            backbone: dict,
            neck: dict,
            num_classes: int,
            data_preprocessor: dict | None = None,
            anchor_sizes: Sequence[int] = (32, 64, 128, 256, 512),
            aspect_ratios: Sequence[float] = (0.5, 1.0, 2.0),
            head_convs: int = 4,
            fc_channels: int = 1024,
            rpn: dict | None = None,
            roi_heads: dict | None = None,
            aligned_roi: bool = False,
            init_cfg: dict | None = None,
    ) -> None:
        super().__init__(data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise UsageError(f'TokenMaskRCNN: num_classes must be a positive whole number, got {num_classes!r}')
        self.num_classes = num_classes
        self.aligned_roi = aligned_roi  # RoIAlign at pixel centres (`RegionAlign`)
        self.backbone = MODELS.build(backbone)
        self.neck = MODELS.build(neck)
        channels = self.neck.out_channels
        if len(anchor_sizes) != len(self.neck.names):
            raise UsageError(f'TokenMaskRCNN: one anchor size per pyramid level ({len(self.neck.names)}: '
                             f'{", ".join(self.neck.names)}), got {tuple(anchor_sizes)}')
        anchors = AnchorGenerator(tuple((size,) for size in anchor_sizes),
                                  (tuple(aspect_ratios),) * len(anchor_sizes))
        self.rpn = RegionProposalNetwork(
            anchors, RPNHead(channels, anchors.num_anchors_per_location()[0], conv_depth=2), **{**RPN, **(rpn or {})})
        self.roi_heads = self.build_roi_heads(head_convs, fc_channels, {**ROI_HEADS, **(roi_heads or {})})

    def build_roi_heads(self, head_convs: int, fc_channels: int, settings: dict) -> nn.Module:
        """torchvision's RoI heads: one box head and class-wise box regression, the mask head on its boxes."""
        return RoIHeads(box_roi_pool=self.region_pool(7), box_head=self.box_head(head_convs, fc_channels),
                        box_predictor=FastRCNNPredictor(fc_channels, self.num_classes + 1),
                        mask_roi_pool=self.region_pool(14), **self.mask_heads(head_convs), **settings)

    def region_pool(self, size: int) -> RegionAlign:
        return RegionAlign(self.neck.roi_levels, self.neck.strides, size, self.aligned_roi)

    def box_head(self, head_convs: int, fc_channels: int) -> nn.Module:
        """ViTDet's box head: `head_convs` 3x3 convolutions and one fully connected layer, LayerNorm in each."""
        channels = self.neck.out_channels
        return FastRCNNConvFCHead((channels, 7, 7), [channels] * head_convs, [fc_channels], norm_layer=LayerNorm2d)

    def mask_heads(self, head_convs: int) -> dict[str, nn.Module]:
        """ViTDet's mask head (`head_convs` convolutions with LayerNorm) and its per-class predictor."""
        channels = self.neck.out_channels
        return dict(mask_head=MaskRCNNHeads(channels, [channels] * head_convs, 1, norm_layer=LayerNorm2d),
                    mask_predictor=MaskRCNNPredictor(channels, channels, self.num_classes + 1))

    def extract_feat(self, inputs: torch.Tensor):
        return self.neck(self.backbone(inputs))

    def forward(self, inputs: torch.Tensor, data_samples: list[BaseDataElement] | None = None, mode: str = 'tensor'):
        features = self.extract_feat(inputs)
        if mode == 'tensor':
            return tuple(features.values())
        images = ImageList(inputs, [tuple(sample.metainfo['img_shape'][:2]) for sample in data_samples])
        if mode == 'loss':
            targets = [self.target(sample) for sample in data_samples]
            proposals, rpn_losses = self.rpn(images, features, targets)
            _, roi_losses = self.roi_heads(features, proposals, images.image_sizes, targets)
            return {**rpn_losses, **roi_losses}
        if mode == 'predict':
            proposals, _ = self.rpn(images, features)
            detections, _ = self.roi_heads(features, proposals, images.image_sizes)
            return [self.predicted(found, sample) for found, sample in zip(detections, data_samples)]
        raise UsageError(f'TokenMaskRCNN: mode is "loss", "predict" or "tensor", not {mode!r}')

    @staticmethod
    def target(sample: BaseDataElement) -> dict[str, torch.Tensor]:
        """An image's instances as torchvision's heads take them (labels from 1: 0 is the background)."""
        gt = sample.gt_instances
        return dict(boxes=gt.bboxes.float(), labels=gt.labels.long() + 1, masks=gt.masks)

    @staticmethod
    def predicted(found: dict[str, torch.Tensor], sample: BaseDataElement) -> BaseDataElement:
        """The detections of one image on its original pixels: boxes, labels (from 0), scores, boolean masks."""
        scale_w, scale_h = sample.metainfo.get('scale_factor', (1.0, 1.0))
        height, width = sample.metainfo['ori_shape'][:2]
        boxes = found['boxes'] / found['boxes'].new_tensor([scale_w, scale_h, scale_w, scale_h])
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, width)
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, height)
        masks = paste_masks_in_image(found['masks'], boxes, (height, width))[:, 0] >= MASK_THRESHOLD
        sample.pred_instances = InstanceData(bboxes=boxes, labels=found['labels'] - 1, scores=found['scores'],
                                             masks=masks)
        return sample
