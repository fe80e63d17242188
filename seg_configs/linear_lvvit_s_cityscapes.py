# DINOv2's linear segmentation ("lin.") of LV-ViT-S's frozen features on Cityscapes (19 classes): 512x1024 crops, the
# sliding-window test in 512x1024 windows at a stride of 341x682 (mmseg's zoo settings), DINOv2's 40k schedule.
_base_ = ['./_base_/models/linear_token_vit.py', './_base_/datasets/cityscapes.py', './_base_/default_runtime.py',
          './_base_/schedules/schedule_linear_40k.py']
crop_size = (512, 1024)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(model_name='lvvit_s', pretrained='pretrained/lvvit_s-26M-224-83.3.pth.tar'),
    decode_head=dict(num_classes=19),
    test_cfg=dict(crop_size=crop_size, stride=(341, 682)),
)
