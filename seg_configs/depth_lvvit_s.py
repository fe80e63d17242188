# Depth on NYU-v2 from LV-ViT-S (token labeling, 83.3% ImageNet top-1): the pyramid neck and a DPT-style fusion
# head, 480x480 crops, 25 epochs (docs/instances_and_depth.md).
_base_ = ['./_base_/models/depth_token_vit.py', './_base_/datasets/nyu.py', './_base_/default_runtime.py',
          './_base_/schedules/schedule_nyu_25ep.py']
model = dict(backbone=dict(model_name='lvvit_s', out_indices=(6, 9, 12, 15), drop_path_rate=0.1,
                           pretrained='pretrained/lvvit_s-26M-224-83.3.pth.tar'))
