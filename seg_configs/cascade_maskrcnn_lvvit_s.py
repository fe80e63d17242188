# Cascade Mask R-CNN + LV-ViT-S on COCO with ViTDet's recipe (maskrcnn_lvvit_s.py's: simple feature pyramid,
# large-scale jitter at 1024, AdamW, layer decay, drop path 0.1, 100 epochs), three box stages at IoU 0.5 / 0.6 / 0.7.
# docs/instances_and_depth.md quotes ViTDet's own numbers as the reference.
_base_ = ['./_base_/models/cascade_maskrcnn_token_vit.py', './_base_/datasets/coco_instances.py',
          './_base_/default_runtime.py', './_base_/schedules/schedule_vitdet_100ep.py']
model = dict(backbone=dict(model_name='lvvit_s', out_indices=(15,), drop_path_rate=0.1,
                           pretrained='pretrained/lvvit_s-26M-224-83.3.pth.tar'),
             neck=dict(in_channels=384))
