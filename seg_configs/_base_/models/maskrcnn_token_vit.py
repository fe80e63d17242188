# Mask R-CNN on a token backbone, as ViTDet (Li et al. 2022): the last block's patch tokens (stride 16) feed a
# simple feature pyramid (strides 4, 8, 16, 32 by deconvolutions, identity and max pooling, 256 channels, plus a
# pooled stride-64 level for the RPN); torchvision's RPN and RoI heads (4-conv box and mask heads with LayerNorm).
# Images are padded to a multiple of 32 in one batch; the configs fill in the model.
data_preprocessor = dict(
    type='ImgDataPreprocessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True,
    pad_size_divisor=32,
)
model = dict(
    type='TokenMaskRCNN',
    data_preprocessor=data_preprocessor,
    backbone=dict(type='TokenBackbone', model_name='lvvit_s', out_indices=(15,), img_size=1024, drop_path_rate=0.1,
                  pretrained=None),
    neck=dict(type='SimpleFeaturePyramid', in_channels=384, out_channels=256, scales=(4.0, 2.0, 1.0, 0.5)),
    num_classes=80,  # the tools take the count from the training set's annotation file
    anchor_sizes=(32, 64, 128, 256, 512),
    aspect_ratios=(0.5, 1.0, 2.0),
    aligned_roi=True,  # RoIAlign at pixel centres: detectron2's ROIAlignV2, as ViTDet's configs pool
)
