# DINOv2's linear depth ("lin. 4") of LV-ViT-S's frozen features on KITTI: blocks 3, 7, 11 and 15, each with its class
# token; depth_linear_lvvit_s_kitti.py's head and schedule.
_base_ = ['./depth_linear_lvvit_s_kitti.py']
model = dict(backbone=dict(out_indices=(3, 7, 11, 15)), decode_head=dict(in_channels=[2 * 384] * 4))
