# DINOv2's linear segmentation of frozen features ("lin."): the frozen backbone's last block through its final norm
# at stride 16, a batch norm and a 1x1 convolution (LinearHead, DINOv2's BNHead), the logits upsampled bilinearly to
# the image; no neck, no auxiliary head. The "+ms" configs read the last 4 blocks concatenated (in_channels 4 x 384)
# and test at DINOv2's scales. The configs fill in the model.
_base_ = ['./upernet_token_vit.py']
norm_cfg = dict(type='SyncBN', requires_grad=True)
model = dict(
    backbone=dict(out_indices=(15,), drop_path_rate=0.0, frozen=True, final_norm=True),
    neck=None,
    decode_head=dict(
        _delete_=True,
        type='LinearHead',
        in_channels=[384],
        in_index=[0],
        channels=384,
        dropout_ratio=0,
        num_classes=150,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
    ),
    auxiliary_head=None,
)
