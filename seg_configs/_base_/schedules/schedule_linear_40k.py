# DINOv2's linear segmentation schedule: AdamW lr 1e-3, weight decay 1e-4, 1,500 linear warm-up iterations from
# 1e-6 of it, then linear (poly, power 1) decay to 0 at 40k iterations; DINOv2 trained 16 images an iteration (ADE20K's
# data config: 2 per GPU on 8).
_base_ = ['./schedule_160k.py']
max_iters = 40000
warmup_iters = 1500
interval = 4000
optim_wrapper = dict(optimizer=dict(lr=1e-3, weight_decay=1e-4))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=warmup_iters),
    dict(type='PolyLR', power=1.0, eta_min=0.0, by_epoch=False, begin=warmup_iters, end=max_iters),
]
train_cfg = dict(max_iters=max_iters, val_interval=interval)
default_hooks = dict(checkpoint=dict(interval=interval))
