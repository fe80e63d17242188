# DINOv2's linear segmentation ("lin.") of LV-ViT-S's frozen features on Pascal VOC 2012 (21 classes with the
# background): 512x512 crops, the sliding-window test, DINOv2's 40k schedule.
_base_ = ['./_base_/models/linear_token_vit.py', './_base_/datasets/pascal_voc12.py', './_base_/default_runtime.py',
          './_base_/schedules/schedule_linear_40k.py']
model = dict(backbone=dict(model_name='lvvit_s', pretrained='pretrained/lvvit_s-26M-224-83.3.pth.tar'),
             decode_head=dict(num_classes=21))
