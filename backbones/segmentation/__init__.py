"""Dense prediction with the suite's backbones on mmsegmentation 1.x and mmengine: semantic segmentation; instance
segmentation and detection (`instances`: Mask R-CNN); depth (`depth`).

Importing this package (configs do, through `custom_imports`) registers in mmseg's registries: `TokenBackbone`
(any suite model; also under its former per-family names), `TokenPyramidNeck`, `SlideBatchEncoderDecoder`,
`LayerDecayOptimWrapperConstructor`, the `IoUReport` metric and the `ValidationPictures` hook; and lets mmengine
write its checkpoints atomically, read them under torch >= 2.6, and read the LV-ViT segmentation releases of the
reference's mmseg 0.x code (see `mmengine_io` and `release`).
"""
from backbones.segmentation.mmcv_compat import ensure_mmseg_importable
from backbones.segmentation.silenced_warnings import silence_harmless_warnings

ensure_mmseg_importable()  # before anything imports mmseg.models
silence_harmless_warnings()

from backbones.segmentation import (backbone, depth, instances, layer_decay, metrics, mmengine_io, neck,  # noqa: E402,F401  (registration)
               pictures, preemption, segmentor)
