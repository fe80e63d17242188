# DINOv2's linear segmentation ("lin.") of LV-ViT-S's frozen features on COCO-Stuff-164k (171 classes): 512x512 crops,
# the sliding-window test, DINOv2's 40k schedule.
_base_ = ['./_base_/models/linear_token_vit.py', './_base_/datasets/coco_stuff164k.py',
          './_base_/default_runtime.py', './_base_/schedules/schedule_linear_40k.py']
model = dict(backbone=dict(model_name='lvvit_s', pretrained='pretrained/lvvit_s-26M-224-83.3.pth.tar'),
             decode_head=dict(num_classes=171))
