# DINOv2's linear segmentation ("lin.") of LV-ViT-S's frozen features on ADE20K: the last block (15) through the final
# norm, a batch norm and a 1x1 convolution; 512x512 crops, the sliding-window test, DINOv2's 40k-iteration schedule.
_base_ = ['./_base_/models/linear_token_vit.py', './_base_/datasets/ade20k.py', './_base_/default_runtime.py',
          './_base_/schedules/schedule_linear_40k.py']
model = dict(backbone=dict(model_name='lvvit_s', pretrained='pretrained/lvvit_s-26M-224-83.3.pth.tar'))
