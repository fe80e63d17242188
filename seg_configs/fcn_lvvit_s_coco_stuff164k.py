# FCN + LV-ViT-S on COCO-Stuff-164k (171 classes), 512x512 crops, the sliding-window test in 512x512 windows, 80k
# iterations (mmseg's zoo settings; fcn_lvvit_s.py's model).
_base_ = ['./_base_/models/fcn_token_vit.py', './_base_/datasets/coco_stuff164k.py', './_base_/default_runtime.py',
          './_base_/schedules/schedule_80k.py']
model = dict(
    backbone=dict(model_name='lvvit_s', out_indices=(12, 15), drop_path_rate=0.1,
                  pretrained='pretrained/lvvit_s-26M-224-83.3.pth.tar'),
    decode_head=dict(num_classes=171),
    auxiliary_head=dict(num_classes=171),
)
