# UperNet + LV-ViT-S on ADE20K, 512x512 crops, 160k iterations (LV-ViT paper, Table 8: 44M, 47.9 SS / 48.6 MS).
_base_ = ['./_base_/models/upernet_token_vit.py', './_base_/datasets/ade20k.py', './_base_/default_runtime.py',
          './_base_/schedules/schedule_160k.py']
model = dict(backbone=dict(model_name='lvvit_s', out_indices=(6, 9, 12, 15), drop_path_rate=0.1,
                           pretrained='pretrained/lvvit_s-26M-224-83.3.pth.tar'))
