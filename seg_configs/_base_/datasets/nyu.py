# NYU-v2 depth in mmseg's layout, data/nyu/{images,annotations}/{train,test}/ (NAME.jpg and NAME.png, the depth
# in 16-bit millimetres; 0 where the sensor measured nothing). Training: mmseg's NYU pipeline (depth mix, flip,
# 480x480 crops, colour distortion); test: the whole 640x480 image. Scored within 0.001-10 m on NYU's evaluation
# crop (Eigen et al.), each image's figures averaged over the images, as mmseg and the depth papers do.
dataset_type = 'NYUDataset'
data_root = 'data/nyu'
crop_size = (480, 480)
meta_keys = ('img_path', 'depth_map_path', 'ori_shape', 'img_shape', 'pad_shape', 'scale_factor', 'flip',
             'flip_direction', 'category_id')
train_pipeline = [
    dict(type='LoadImageFromFile', color_type='color_ignore_orientation'),
    dict(type='LoadDepthAnnotation', depth_rescale_factor=1e-3),
    dict(type='RandomDepthMix', prob=0.25),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomCrop', crop_size=crop_size),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs', meta_keys=meta_keys),
]
test_pipeline = [
    dict(type='LoadImageFromFile', color_type='color_ignore_orientation'),
    dict(type='Resize', scale=(2000, 480), keep_ratio=True),
    dict(type='LoadDepthAnnotation', depth_rescale_factor=1e-3),
    dict(type='PackSegInputs', meta_keys=meta_keys),
]
# Test-time augmentation (--tta, --ms): the depth papers' NYU-v2 and KITTI protocol, the whole image and its mirror
# image, their depth averaged (DepthTTAModel: flip=True mirrors each view in the same batch, the estimator flips its
# depth back). More ratios make it multi-scale: each scale's depth is resampled to the image before averaging.
img_ratios = [1.0]
tta_pipeline = [
    dict(type='LoadImageFromFile', color_type='color_ignore_orientation'),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale=(int(2000 * r), int(480 * r)), keep_ratio=True) for r in img_ratios],
        [dict(type='LoadDepthAnnotation', depth_rescale_factor=1e-3)],
        [dict(type='PackSegInputs', meta_keys=meta_keys)],
    ]),
]
tta_model = dict(type='DepthTTAModel', flip=True)
train_dataloader = dict(
    batch_size=8,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(type=dataset_type, data_root=data_root, pipeline=train_pipeline,
                 data_prefix=dict(img_path='images/train', depth_map_path='annotations/train')),
)
val_dataloader = dict(
    batch_size=1,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, pipeline=test_pipeline, test_mode=True,
                 data_prefix=dict(img_path='images/test', depth_map_path='annotations/test')),
)
test_dataloader = val_dataloader
val_evaluator = dict(type='DepthReport', min_depth_eval=1e-3, max_depth_eval=10.0, crop_type='nyu_crop',
                     depth_scale_factor=1000)
test_evaluator = val_evaluator
