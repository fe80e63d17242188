# UperNet + DeiT-S on ADE20K with the LV-ViT recipe (blocks 2, 5, 8, 11).
_base_ = ['./_base_/models/upernet_token_vit.py', './_base_/datasets/ade20k.py', './_base_/default_runtime.py',
          './_base_/schedules/schedule_160k.py']
model = dict(backbone=dict(model_name='deit_small_patch16_224', out_indices=(2, 5, 8, 11),
                           drop_path_rate=0.1, pretrained='pretrained/deit_small_patch16_224-cd65a155.pth'))
