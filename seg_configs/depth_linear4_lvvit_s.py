# DINOv2's linear depth ("lin. 4") of LV-ViT-S's frozen features on NYU-v2: blocks 3, 7, 11 and 15 (DINOv2's evenly
# spaced four, ending at the last), each with its class token; depth_linear_lvvit_s.py's head and schedule.
_base_ = ['./depth_linear_lvvit_s.py']
model = dict(backbone=dict(out_indices=(3, 7, 11, 15)), decode_head=dict(in_channels=[2 * 384] * 4))
