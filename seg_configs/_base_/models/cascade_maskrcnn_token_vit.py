# Cascade Mask R-CNN on a token backbone, as ViTDet (Li et al. 2022; detectron2's CascadeROIHeads): Mask R-CNN's
# backbone, simple feature pyramid and RPN, then three box stages at foreground IoU 0.5, 0.6 and 0.7, each its own
# 4-conv + 1-fc LayerNorm box head with class-agnostic box regression (weights (10, 10, 5, 5), (20, 20, 10, 10),
# (30, 30, 15, 15)), each refining the boxes of the one before; the mask head on the last stage's boxes.
_base_ = ['./maskrcnn_token_vit.py']
model = dict(
    type='TokenCascadeMaskRCNN',
    stage_ious=(0.5, 0.6, 0.7),
    stage_box_weights=((10.0, 10.0, 5.0, 5.0), (20.0, 20.0, 10.0, 10.0), (30.0, 30.0, 15.0, 15.0)),
)
