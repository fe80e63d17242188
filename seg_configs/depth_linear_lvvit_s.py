# DINOv2's linear depth ("lin. 1") of LV-ViT-S's frozen features on NYU-v2: its last block (15) with the class token,
# depth as 256 bins up to 10 m; 480x480 crops and the suite's NYU-v2 schedule (25 epochs).
_base_ = ['./_base_/models/depth_linear_token_vit.py', './_base_/datasets/nyu.py', './_base_/default_runtime.py',
          './_base_/schedules/schedule_nyu_25ep.py']
model = dict(backbone=dict(model_name='lvvit_s', pretrained='pretrained/lvvit_s-26M-224-83.3.pth.tar'))
