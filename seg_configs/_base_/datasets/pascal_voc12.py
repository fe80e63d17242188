# Pascal VOC 2012 segmentation in its published layout, data/VOCdevkit/VOC2012/: JPEGImages/*.jpg,
# SegmentationClass/*.png (palette PNGs: 0 background, 1..20 the classes, 255 the boundaries, ignored) and the split
# files ImageSets/Segmentation/{train,val}.txt (1,464 / 1,449 images; PascalVOCIdsDataset, mmseg's
# PascalVOCDataset). mmseg's zoo settings: images rescaled to fit 2048x512 by 0.5-2.0, 512x512 crops; 4 images per
# GPU on 4 GPUs. Images are read as stored, as in ade20k.py.
dataset_type = 'PascalVOCIdsDataset'
data_root = 'data/VOCdevkit/VOC2012'
crop_size = (512, 512)
test_scale = (2048, 512)
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
# Multi-scale test as ade20k.py's: each ratio scales the single-scale size (mmseg's Pascal VOC ratios); the model
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
    batch_size=4,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(type=dataset_type, data_root=data_root, pipeline=train_pipeline,
                 data_prefix=dict(img_path='JPEGImages', seg_map_path='SegmentationClass'),
                 ann_file='ImageSets/Segmentation/train.txt'),
)
val_dataloader = dict(
    batch_size=1,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, pipeline=test_pipeline,
                 data_prefix=dict(img_path='JPEGImages', seg_map_path='SegmentationClass'),
                 ann_file='ImageSets/Segmentation/val.txt'),
)
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUReport')
test_evaluator = val_evaluator
