# UperNet on a token backbone, as in the LV-ViT paper: features of four blocks (stride 16, class token dropped, no
# final norm), a neck making strides 4, 8, 16, 16 (the last with 2,048 channels), UperNet with pool scales
# (1, 2, 3, 6), and an FCN auxiliary head on the third level (loss weight 0.4). The configs fill in the model.
norm_cfg = dict(type='SyncBN', requires_grad=True)  # plain BN when the runner is not distributed
data_preprocessor = dict(
    type='SegDataPreProcessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True,
    pad_val=0,
    seg_pad_val=255,
    size=(512, 512),
)
model = dict(
    type='SlideBatchEncoderDecoder',  # mmseg's EncoderDecoder, sliding-window test in batches of windows
    data_preprocessor=data_preprocessor,
    backbone=dict(type='TokenBackbone', model_name='lvvit_s', out_indices=(6, 9, 12, 15), img_size=512,
                  drop_path_rate=0.1, pretrained=None),
    neck=dict(type='TokenPyramidNeck', in_channels=384, out_channels=(384, 384, 384, 2048), scales=(4, 2, 1, 1),
              norm_cfg=norm_cfg),
    decode_head=dict(
        type='UPerHead',
        in_channels=[384, 384, 384, 2048],
        in_index=[0, 1, 2, 3],
        pool_scales=(1, 2, 3, 6),
        channels=256,
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
    ),
    auxiliary_head=dict(
        type='FCNHead',
        in_channels=384,
        in_index=2,
        channels=256,
        num_convs=1,
        concat_input=False,
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=0.4),
    ),
    train_cfg=dict(),
    test_cfg=dict(mode='slide', crop_size=(512, 512), stride=(341, 341), window_batch=32),
)
