# COCO 2017 instances in COCO's layout, data/coco/{train2017,val2017}/ and data/coco/annotations/instances_*.json
# (any COCO-format set works: set data_root, ann_file and data_prefix, or --data-root for a folder of this layout).
# Training: ViTDet's large-scale jitter (the image fit to 1024x1024 times 0.1-2.0, a random crop of at most
# 1024x1024) and a horizontal flip; test: the longer side resized to 1024. Crowd regions are left out of training
# and counted by the AP as COCO does. 64 images per iteration: 8 per GPU on 8 GPUs.
dataset_type = 'CocoInstances'
data_root = 'data/coco'
image_size = (1024, 1024)
train_pipeline = [
    dict(type='LoadImageFromFile', color_type='color_ignore_orientation'),
    dict(type='LoadInstances'),
    dict(type='LargeScaleJitter', size=image_size, scale_range=(0.1, 2.0)),
    dict(type='RandomInstanceFlip', prob=0.5),
    dict(type='PackInstanceInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile', color_type='color_ignore_orientation'),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='PackInstanceInputs'),
]
# Test-time augmentation (--tta, --ms), as mmdet's: each scale and its mirror image detected (DetectionTTAModel:
# flip=True mirrors each view in the same batch and flips its detections back), all detections merged by NMS per
# class at the RoI heads' threshold, the heads' detections_per_img kept.
img_ratios = [0.75, 1.0, 1.25]
tta_pipeline = [
    dict(type='LoadImageFromFile', color_type='color_ignore_orientation'),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale=(int(image_size[0] * r), int(image_size[1] * r)), keep_ratio=True)
         for r in img_ratios],
        [dict(type='PackInstanceInputs')],
    ]),
]
tta_model = dict(type='DetectionTTAModel', flip=True)
train_dataloader = dict(
    batch_size=8,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(type=dataset_type, data_root=data_root, ann_file='annotations/instances_train2017.json',
                 data_prefix=dict(img_path='train2017/'), pipeline=train_pipeline),
)
val_dataloader = dict(
    batch_size=1,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, ann_file='annotations/instances_val2017.json',
                 data_prefix=dict(img_path='val2017/'), pipeline=test_pipeline, test_mode=True),
)
test_dataloader = val_dataloader
val_evaluator = dict(type='CocoAP')
test_evaluator = val_evaluator
