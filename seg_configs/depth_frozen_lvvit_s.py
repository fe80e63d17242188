# DINOv2's "DPT" protocol on NYU-v2: depth_lvvit_s.py's DPT-style neck and fusion head on LV-ViT-S's frozen features
# (blocks 6, 9, 12, 15; no gradient through the backbone, kept in eval mode).
_base_ = ['./depth_lvvit_s.py']
model = dict(backbone=dict(frozen=True, drop_path_rate=0.0))
