# DINOv2's "DPT" protocol on KITTI: depth_lvvit_s_kitti.py's DPT-style neck and fusion head on LV-ViT-S's frozen
# features (no gradient through the backbone, kept in eval mode).
_base_ = ['./depth_lvvit_s_kitti.py']
model = dict(backbone=dict(frozen=True, drop_path_rate=0.0))
