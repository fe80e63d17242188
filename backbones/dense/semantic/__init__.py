"""Semantic segmentation: a class per pixel, by mmseg's segmentors and the suite's (the task of every model type no
other task claims): batched tests (`segmentor`), the IoU report (`metric`), its pictures (`pictures`), the
published sets' layouts (`layouts`: Cityscapes, Pascal Context-59, COCO-Stuff-164k), and the task with ADE20K's
and own data's layouts (`task`, registered by the package).

Importing it registers in mmseg's registries `SlideBatchEncoderDecoder`, `FlipBatchTTAModel`, `IoUReport` and the
published sets' data classes (`CityscapesIdsDataset`, ...)."""
from backbones.dense.semantic import layouts, metric, segmentor  # noqa: F401  (registration)
