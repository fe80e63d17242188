# DINOv2's linear segmentation ("lin.") of DINOv2 ViT-S/14's own frozen features (timm's
# vit_small_patch14_reg4_dinov2, LVD-142M weights from timm's hub) on ADE20K: its last block (11), linear_lvvit_s.py's
# head and schedule.
_base_ = ['./linear_lvvit_s.py']
model = dict(backbone=dict(model_name='vit_small_patch14_reg4_dinov2.lvd142m', out_indices=(11,), pretrained='timm',
                           model_kwargs=dict(init_values=1.0)))
