# Mask R-CNN + LV-ViT-S with ViTDet's backbone: 14x14-token window attention in every block but 4 evenly spaced global
# ones (3, 7, 11, 15 of LV-ViT-S's 16), decomposed relative positions in every block (tables zero at first).
# On the embedded pages (tools/train_seg.py without COCO on disk) the windows are 3 tokens a side, as the
# detection task's small-model settings give (SMALL_DATA_WINDOW in backbones/dense/instances/task.py): the
# pages' token grid is 10x4, which a 14-token window would cover whole.
_base_ = ['./maskrcnn_lvvit_s.py']
model = dict(backbone=dict(window_size=14, global_blocks=(3, 7, 11, 15), rel_pos=True))
