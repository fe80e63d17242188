# UperNet + T2T-ViT-14 on ADE20K with the LV-ViT recipe (last four of every third block, as LV-ViT-S).
_base_ = ['./_base_/models/upernet_token_vit.py', './_base_/datasets/ade20k.py', './_base_/default_runtime.py',
          './_base_/schedules/schedule_160k.py']
model = dict(backbone=dict(model_name='t2t_vit_14', out_indices=(4, 7, 10, 13),
                           drop_path_rate=0.1, pretrained='pretrained/81.5_T2T_ViT_14.pth.tar'))
