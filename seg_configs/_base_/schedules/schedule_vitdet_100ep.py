# ViTDet's COCO schedule (detectron2's mask_rcnn_vitdet_b_100ep): 184,375 iterations of 64 images (100 epochs),
# AdamW lr 1e-4, weight decay 0.1, layer-wise lr decay 0.7 (ViT-B's), 250 linear warm-up iterations, then the lr
# x0.1 at iterations 163,889 and 177,546; the best checkpoint by mask AP.
_base_ = ['./schedule_160k.py']
max_iters = 184375
warmup_iters = 250
interval = 18437  # about every 10 epochs
optim_wrapper = dict(
    optimizer=dict(lr=1e-4, weight_decay=0.1),
    constructor='LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(layer_decay_rate=0.7),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=warmup_iters),
    # from iteration 0 (as mmdetection's ViTDet config): mmengine counts the milestones from `begin`
    dict(type='MultiStepLR', milestones=[163889, 177546], gamma=0.1, by_epoch=False, begin=0, end=max_iters),
]
train_cfg = dict(max_iters=max_iters, val_interval=interval)
default_hooks = dict(checkpoint=dict(interval=interval, save_best='mask_AP', rule='greater'))
