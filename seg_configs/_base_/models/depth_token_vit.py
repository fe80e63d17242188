# Depth on a token backbone: features of four blocks (stride 16, class token dropped), the pyramid neck making
# strides 4, 8, 16, 16 (256 channels each), and a DPT-style fusion head (`DepthFusionHead`) giving depth up to
# max_depth metres, trained with the scale-invariant log loss; mmseg's depth estimator, its sliding test mended.
norm_cfg = dict(type='SyncBN', requires_grad=True)  # plain BN when the runner is not distributed
data_preprocessor = dict(
    type='SegDataPreProcessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True,
    pad_val=0,
    seg_pad_val=0,  # depth 0: no measurement
    size_divisor=32,
)
model = dict(
    type='TokenDepthEstimator',
    data_preprocessor=data_preprocessor,
    backbone=dict(type='TokenBackbone', model_name='lvvit_s', out_indices=(6, 9, 12, 15), img_size=480,
                  drop_path_rate=0.1, pretrained=None),
    neck=dict(type='TokenPyramidNeck', in_channels=384, out_channels=(256, 256, 256, 256), scales=(4, 2, 1, 1),
              norm_cfg=norm_cfg),
    decode_head=dict(type='DepthFusionHead', in_channels=[256, 256, 256, 256], channels=256, max_depth=10.0,
                     loss_decode=dict(type='SiLogLoss')),
    test_cfg=dict(mode='whole'),
)
