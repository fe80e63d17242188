# Depth on NYU-v2 from DINOv2 ViT-S/14 with 4 register tokens (timm's vit_small_patch14_reg4_dinov2, LVD-142M
# weights from timm's hub the first time): blocks 2, 5, 8, 11, their stride-14 maps resampled to stride 16 by the
# backbone; the pyramid neck and the DPT-style fusion head, 480x480 crops, 25 epochs (depth_lvvit_s.py's recipe).
_base_ = ['./_base_/models/depth_token_vit.py', './_base_/datasets/nyu.py', './_base_/default_runtime.py',
          './_base_/schedules/schedule_nyu_25ep.py']
# LayerScale starts at 1 (init_values): released weights bring their own gains; from scratch (the embedded pages'
# pretraining on the scans) DINOv2's 1e-5 leaves the blocks all but silent for the few hundred steps there.
model = dict(backbone=dict(model_name='vit_small_patch14_reg4_dinov2.lvd142m', out_indices=(2, 5, 8, 11),
                           drop_path_rate=0.1, pretrained='timm',
                           model_kwargs=dict(init_values=1.0)))
