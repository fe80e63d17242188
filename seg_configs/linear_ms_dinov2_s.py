# DINOv2's "+ms" linear segmentation of DINOv2 ViT-S/14's frozen features on ADE20K: blocks 8-11 concatenated,
# linear_ms_lvvit_s.py's head and multi-scale test.
_base_ = ['./linear_ms_lvvit_s.py']
model = dict(backbone=dict(model_name='vit_small_patch14_reg4_dinov2.lvd142m', out_indices=(8, 9, 10, 11),
                           pretrained='timm', model_kwargs=dict(init_values=1.0)))
