"""Instance segmentation and detection: Mask R-CNN and Cascade Mask R-CNN built from torchvision's detection parts
over ViTDet's simple feature pyramid on any suite backbone, COCO-format data, and COCO's box and mask AP
(pycocotools), on mmengine's runner as the segmentors are.

Importing it registers in mmseg's registries: `TokenMaskRCNN`, `TokenCascadeMaskRCNN`, `SimpleFeaturePyramid`, the
`CocoInstances` data set, the `LoadInstances`, `LargeScaleJitter`, `RandomInstanceFlip` and `PackInstanceInputs`
transforms, the `CocoAP` metric and `DetectionTTAModel`, the test-time augmentation.
"""
from backbones.dense.instances import (  # noqa: F401  (registration)
    cascade,
    coco,
    detector,
    metric,
    pyramid,
    transforms,
    tta,
)
