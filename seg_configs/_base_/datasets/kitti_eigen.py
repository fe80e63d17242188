# KITTI depth, the Eigen split as the depth papers use it (BTS, DPT, AdaBins, Depth-Anything), in data/kitti:
# input/ (KITTI raw's drives, DATE/DATE_drive_NNNN_sync/image_02/data/*.png), gt_depth/ (the improved ground truth
# of Uhrig et al., data_depth_annotated's train/ and val/ drives together: DRIVE/proj_depth/groundtruth/image_02/
# *.png, 16-bit, 1/256 m, 0 where LiDAR measured nothing) and BTS's split files eigen_{train,test}_files_with_gt.txt
# (23,158 training frames; 652 of the 697 test frames have ground truth, the others are left out and named).
# Training: flip, 352x704 crops of the whole image (BTS's and DPT's size), colour distortion; test: the whole image
# at KITTI's 375 rows (each day's frames are 370-376 rows high: within 1.4% of their own size). Scored within
# 0.001-80 m on Garg's crop (rows 0.408-0.992, columns 0.036-0.964 of the image), each image's figures averaged.
dataset_type = 'KITTIDepthDataset'
data_root = 'data/kitti'
crop_size = (352, 704)
kitti_depth_scale = 256
# pred_name: a frame's predicted depth map is DRIVE_FRAME.png (test_seg --pred-dir), each drive numbering from 0
meta_keys = ('img_path', 'depth_map_path', 'pred_name', 'ori_shape', 'img_shape', 'pad_shape', 'scale_factor', 'flip',
             'flip_direction')
train_pipeline = [
    dict(type='LoadImageFromFile', color_type='color_ignore_orientation'),
    dict(type='LoadDepthAnnotation', depth_rescale_factor=1 / kitti_depth_scale),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomCrop', crop_size=crop_size),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs', meta_keys=meta_keys),
]
test_pipeline = [
    dict(type='LoadImageFromFile', color_type='color_ignore_orientation'),
    dict(type='Resize', scale=(1242, 375), keep_ratio=True),
    dict(type='LoadDepthAnnotation', depth_rescale_factor=1 / kitti_depth_scale),
    dict(type='PackSegInputs', meta_keys=meta_keys),
]
# Test-time augmentation (--tta, --ms): the whole image and its mirror image, their depth averaged, as the depth
# papers report KITTI (nyu.py says how).
img_ratios = [1.0]
tta_pipeline = [
    dict(type='LoadImageFromFile', color_type='color_ignore_orientation'),
    dict(type='TestTimeAug', transforms=[
        [dict(type='Resize', scale=(int(1242 * r), int(375 * r)), keep_ratio=True) for r in img_ratios],
        [dict(type='LoadDepthAnnotation', depth_rescale_factor=1 / kitti_depth_scale)],
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
                 ann_file='eigen_train_files_with_gt.txt',
                 data_prefix=dict(img_path='input', depth_map_path='gt_depth')),
)
val_dataloader = dict(
    batch_size=1,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, pipeline=test_pipeline, test_mode=True,
                 ann_file='eigen_test_files_with_gt.txt',
                 data_prefix=dict(img_path='input', depth_map_path='gt_depth')),
)
test_dataloader = val_dataloader
val_evaluator = dict(type='DepthReport', min_depth_eval=1e-3, max_depth_eval=80.0, crop_type='garg_crop',
                     depth_scale_factor=kitti_depth_scale)
test_evaluator = val_evaluator
