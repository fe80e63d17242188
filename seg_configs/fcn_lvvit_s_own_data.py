# FCN + LV-ViT-S on a data set of your own (docs/segmentation.md, "Your own data"): any number of classes, the
# schedule sized to the data, the backbone's ImageNet weights (token labeling, 83.3%) fetched through timm's cache.
_base_ = ['./_base_/models/fcn_token_vit.py', './_base_/datasets/own_data.py', './_base_/default_runtime.py',
          './_base_/schedules/schedule_160k.py']
model = dict(backbone=dict(model_name='lvvit_s', out_indices=(12, 15), drop_path_rate=0.1, pretrained='timm'))
