# Mask R-CNN + DINOv2 ViT-S/14 with 4 register tokens (timm's vit_small_patch14_reg4_dinov2, LVD-142M weights from
# timm's hub the first time) on COCO with ViTDet's recipe (maskrcnn_lvvit_s.py's): the last block's stride-14 map,
# resampled to stride 16 by the backbone, feeds the simple feature pyramid.
_base_ = ['./_base_/models/maskrcnn_token_vit.py', './_base_/datasets/coco_instances.py',
          './_base_/default_runtime.py', './_base_/schedules/schedule_vitdet_100ep.py']
# LayerScale starts at 1 (init_values): released weights bring their own gains; from scratch (the embedded pages'
# pretraining on the scans) DINOv2's 1e-5 leaves the blocks all but silent for the few hundred steps there.
model = dict(backbone=dict(model_name='vit_small_patch14_reg4_dinov2.lvd142m', out_indices=(11,), drop_path_rate=0.1,
                           pretrained='timm',
                           model_kwargs=dict(init_values=1.0)),
             neck=dict(in_channels=384))
