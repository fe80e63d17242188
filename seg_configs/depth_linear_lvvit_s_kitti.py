# DINOv2's linear depth ("lin. 1") of LV-ViT-S's frozen features on KITTI (Eigen split, Garg crop): bins up to 80 m,
# 352x704 crops, depth_lvvit_s_kitti.py's schedule.
_base_ = ['./_base_/models/depth_linear_token_vit.py', './_base_/datasets/kitti_eigen.py',
          './_base_/default_runtime.py', './_base_/schedules/schedule_nyu_25ep.py']
model = dict(backbone=dict(model_name='lvvit_s', pretrained='pretrained/lvvit_s-26M-224-83.3.pth.tar'),
             decode_head=dict(max_depth=80.0))
