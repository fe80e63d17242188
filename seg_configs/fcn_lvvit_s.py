# FCN + LV-ViT-S on ADE20K, 512x512 crops, 160k iterations (LV-ViT paper, Table 7: 30M, 47.2 SS / 48.4 MS).
_base_ = ['./_base_/models/fcn_token_vit.py', './_base_/datasets/ade20k.py', './_base_/default_runtime.py',
          './_base_/schedules/schedule_160k.py']
model = dict(backbone=dict(model_name='lvvit_s', out_indices=(12, 15), drop_path_rate=0.1,
                           pretrained='pretrained/lvvit_s-26M-224-83.3.pth.tar'))
