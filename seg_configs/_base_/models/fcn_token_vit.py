# FCN on a token backbone: the last chosen block, upsampled to stride 8 by the neck, feeds a two-conv FCN head
# (input concatenated); an FCN auxiliary head reads the earlier block at stride 16 (loss weight 0.4).
_base_ = ['./upernet_token_vit.py']
norm_cfg = dict(type='SyncBN', requires_grad=True)
model = dict(
    backbone=dict(out_indices=(12, 15)),
    neck=dict(out_channels=(384, 384), scales=(1, 2)),
    decode_head=dict(
        _delete_=True,
        type='FCNHead',
        in_channels=384,
        in_index=1,
        channels=256,
        num_convs=2,
        concat_input=True,
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
    ),
    auxiliary_head=dict(in_index=0),
)
