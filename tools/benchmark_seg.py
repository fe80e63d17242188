#!/usr/bin/env python
"""Segmentation speed: evaluation images/s single-scale vs multi-scale + flip, and training iterations/s.

    python tools/benchmark_seg.py                                   # UperNet + LV-ViT-S, CPU, the digits' scale
    python tools/benchmark_seg.py --device cuda --full-size --json bench.json

Runs the config's real pipelines and model (random weights) on the embedded digits set: at the embedded set's
scale by default (48/512 of ADE20K's sizes), or with --full-size at ADE20K's (images resized to 512 pixels on the
short side, 512 crops). The sliding-window tests run twice: with the config's batches of windows and window by
window (mmseg's own way, `window_batch=1`), and the ratio is printed.
"""
from __future__ import annotations

import argparse
import copy
import json
from itertools import cycle, islice
from pathlib import Path

import torch
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope
from mmengine.runner import Runner

import segmentation  # noqa: F401  (registers the suite's mmseg modules)
from benchmark import seconds_per_call
from engine.cli import positive_int, run_command
from mmseg.registry import MODELS
from segmentation.config import DIGITS_SCALE, load_config, use_digits_data
from segmentation.test import use_multi_scale


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--config', default='seg_configs/upernet_lvvit_s.py')
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--full-size', action='store_true', help="ADE20K's sizes instead of a quarter of them")
    parser.add_argument('--images', type=positive_int, default=8, help='evaluation images timed per mode')
    parser.add_argument('--iters', type=positive_int, default=5, help='training iterations timed')
    parser.add_argument('--batch-size', type=positive_int, default=2, help='training images per iteration')
    parser.add_argument('--json', help='also write the figures here')
    return parser.parse_args()


def loader(cfg, key: str):
    dataloader = copy.deepcopy(cfg[key])
    dataloader.update(num_workers=0, persistent_workers=False)
    return Runner.build_dataloader(dataloader)


def timed(fn, batches: list) -> float:
    """Seconds `fn` takes on batches[1:] in all, after a warm-up call on batches[0] (kernel selection, allocator)."""
    fn(batches[0])
    rest = iter(batches[1:])
    return seconds_per_call(lambda: fn(next(rest)), len(batches) - 1, warmup=0) * (len(batches) - 1)


def main() -> None:
    args = parse_args()
    init_default_scope('mmseg')
    cfg = load_config(args.config, {'model.backbone.pretrained': None})
    use_digits_data(cfg, scale=1.0 if args.full_size else DIGITS_SCALE)
    cfg.train_dataloader.batch_size = args.batch_size
    model = MODELS.build(cfg.model).to(args.device)
    results = {'config': args.config, 'device': args.device, 'full_size': args.full_size}

    model.eval()
    ss_batches = list(islice(loader(cfg, 'test_dataloader'), args.images + 1))
    with torch.no_grad():
        results['ss_img_per_s'] = args.images / timed(model.test_step, ss_batches)
    ms_cfg = copy.deepcopy(cfg)
    use_multi_scale(ms_cfg, flip=True)
    ms_batches = list(islice(loader(ms_cfg, 'test_dataloader'), args.images + 1))
    for suffix, window_batch in (('', ms_cfg.model.module.test_cfg.get('window_batch', 1)), ('_window_by_window', 1)):
        ms_cfg.model.module.test_cfg.window_batch = window_batch
        tta = MODELS.build(ms_cfg.model).to(args.device).eval()
        tta.module.load_state_dict(model.state_dict())
        with torch.no_grad():
            results[f'ms_flip_img_per_s{suffix}'] = args.images / timed(tta.test_step, ms_batches)
    results['ms_flip_slowdown'] = results['ss_img_per_s'] / results['ms_flip_img_per_s']
    results['window_batch_speedup'] = results['ms_flip_img_per_s'] / results['ms_flip_img_per_s_window_by_window']

    model.train()
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    train_batches = list(islice(cycle(loader(cfg, 'train_dataloader')), args.iters + 1))
    seconds = timed(lambda batch: model.train_step(batch, optim), train_batches)
    results['train_it_per_s'] = args.iters / seconds
    results['train_img_per_s'] = args.iters * args.batch_size / seconds

    for key, value in results.items():
        print(f'{key}: {value:.3f}' if isinstance(value, float) else f'{key}: {value}')
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + '\n')


if __name__ == '__main__':
    run_command(main)
