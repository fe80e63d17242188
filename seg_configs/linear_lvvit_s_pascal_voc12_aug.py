# linear_lvvit_s_pascal_voc12.py trained on VOC 2012 with SBD's images ("trainaug", 10,582), the training set of
# DINOv2's and mmseg's VOC figures.
_base_ = ['./_base_/models/linear_token_vit.py', './_base_/datasets/pascal_voc12_aug.py', './_base_/default_runtime.py',
          './_base_/schedules/schedule_linear_40k.py']
model = dict(backbone=dict(model_name='lvvit_s', pretrained='pretrained/lvvit_s-26M-224-83.3.pth.tar'),
             decode_head=dict(num_classes=21))
