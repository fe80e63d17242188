# Depth on KITTI (Eigen split, Garg crop, 80 m cap) from LV-ViT-S: depth_lvvit_s.py's model (the pyramid neck and
# the DPT-style fusion head) up to 80 m, 352x704 crops; the NYU-v2 schedule, whose 38,000 iterations of 16 are 26
# epochs of KITTI's 23,158 Eigen training frames (docs/instances_and_depth.md, "KITTI depth").
_base_ = ['./_base_/models/depth_token_vit.py', './_base_/datasets/kitti_eigen.py', './_base_/default_runtime.py',
          './_base_/schedules/schedule_nyu_25ep.py']
model = dict(backbone=dict(model_name='lvvit_s', out_indices=(6, 9, 12, 15), drop_path_rate=0.1,
                           pretrained='pretrained/lvvit_s-26M-224-83.3.pth.tar'),
             decode_head=dict(max_depth=80.0))
