"""Throughput and peak memory of a model, inference forward and a full training step, each variant (fused or
explicit attention, gradient checkpointing, hard distillation) in a fresh process: the logic of
tools/benchmark.py."""
from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import sys

import torch
import torch.nn.functional as F
from timm.layers import set_fused_attn

import backbones
from backbones import TokenLabelingOutput
from backbones.common.cli import add_model_argument, command_parser, non_negative_int, positive_int
from backbones.common.commands import write_document
from backbones.common.devices import TIMED_IN_FP32, add_amp_argument, add_device_argument, device_name
from backbones.common.log import logger, show_log
from backbones.registry import check_model_name
from backbones.token_head import has_token_head
from classification.engine.steps import autocast
from classification.models import Teacher, create_classifier
from classification.objectives.objective import DistillationObjective
from classification.studies.results_file import results_document
from classification.studies.timing import images_per_second

VARIANTS = {  # label: (fused attention, gradient checkpointing, distilled from --teacher)
    'plain': (True, False, False), 'unfused': (False, False, False), 'grad_checkpointing': (True, True, False),
    'distillation': (True, False, True),
}


def parse_args(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    parser = command_parser(description, 'benchmark.py')
    add_model_argument(parser)
    parser.add_argument('--batch-size', type=positive_int, default=8, help='images per step')
    parser.add_argument('--img-size', type=positive_int, default=None, help="input size (default: the model's own)")
    add_device_argument(parser)
    add_amp_argument(parser, 'none', TIMED_IN_FP32, ('none', 'bf16', 'fp16'))
    parser.add_argument('--steps', type=positive_int, default=10, help='timed iterations per measurement')
    parser.add_argument('--warmup', type=non_negative_int, default=3, help='untimed iterations before them')
    parser.add_argument('--compare-unfused', action='store_true',
                        help='also measure the same model with explicit-softmax attention and print ratios')
    parser.add_argument('--compare-grad-checkpointing', action='store_true',
                        help='also measure training with gradient checkpointing and print the memory it saves')
    parser.add_argument('--teacher', metavar='MODEL',
                        help='also measure the training step of DeiT\'s hard distillation from this teacher (a '
                             'distillation token and head on the model; the teacher\'s forward included)')
    parser.add_argument('--json', action='store_true', help='print the figures as one JSON object')
    args = parser.parse_args(argv)
    args.device = device_name(args.device)
    return args


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


def measure(args: argparse.Namespace, variant: str) -> dict[str, float]:
    fused_attention, grad_checkpointing, distilled = VARIANTS[variant]
    device = torch.device(args.device)
    set_fused_attn(fused_attention)
    try:
        kwargs = {'img_size': args.img_size} if args.img_size else {}
        model = backbones.create_model(args.model, distilled=True, **kwargs) if distilled else \
            backbones.create_model(args.model, **kwargs)
        model.to(device)
    finally:
        set_fused_attn(True)
    if grad_checkpointing:
        model.set_grad_checkpointing(True)
    size = args.img_size or model.pretrained_cfg['input_size'][-1]
    objective = None
    if distilled:  # the training tool's own objective, teacher included (random weights: the cost is the same)
        model.set_distilled_training(True)
        cfg = model.pretrained_cfg
        teacher = Teacher(create_classifier(args.teacher, model.num_classes, size), cfg['mean'], cfg['std'])
        objective = DistillationObjective(model.num_classes, 0.1, teacher=teacher.to(device))
    images = torch.randn(args.batch_size, 3, size, size, device=device)
    target = torch.randint(0, model.num_classes, (args.batch_size,), device=device)
    scaler = torch.amp.GradScaler(device.type, enabled=args.amp == 'fp16')
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def forward_step() -> None:
        with torch.no_grad(), autocast(device, args.amp):
            model(images)

    def train_step() -> None:
        with autocast(device, args.amp):
            if objective is None:  # LV-ViT (with its token head) trains through its token-labeling forward
                loss = training_loss(model.forward_train(images) if has_token_head(model) else model(images), target)
            else:
                inputs, targets = objective.prepare(images, target)
                loss = objective.loss(model(inputs), {}, targets, device)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    results = {}
    if not (grad_checkpointing or distilled):  # the forward pass does not depend on them
        if device.type == 'cuda':
            torch.cuda.reset_peak_memory_stats(device)
        model.eval()
        results['forward_img_s'] = images_per_second(forward_step, args.batch_size, args.steps, args.warmup)
        results['forward_peak_mib'] = peak_memory_mib(device)
    model.train()
    results['train_img_s'] = images_per_second(train_step, args.batch_size, args.steps, args.warmup)
    results['train_peak_mib'] = peak_memory_mib(device)
    return results


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    """tools/benchmark.py."""
    args = parse_args(argv, description)
    show_log(stream=sys.stderr if args.json else None)  # with --json standard output is the JSON document
    torch.manual_seed(0)
    check_model_name(args.model)
    if args.teacher:
        check_model_name(args.teacher)
    variants = ['plain'] + ['unfused'] * args.compare_unfused + \
        ['grad_checkpointing'] * args.compare_grad_checkpointing + ['distillation'] * bool(args.teacher)
    with multiprocessing.get_context('spawn').Pool(1, maxtasksperchild=1) as pool:  # each variant in a fresh process
        results = {variant: pool.apply(measure, (args, variant)) for variant in variants}
    if args.json:
        figures = {'model': args.model, 'batch_size': args.batch_size, **results}
        write_document(json.dumps(results_document('model_benchmark', 'benchmark.py', argv, figures, args.device)))
        return 0
    logger.info(f'{args.model}  batch {args.batch_size}  {args.device}  amp {args.amp}  threads '
                f'{torch.get_num_threads()}')
    for label, r in results.items():
        forward = (f"forward {r['forward_img_s']:8.1f} img/s (peak {r['forward_peak_mib']:7.0f} MiB)   "
                   if 'forward_img_s' in r else ' ' * 50)
        logger.info(f"  {label:18s} {forward}train step {r['train_img_s']:8.1f} img/s "
                    f"(peak {r['train_peak_mib']:7.0f} MiB)")
    plain = results['plain']
    if 'unfused' in results:
        unfused = results['unfused']
        logger.info(f"  speed-up of fused attention: forward x{plain['forward_img_s'] / unfused['forward_img_s']:.2f}"
                    f", train step x{plain['train_img_s'] / unfused['train_img_s']:.2f}")
    if 'distillation' in results:
        ratio = results['distillation']['train_img_s'] / plain['train_img_s']
        logger.info(f"  hard distillation from {args.teacher}: train step x{ratio:.2f} speed, "
                    f"{1 / ratio - 1:+.0%} time per step (the teacher's forward included)")
    if 'grad_checkpointing' in results:
        checkpointed = results['grad_checkpointing']
        memory, speed = (checkpointed[key] / plain[key] for key in ('train_peak_mib', 'train_img_s'))
        saved = plain['train_peak_mib'] - checkpointed['train_peak_mib']
        logger.info(f"  gradient checkpointing: training peak memory x{memory:.2f} ({saved:.0f} MiB less), train "
                    f"step x{speed:.2f} speed")
    return 0
