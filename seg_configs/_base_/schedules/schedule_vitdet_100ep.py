# ViTDet's COCO schedule (detectron2's mask_rcnn_vitdet_b_100ep): 184,375 iterations of 64 images (100 epochs),
# AdamW lr 1e-4, weight decay 0.1, layer-wise lr decay 0.7 (ViT-B's), 250 linear warm-up iterations, then the lr
# x0.1 at iterations 163,889 and 177,546.
max_iters = 184375
warmup_iters = 250
interval = 18437  # about every 10 epochs
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
    constructor='LayerDecayOptimWrapperConstructor',
    paramwise_cfg=dict(layer_decay_rate=0.7),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=warmup_iters),
    dict(type='MultiStepLR', milestones=[163889, 177546], gamma=0.1, by_epoch=False, begin=warmup_iters,
         end=max_iters),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=interval)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=interval, max_keep_ckpts=3,
                    save_best='mask_AP', rule='greater'),
    sampler_seed=dict(type='DistSamplerSeedHook'),
)
