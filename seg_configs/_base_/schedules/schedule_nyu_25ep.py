# The suite's NYU-v2 schedule (the ADE20K recipe's optimizer on NYU's length): 25 epochs of the 24,231 training
# images in batches of 16 (38,000 iterations), AdamW lr 6e-5, weight decay 0.01, 1,500 linear warm-up iterations,
# then linear decay to 5e-6; the best checkpoint by AbsRel.
_base_ = ['./schedule_160k.py']
max_iters = 38000
warmup_iters = 1500
interval = 3800
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=warmup_iters),
    dict(type='PolyLR', power=1.0, eta_min=5e-6, by_epoch=False, begin=warmup_iters, end=max_iters),
]
train_cfg = dict(max_iters=max_iters, val_interval=interval)
default_hooks = dict(checkpoint=dict(interval=interval, save_best='abs_rel', rule='less'))
