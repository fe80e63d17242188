# UperNet + LV-ViT-M on ADE20K, 512x512 crops, 160k iterations (LV-ViT paper, Table 8: 77M, 50.6 MS).
_base_ = ['./_base_/models/upernet_token_vit.py', './_base_/datasets/ade20k.py', './_base_/default_runtime.py',
          './_base_/schedules/schedule_160k.py']
model = dict(
    backbone=dict(model_name='lvvit_m', out_indices=(10, 13, 16, 19), drop_path_rate=0.2,
                  pretrained='pretrained/lvvit_m-56M-224-84.0.pth.tar'),
    neck=dict(in_channels=512, out_channels=(512, 512, 512, 2048)),
    decode_head=dict(in_channels=[512, 512, 512, 2048]),
    auxiliary_head=dict(in_channels=512),
)
