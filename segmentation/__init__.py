"""Semantic segmentation with the suite's backbones on mmsegmentation 1.x.

Importing this package (configs do, through `custom_imports`) registers in mmseg's registries: `TokenBackbone`
(any suite model), `TokenPyramidNeck`, `SlideBatchEncoderDecoder`, `LayerDecayOptimWrapperConstructor`, the
`IoUReport` metric and the embedded `DigitsSegDataset`; and lets mmengine load its own checkpoints under
torch >= 2.6 (see `checkpoint_io`).
"""
from backbones.mmcv_compat import ensure_mmseg_importable

ensure_mmseg_importable()  # before anything imports mmseg.models

from . import backbone, checkpoint_io, digits, layer_decay, metrics, neck, segmentor  # noqa: E402,F401  (registration)
