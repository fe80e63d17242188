# ADE20K (150 classes) in its standard layout, data/ade/ADEChallengeData2016/{images,annotations}/{training,validation}.
# Label 0 ("other") is ignored: the data set's reduce_zero_label (ADE20KDataset's, on by default; LoadAnnotations
# takes it from there) maps 1..150 to 0..149 and 0 to 255.
# 16 images per iteration: 2 per GPU on 8 GPUs (raise batch_size when training on fewer).
# Images are read as stored, EXIF orientation ignored, as the annotations are (and as the suite's classification and
# label generation read images): a JPEG turned by its EXIF tag would no longer match its PNG annotation.
dataset_type = 'ADE20KDataset'
data_root = 'data/ade/ADEChallengeData2016'
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
# Multi-scale test as the papers ran it (mmseg 0.x): each ratio scales (2048, 512), not the original image, and
# the image is resized once from the original. mmseg 1.x's own `--tta` scales the original image instead.
# One view per scale: the model (FlipBatchTTAModel, flip=True) adds each one's mirror image in the same batch.
img_ratios = [0.75, 1.0, 1.25, 1.5, 1.75]
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
                 data_prefix=dict(img_path='images/training', seg_map_path='annotations/training')),
)
val_dataloader = dict(
    batch_size=1,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, pipeline=test_pipeline,
                 data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation')),
)
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUReport')
test_evaluator = val_evaluator
