"""Semantic segmentation: a class per pixel, by mmseg's segmentors and the suite's (the task of every model type no
other task claims): batched tests (`segmentor`), the linear head of frozen features (`linear_head`), the IoU
report (`metric`), its pictures (`pictures`), the published sets' layouts (`layouts`: Cityscapes, COCO-Stuff-164k;
`pascal`: Pascal Context-59, Pascal VOC 2012), and the task with ADE20K's and own data's layouts (`task`,
registered by the package).

Importing it registers in mmseg's registries `SlideBatchEncoderDecoder`, `FlipBatchTTAModel`, `LinearHead`,
`IoUReport` and the published sets' data classes (`CityscapesIdsDataset`, ...)."""
from backbones.dense.semantic import layouts, linear_head, metric, pascal, segmentor  # noqa: F401  (registration)
