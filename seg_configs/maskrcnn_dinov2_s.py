# Mask R-CNN + DINOv2 ViT-S/14 with 4 register tokens (timm's vit_small_patch14_reg4_dinov2, LVD-142M weights from
# timm's hub the first time) on COCO with ViTDet's recipe (maskrcnn_lvvit_s.py's): the last block's stride-14 map,
# resampled to stride 16 by the backbone, feeds the simple feature pyramid.
_base_ = ['./_base_/models/maskrcnn_token_vit.py', './_base_/datasets/coco_instances.py',
          './_base_/default_runtime.py', './_base_/schedules/schedule_vitdet_100ep.py']
model = dict(backbone=dict(model_name='vit_small_patch14_reg4_dinov2.lvd142m', out_indices=(11,), drop_path_rate=0.1,
                           pretrained='timm'),
             neck=dict(in_channels=384))
