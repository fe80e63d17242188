"""Dense prediction with the suite's backbones on mmsegmentation 1.x and mmengine: semantic segmentation
(`semantic`), instance segmentation and detection (`instances`), depth (`depth`), each a `tasks.DenseTask` in its
folder; the modules here serve every task. Importing this package (configs do, through `custom_imports`) registers
the suite's backbone, neck, segmentor, optimizer constructor, metrics and hooks in mmseg's registries, and sets up
mmengine's checkpoint reading and writing (`mmengine_io`)."""
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
