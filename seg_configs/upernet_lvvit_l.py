# UperNet + LV-ViT-L on ADE20K, 512x512 crops, 160k iterations (LV-ViT paper, Table 8: 209M, 51.8 MS).
# Initialised from the 448-pixel ImageNet model; UperNet channels 512.
_base_ = ['./_base_/models/upernet_token_vit.py', './_base_/datasets/ade20k.py', './_base_/default_runtime.py',
          './_base_/schedules/schedule_160k.py']
model = dict(
    backbone=dict(model_name='lvvit_l', out_indices=(14, 17, 20, 23), drop_path_rate=0.3,
                  pretrained='pretrained/lvvit_l-150M-448-86.2.pth.tar'),
    neck=dict(in_channels=768, out_channels=(768, 768, 768, 2048)),
    decode_head=dict(in_channels=[768, 768, 768, 2048], channels=512),
    auxiliary_head=dict(in_channels=768, channels=512),
)
