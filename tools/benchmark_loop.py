#!/usr/bin/env python
"""Images/s of each stage of the real training loop, and the stage that bounds it.

For each model (default: LV-ViT-S with token labeling, DeiT-S with the vanilla DeiT recipe), through the training
tool's own loaders, model, objective and optimizer:
- input pipeline per core: one process, one thread; the PIL path (`--augment pil`), and the batched path
  (`--augment batched`: the workers' half, then the device's half where the device is this CPU);
- input pipeline with `--workers` loader processes, both paths (the device's half included);
- model step: forward, loss (token targets included), backward and optimizer on batches already on the device;
- whole loop: `train_one_epoch` over the loader, with the path `--augment` picks.
The bound stage is the slower of the input pipeline (the loop's path, with workers) and the model step.
`--compare-step` also times the model step with each of the trainer's step options alone (fused optimizer,
channels-last, bf16 autocast, torch.compile) against the step without any of them.

    python tools/benchmark_loop.py                      # synthetic ImageNet-size JPEGs (500x375), 2 workers
    python tools/benchmark_loop.py --device cuda --amp bf16 --batch-size 256 --workers 16 \\
        --data-dir /data/imagenet --token-label-dir /data/imagenet_labels
    python tools/benchmark_loop.py --models lvvit_s --compare-step --json
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Iterable

import numpy as np
import timm
import torch
from PIL import Image

from common.timing import seconds_per_call, synchronize
from classification.models import create_classifier, model_data_config
from classification.recipes import recipe_for
from classification.train import ImageData, make_loaders, make_objective, pick_augment
from common.cli import add_device_argument, device_name, positive_int, run_command
from common.log import show_log
from common.distributed import DistInfo
from common.images import find_classes
from engine.steps import StepState, model_input, pick_amp, train_one_epoch
from engine.trainer import RunOptions, optimization_state, use_channels_last
from token_labeling.annotate import generate_token_labels
from token_labeling.label_store import TokenLabelStore

MODELS = ('lvvit_s', 'deit_small_patch16_224')
STEP_OPTIONS = ('fused_optimizer', 'channels_last', 'bf16', 'compile')


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--models', nargs='+', default=list(MODELS),
                        help='models, each with its own recipe (token labeling for LV-ViT)')
    parser.add_argument('--data-dir', help='an ImageNet-layout folder (default: synthetic JPEGs)')
    parser.add_argument('--token-label-dir', help='its token-label store (default: made for the synthetic data)')
    parser.add_argument('--images', type=positive_int, default=64, help='synthetic training images')
    parser.add_argument('--batch-size', type=positive_int, default=16)
    parser.add_argument('--batches', type=positive_int, default=4, help='batches timed per stage')
    parser.add_argument('--repeats', type=positive_int, default=3, help='timings of the model step (median)')
    parser.add_argument('--workers', type=positive_int, default=2, help='loader processes of the pipeline and loop')
    add_device_argument(parser)
    parser.add_argument('--amp', choices=['none', 'bf16', 'fp16'], default='none')
    parser.add_argument('--augment', choices=['auto', 'pil', 'batched'], default='auto',
                        help="the whole loop's augmentation path (auto: batched on GPUs, pil on CPUs)")
    parser.add_argument('--compare-step', action='store_true',
                        help='also time the model step with each step option alone against the plain step')
    parser.add_argument('--json', action='store_true', help='print the figures as one JSON object')
    args = parser.parse_args(argv)
    args.device = device_name(args.device)  # a GPU that is not there is a one-line error
    return args


def synthetic_imagenet(root: Path, images: int, classes: int = 4, seed: int = 0) -> Path:
    """ImageNet-like JPEGs: 500x375 (ImageNet's typical size), quality 90, smooth shapes with grain."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:375, 0:500]
    for split, count in (('train', images), ('val', classes)):
        for i in range(count):
            folder = root / split / f'n{i % classes:08d}'
            folder.mkdir(parents=True, exist_ok=True)
            fx, fy, phase = rng.uniform(5, 40, 3)
            rgb = np.stack([128 + 90 * np.sin(x / fx + phase * c) * np.cos(y / fy - c) for c in range(3)], -1)
            rgb += rng.normal(0, 12, rgb.shape)
            Image.fromarray(np.uint8(np.clip(rgb, 0, 255))).save(folder / f'{i:05d}.JPEG', quality=90)
    return root


def synthetic_labels(data: Path, output: Path, device: torch.device) -> Path:
    """A token-label store of a random-weight annotator (made on `device`): 14x14 top-5 maps."""
    annotator = output.parent / 'annotator.pth'
    torch.manual_seed(0)
    torch.save(timm.create_model('resnet10t', num_classes=len(find_classes(data / 'train'))).state_dict(),
               annotator)
    generate_token_labels(data, 'resnet10t', output, DistInfo(device=device), checkpoint=str(annotator), img_size=448,
                          topk=5, workers=0)
    return output


@contextlib.contextmanager
def torch_threads(count: int):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def pipeline_images_per_second(loader: Iterable[dict], device_tf, info: DistInfo, batches: int) -> float:
    """Batches through the loader (and the device's half) to model input on the device; the first is not timed."""
    iterator = iter(loader)
    model_input(next(iterator), info, device_tf)
    synchronize(info.device)
    started, images = time.perf_counter(), 0
    for batch in itertools.islice(iterator, batches):
        x = model_input(batch, info, device_tf)
        images += x.shape[0]
    synchronize(info.device)
    return images / (time.perf_counter() - started)


class Setup:
    """One model's training pieces, as `classification.train` builds them."""

    def __init__(self, model_name: str, data: ImageData, args: argparse.Namespace, info: DistInfo) -> None:
        self.name, self.data, self.args, self.info = model_name, data, args, info
        self.recipe = recipe_for(model_name)
        self.recipe.batch_size = args.batch_size
        self.data_cfg = model_data_config(model_name)
        self.recipe.img_size = self.data_cfg['input_size'][-1]
        self.store = TokenLabelStore(data.token_labels) if self.recipe.uses_score_maps else None

    def loaders(self, augment: str, workers: int):
        """(training loader, the device's half of the augmentation or None)."""
        options = RunOptions(Path('unused'), workers=workers, seed=0)
        train_loader, _, classes, device_tf = make_loaders(self.data, self.store, self.recipe, self.data_cfg, self.info,
                                                           options, augment)
        self.num_classes = len(classes)
        return train_loader, device_tf

    def step_pieces(self, fused: bool = True, channels_last: bool = True, compile: bool = False):
        """(model, objective, step state) as the trainer builds them, with the given step options."""
        torch.manual_seed(0)
        r = self.recipe
        model = create_classifier(self.name, self.num_classes, r.img_size, r.token_labeling, r.mix_token,
                                  drop_path_rate=r.drop_path).to(self.info.device)
        if channels_last:
            use_channels_last(model)
        state, _ = optimization_state(model, model, r.optimization(r.batch_size), 1000, self.args.amp)
        if not fused:
            for group in state.optimizer.param_groups:
                group['fused'] = None
        if compile:
            model.compile()
        return model, make_objective(r, self.num_classes), state


def step_images_per_second(setup: Setup, batch: dict, variants: dict[str, tuple], batches: int,
                           repeats: int) -> dict[str, float]:
    """The training step alone (the token targets' building included) on one batch already on the device, for each
    variant (step options, amp): the median of `repeats` timings of `batches` steps, the variants interleaved so
    that drift of the machine's speed hits them alike."""
    steps = {}
    for label, (options, amp) in variants.items():
        model, objective, state = setup.step_pieces(**options)
        train_one_epoch(model, [batch] * 2, objective, state, setup.info, amp)  # warm-up (compiles when asked)
        steps[label] = lambda m=model, o=objective, st=state, a=amp: train_one_epoch(
            m, [batch] * batches, o, st, setup.info, a)
    timings = {label: [] for label in variants}
    for _ in range(repeats):
        for label, step in steps.items():
            timings[label].append(seconds_per_call(step, 1, 0))
    return {label: batches * batch['label'].shape[0] / float(np.median(t)) for label, t in timings.items()}


def device_batch(setup: Setup, augment: str) -> dict:
    """One training batch with its images as model input, everything on the device (read in this process: no
    loader workers left running beside the step timings)."""
    loader, device_tf = setup.loaders(augment, workers=0)
    info = setup.info
    batch = next(iter(loader))
    batch['image'] = model_input(batch, info, device_tf)
    for key in ('label', 'scores', 'classes'):
        if key in batch:
            batch[key] = batch[key].to(info.device)
    return batch


def benchmark_model(model_name: str, data: ImageData, args: argparse.Namespace) -> dict[str, object]:
    info = DistInfo(device=torch.device(args.device))
    setup = Setup(model_name, data, args, info)
    figures: dict[str, object] = {'model': model_name, 'token_labeling': setup.recipe.uses_score_maps,
                                  'batch_size': args.batch_size, 'img_size': setup.recipe.img_size}
    per_core = {}
    with torch_threads(1):
        for path in ('pil', 'batched'):
            loader, device_tf = setup.loaders(path, workers=0)
            per_core[path] = pipeline_images_per_second(loader, device_tf, info, args.batches)
        loader, _ = setup.loaders('batched', workers=0)
        per_core['batched_workers_half'] = workers_half_images_per_second(loader, args.batches)
    per_core['batched_over_pil'] = per_core['batched'] / per_core['pil']
    figures['pipeline_per_core_img_s'] = per_core
    with_workers = {}
    for path in ('pil', 'batched'):
        loader, device_tf = setup.loaders(path, args.workers)
        with_workers[path] = pipeline_images_per_second(loader, device_tf, info, args.batches)
    figures[f'pipeline_{args.workers}_workers_img_s'] = with_workers
    loop_path = pick_augment(args.augment, info.device)
    batch = device_batch(setup, loop_path)
    trainer_step = {'trainer': (dict(fused=True, channels_last=True, compile=False), args.amp)}
    steps = step_images_per_second(setup, batch, {**trainer_step, **(step_variants() if args.compare_step else {})},
                                   args.batches, args.repeats)
    step = figures['model_step_img_s'] = steps['trainer']
    if args.compare_step:
        figures['step_options'] = {**{f'{k}_img_s': v for k, v in steps.items() if k != 'trainer'},
                                   **{f'{k}_ratio': steps[k] / steps['plain'] for k in STEP_OPTIONS}}
    loader, device_tf = setup.loaders(loop_path, args.workers)
    model, objective, state = setup.step_pieces()
    loop = loop_images_per_second(model, loader, objective, state, info, args, device_tf)
    figures['loop'] = {'augment': loop_path, 'img_s': loop}
    pipeline = with_workers[loop_path]
    figures['bound'] = 'input pipeline' if pipeline < step else 'model step'
    return figures


def workers_half_images_per_second(loader: Iterable[dict], batches: int) -> float:
    """The batched path's loader alone: decode, cut regions, collate (what the CPU cores do for a GPU)."""
    iterator = iter(loader)
    next(iterator)
    started = time.perf_counter()
    images = sum(len(batch['label']) for batch in itertools.islice(iterator, batches))
    return images / (time.perf_counter() - started)


def loop_images_per_second(model, loader, objective, state: StepState, info: DistInfo, args, device_tf) -> float:
    """`train_one_epoch` over `--batches` batches of the real loader, after one untimed batch."""
    iterator = iter(loader)
    train_one_epoch(model, itertools.islice(iterator, 1), objective, state, info, args.amp, transform=device_tf)
    synchronize(info.device)
    started = time.perf_counter()
    train_one_epoch(model, itertools.islice(iterator, args.batches), objective, state, info, args.amp,
                    transform=device_tf)
    synchronize(info.device)
    return args.batches * args.batch_size / (time.perf_counter() - started)


def step_variants() -> dict[str, tuple]:
    """The step with none of the trainer's step options, then with each alone: (options, amp)."""
    plain = dict(fused=False, channels_last=False, compile=False)
    return {'plain': (plain, 'none'), 'fused_optimizer': ({**plain, 'fused': True}, 'none'),
            'channels_last': ({**plain, 'channels_last': True}, 'none'), 'bf16': (plain, 'bf16'),
            'compile': ({**plain, 'compile': True}, 'none')}


def describe(f: dict[str, object], workers: int) -> list[str]:
    core, pool = f['pipeline_per_core_img_s'], f[f'pipeline_{workers}_workers_img_s']
    lines = [f"{f['model']}  batch {f['batch_size']}  {f['img_size']} px  token labeling {f['token_labeling']}",
             f"  input pipeline, 1 core:      pil {core['pil']:7.1f} img/s   batched {core['batched']:7.1f} img/s "
             f"(x{core['batched_over_pil']:.2f}; its workers' half alone {core['batched_workers_half']:7.1f} img/s)",
             f"  input pipeline, {workers} workers:   pil {pool['pil']:7.1f} img/s   batched "
             f"{pool['batched']:7.1f} img/s",
             f"  model step:                  {f['model_step_img_s']:7.1f} img/s",
             f"  whole loop ({f['loop']['augment']}):           {f['loop']['img_s']:7.1f} img/s   bound by the "
             f"{f['bound']}"]
    if 'step_options' in f:
        o = f['step_options']
        lines.append(f"  step options alone vs plain step ({o['plain_img_s']:.1f} img/s): "
                     + ', '.join(f"{k} x{o[k + '_ratio']:.2f}" for k in STEP_OPTIONS))
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.json:
        show_log(stream=sys.stderr)  # standard output is the JSON document
    pick_amp(args.amp, torch.device(args.device))  # and so is fp16 on a CPU
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.data_dir) if args.data_dir else synthetic_imagenet(Path(tmp) / 'data', args.images)
        labels = Path(args.token_label_dir) if args.token_label_dir else None
        if labels is None and any(recipe_for(m).uses_score_maps for m in args.models):
            labels = synthetic_labels(root, Path(tmp) / 'labels', torch.device(args.device))
        data = ImageData(root, labels)
        results = [benchmark_model(name, data, args) for name in args.models]
    if args.json:
        print(json.dumps({'device': args.device, 'amp': args.amp, 'workers': args.workers, 'models': results}))
        return 0
    print(f'{args.device}  amp {args.amp}  {torch.get_num_threads()} threads  {args.batches} timed batches per stage')
    for figures in results:
        print('\n'.join(describe(figures, args.workers)))
    return 0


if __name__ == '__main__':
    run_command(main)
