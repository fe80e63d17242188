# DINOv2's linear segmentation ("lin.") of LV-ViT-S's frozen features on Pascal Context-59: 480x480 crops, the
# sliding-window test in 480x480 windows at a stride of 320 (mmseg's zoo settings), DINOv2's 40k schedule.
_base_ = ['./_base_/models/linear_token_vit.py', './_base_/datasets/pascal_context59.py',
          './_base_/default_runtime.py', './_base_/schedules/schedule_linear_40k.py']
crop_size = (480, 480)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(model_name='lvvit_s', img_size=480, pretrained='pretrained/lvvit_s-26M-224-83.3.pth.tar'),
    decode_head=dict(num_classes=59),
    test_cfg=dict(crop_size=crop_size, stride=(320, 320)),
)
