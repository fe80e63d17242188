# Mask R-CNN + LV-ViT-S on a COCO-format set of your own (docs/instances_and_depth.md, "Your own COCO-format set"):
# data/own_coco/annotations/instances_{train,val}.json with the images in data/own_coco/{train,val}/ (or --data-root),
# any categories and ids; ViTDet's recipe sized to the data (its 100 epochs, at least 1,000 updates), the backbone's
# ImageNet weights (token labeling, 83.3%) fetched through timm's cache.
_base_ = ['./maskrcnn_lvvit_s.py']
data_root = 'data/own_coco'
own_data = dict(epochs=100, min_iters=1000)
model = dict(backbone=dict(pretrained='timm'))
train_dataloader = dict(dataset=dict(type='OwnCocoInstances', data_root=data_root,
                                     ann_file='annotations/instances_train.json',
                                     data_prefix=dict(img_path='train/')))
val_dataloader = dict(dataset=dict(type='OwnCocoInstances', data_root=data_root,
                                   ann_file='annotations/instances_val.json',
                                   data_prefix=dict(img_path='val/')))
test_dataloader = val_dataloader
