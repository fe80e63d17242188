"""Throughput and peak memory of a model: inference forward and a full training step (forward, loss, backward, AdamW).

    python tools/benchmark.py lvvit_s [--batch-size 32] [--img-size 224] [--device cuda] [--amp bf16]
    python tools/benchmark.py t2t_vit_14 --compare-unfused     # also time explicit-softmax attention, print ratios

Peak memory is the accelerator's peak allocation on CUDA, and the peak resident size of the measuring process on
CPU (each configuration is measured in a fresh process, so the figures do not carry over).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import resource
import sys
import time
from typing import Callable, Dict

import torch
import torch.nn.functional as F
from timm.layers import set_fused_attn

import backbones
from backbones import TokenLabelingOutput
from backbones.registry import check_model_name
from backbones.cli import non_negative_int, positive_int, run_command


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('model')
    parser.add_argument('--batch-size', type=positive_int, default=8)
    parser.add_argument('--img-size', type=positive_int, default=None, help="default: the model's own")
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--amp', choices=['none', 'bf16', 'fp16'], default='none')
    parser.add_argument('--steps', type=positive_int, default=10, help='timed iterations per measurement')
    parser.add_argument('--warmup', type=non_negative_int, default=3)
    parser.add_argument('--compare-unfused', action='store_true',
                        help='also measure the same model with explicit-softmax attention and print ratios')
    parser.add_argument('--json', action='store_true', help='print the figures as one JSON object')
    return parser.parse_args(argv)


def training_loss(output, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy on the class output; models with a token head add their token loss (image label per token)."""
    if isinstance(output, TokenLabelingOutput):
        tokens = output.token_logits.flatten(0, 2)
        per_token = target.repeat_interleave(output.token_logits.shape[1] * output.token_logits.shape[2])
        return F.cross_entropy(output.cls_logits, target) + 0.5 * F.cross_entropy(tokens, per_token)
    return F.cross_entropy(output, target)


def peak_memory_mib(device: torch.device) -> float:
    if device.type == 'cuda':
        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def images_per_second(step: Callable[[], None], batch_size: int, steps: int, warmup: int,
                      device: torch.device) -> float:
    for _ in range(warmup):
        step()
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    return batch_size * steps / (time.perf_counter() - start)


def measure(args: argparse.Namespace, fused_attention: bool = True) -> Dict[str, float]:
    device = torch.device(args.device)
    set_fused_attn(fused_attention)
    try:
        kwargs = {'img_size': args.img_size} if args.img_size else {}
        model = backbones.create_model(args.model, **kwargs).to(device)
    finally:
        set_fused_attn(True)
    size = args.img_size or model.pretrained_cfg['input_size'][-1]
    images = torch.randn(args.batch_size, 3, size, size, device=device)
    target = torch.randint(0, model.num_classes, (args.batch_size,), device=device)
    dtype = {'bf16': torch.bfloat16, 'fp16': torch.float16}.get(args.amp)
    autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else contextlib.nullcontext
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == 'fp16')
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def forward_step() -> None:
        with torch.no_grad(), autocast():
            model(images)

    def train_step() -> None:
        with autocast():
            loss = training_loss(model(images), target)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
    model.eval()
    forward = images_per_second(forward_step, args.batch_size, args.steps, args.warmup, device)
    forward_mem = peak_memory_mib(device)
    model.train()
    train = images_per_second(train_step, args.batch_size, args.steps, args.warmup, device)
    return {'forward_img_s': forward, 'forward_peak_mib': forward_mem,
            'train_img_s': train, 'train_peak_mib': peak_memory_mib(device)}


def measure_in_fresh_process(args: argparse.Namespace, fused_attention: bool) -> Dict[str, float]:
    with multiprocessing.get_context('spawn').Pool(1) as pool:
        return pool.apply(measure, (args, fused_attention))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    try:
        check_model_name(args.model)
        results = {'fused': measure_in_fresh_process(args, True)}
        if args.compare_unfused:
            results['unfused'] = measure_in_fresh_process(args, False)
    except ValueError as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({'model': args.model, 'batch_size': args.batch_size, 'device': args.device, **results}))
        return 0
    print(f'{args.model}  batch {args.batch_size}  {args.device}  amp {args.amp}  threads {torch.get_num_threads()}')
    for label, r in results.items():
        print(f"  {label:8s} forward {r['forward_img_s']:8.1f} img/s (peak {r['forward_peak_mib']:7.0f} MiB)   "
              f"train step {r['train_img_s']:8.1f} img/s (peak {r['train_peak_mib']:7.0f} MiB)")
    if 'unfused' in results:
        fused, unfused = results['fused'], results['unfused']
        print(f"  speed-up of fused attention: forward x{fused['forward_img_s'] / unfused['forward_img_s']:.2f}, "
              f"train step x{fused['train_img_s'] / unfused['train_img_s']:.2f}")
    return 0


if __name__ == '__main__':
    run_command(main)
