"""Dense prediction with the suite's backbones on mmsegmentation 1.x and mmengine: semantic segmentation
(`semantic`); instance segmentation and detection (`instances`: Mask R-CNN); depth (`depth`). Each task is a
`tasks.DenseTask` in its folder, found by the model a config builds; the modules here serve every task.

Importing this package (configs do, through `custom_imports`) registers in mmseg's registries: `TokenBackbone`
(any suite model; also under its former per-family names), `TokenPyramidNeck`, `SlideBatchEncoderDecoder`,
`LayerDecayOptimWrapperConstructor`, the `IoUReport` metric and the `ValidationPictures` hook; and lets mmengine
write its checkpoints atomically, read them under torch >= 2.6, and read the LV-ViT segmentation releases of the
reference's mmseg 0.x code (see `mmengine_io` and `released_segmentors`).
"""
from backbones.dense.mmcv_compat import ensure_mmseg_importable
from backbones.dense.silenced_warnings import silence_harmless_warnings

ensure_mmseg_importable()  # before anything imports mmseg.models
silence_harmless_warnings()

from backbones.dense import (  # noqa: E402,F401  (registration)
               backbone,
               depth,
               instances,
               layer_decay,
               mmengine_io,
               neck,
               pictures,
               preemption,
               semantic,
)

# the dense tasks last: their modules use the tools' modules above
from backbones.dense.depth import task as depth_task  # noqa: E402,F401  (registration)
from backbones.dense.instances import task as instances_task  # noqa: E402,F401  (registration)
from backbones.dense.semantic import task as semantic_task  # noqa: E402,F401  (registration)
