# DINOv2's linear segmentation ("lin.") of LV-ViT-S's frozen features on a data set of your own (docs/segmentation.md,
# "Your own data"): the classes and schedule sized to the data, the backbone's ImageNet weights (token labeling,
# 83.3%) fetched through timm's cache.
_base_ = ['./_base_/models/linear_token_vit.py', './_base_/datasets/own_data.py', './_base_/default_runtime.py',
          './_base_/schedules/schedule_linear_40k.py']
model = dict(backbone=dict(model_name='lvvit_s', pretrained='timm'))
# DINOv2's 40k iterations of 16 images over ADE20K's 20,210 = 32 epochs of your data (at least 1,000 updates)
own_data = dict(epochs=32, min_iters=1000)
