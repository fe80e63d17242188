# UperNet + DINOv2 ViT-S/14 with 4 register tokens (timm's vit_small_patch14_reg4_dinov2) on ADE20K with the LV-ViT
# recipe: blocks 2, 5, 8, 11; its stride-14 maps resampled to stride 16 by the backbone. The ImageNet-free DINOv2
# weights (LVD-142M) come from timm's hub the first time.
_base_ = ['./_base_/models/upernet_token_vit.py', './_base_/datasets/ade20k.py', './_base_/default_runtime.py',
          './_base_/schedules/schedule_160k.py']
# LayerScale starts at 1 (init_values): released weights bring their own gains; from scratch (the embedded pages'
# pretraining on the scans) DINOv2's 1e-5 leaves the blocks all but silent for the few hundred steps there.
model = dict(backbone=dict(model_name='vit_small_patch14_reg4_dinov2.lvd142m', out_indices=(2, 5, 8, 11),
                           drop_path_rate=0.1, pretrained='timm',
                           model_kwargs=dict(init_values=1.0)))
