# Pascal Context-59 in its published layout, data/VOCdevkit/VOC2010/: JPEGImages/*.jpg, SegmentationClassContext/
# *.png (0 background, ignored: the data set's reduce_zero_label; 1..59 the classes) written by mmseg's
# pascal_context.py converter from trainval_merged.json, and the split files ImageSets/SegmentationContext/
# {train,val}.txt (PascalContextIdsDataset59, mmseg's PascalContextDataset59). mmseg's zoo settings: images rescaled
# to fit 520x520 by 0.5-2.0, 480x480 crops, the sliding-window test in 480x480 windows at a stride of 320 (the
# model configs' test_cfg); 4 images per GPU on 4 GPUs. Images are read as stored, as in ade20k.py.
dataset_type = 'PascalContextIdsDataset59'
data_root = 'data/VOCdevkit/VOC2010'
crop_size = (480, 480)
test_scale = (520, 520)
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
# Multi-scale test as ade20k.py's: each ratio scales the single-scale size (mmseg's Pascal Context ratios); the
# model adds each view's mirror image in the same batch.
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
    batch_size=4,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(type=dataset_type, data_root=data_root, pipeline=train_pipeline,
                 data_prefix=dict(img_path='JPEGImages', seg_map_path='SegmentationClassContext'),
                 ann_file='ImageSets/SegmentationContext/train.txt'),
)
val_dataloader = dict(
    batch_size=1,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, pipeline=test_pipeline,
                 data_prefix=dict(img_path='JPEGImages', seg_map_path='SegmentationClassContext'),
                 ann_file='ImageSets/SegmentationContext/val.txt'),
)
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUReport')
test_evaluator = val_evaluator
