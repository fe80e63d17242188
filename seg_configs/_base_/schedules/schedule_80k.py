# The ADE20K schedule's optimizer (schedule_160k.py: AdamW lr 6e-5, weight decay 0.01, 1,500 linear warm-up
# iterations, then linear decay to 5e-6) over 80k iterations, the length of mmseg's zoo schedules for Cityscapes,
# Pascal Context-59 and COCO-Stuff-164k.
_base_ = ['./schedule_160k.py']
max_iters = 80000
warmup_iters = 1500
interval = 8000
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=warmup_iters),
    dict(type='PolyLR', power=1.0, eta_min=5e-6, by_epoch=False, begin=warmup_iters, end=max_iters),
]
train_cfg = dict(max_iters=max_iters, val_interval=interval)
default_hooks = dict(checkpoint=dict(interval=interval))
