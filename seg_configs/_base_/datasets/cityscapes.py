# Cityscapes (19 classes) in its published layout, data/cityscapes/{leftImg8bit,gtFine}/{train,val}/CITY/: the
# masks as published (*_gtFine_labelIds.png, 34 label ids mapped to the 19 train ids by the official table,
# others ignored), or mmseg's converter's *_gtFine_labelTrainIds.png where present (CityscapesIdsDataset, mmseg's
# CityscapesDataset reading both). mmseg's zoo settings: 2048x1024 images rescaled by 0.5-2.0, 512x1024 crops, the
# sliding-window test in 512x1024 windows (the model configs' test_cfg); 2 images per GPU on 4 GPUs.
# Images are read as stored, EXIF orientation ignored, as in ade20k.py.
dataset_type = 'CityscapesIdsDataset'
data_root = 'data/cityscapes'
crop_size = (512, 1024)
test_scale = (2048, 1024)
train_pipeline = [
    dict(type='LoadImageFromFile', color_type='color_ignore_orientation'),
    dict(type='LoadAnnotations'),
    dict(type='RandomResize', scale=test_scale, ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile', color_type='color_ignore_orientation'),
    dict(type='Resize', scale=test_scale, keep_ratio=True),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
]
# Multi-scale test as ade20k.py's: each ratio scales the single-scale size (mmseg's Cityscapes ratios); the model
# adds each view's mirror image in the same batch.
img_ratios = [0.5, 0.75, 1.0, 1.25, 1.5, 1.75]
tta_pipeline = [
    dict(type='LoadImageFromFile', color_type='color_ignore_orientation'),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale=(int(test_scale[0] * r), int(test_scale[1] * r)), keep_ratio=True)
         for r in img_ratios],
        [dict(type='LoadAnnotations')],
        [dict(type='PackSegInputs')],
    ]),
]
tta_model = dict(type='FlipBatchTTAModel', flip=True)
train_dataloader = dict(
    batch_size=2,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(type=dataset_type, data_root=data_root, pipeline=train_pipeline,
                 data_prefix=dict(img_path='leftImg8bit/train', seg_map_path='gtFine/train')),
)
val_dataloader = dict(
    batch_size=1,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, pipeline=test_pipeline,
                 data_prefix=dict(img_path='leftImg8bit/val', seg_map_path='gtFine/val')),
)
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUReport')
test_evaluator = val_evaluator
