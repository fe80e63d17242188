# DINOv2's linear depth of frozen features ("lin. 1"): the frozen backbone's last block, each cell's patch token
# beside the class token (no final norm), upsampled 4x, a 1x1 convolution to 256 depth bins evenly spaced from
# 0.001 m to max_depth, their "linear" distribution's mean the depth (LinearDepthHead); no neck. "lin. 4" configs
# read 4 blocks. Trained with the scale-invariant log loss. The configs fill in the model.
_base_ = ['./depth_token_vit.py']
model = dict(
    backbone=dict(out_indices=(15,), drop_path_rate=0.0, frozen=True, class_token=True),
    neck=None,
    decode_head=dict(_delete_=True, type='LinearDepthHead', in_channels=[2 * 384], n_bins=256, upsample=4,
                     min_depth=1e-3, max_depth=10.0, loss_decode=dict(type='SiLogLoss')),
)
