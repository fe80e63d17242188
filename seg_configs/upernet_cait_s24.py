# UperNet + CaiT-S24 on ADE20K with the LV-ViT recipe: patch tokens after self-attention blocks 14, 17, 20, 23
# (the class-attention stage is not used).
_base_ = ['./_base_/models/upernet_token_vit.py', './_base_/datasets/ade20k.py', './_base_/default_runtime.py',
          './_base_/schedules/schedule_160k.py']
model = dict(backbone=dict(model_name='cait_s24_224', out_indices=(14, 17, 20, 23),
                           drop_path_rate=0.1, pretrained='pretrained/S24_224.pth'))
