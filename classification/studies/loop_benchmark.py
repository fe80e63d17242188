"""Images/s of each stage of the real training loop in its steady state, beside its physical ceiling, and the
stage that bounds it (tools/benchmark_loop.py)."""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import timm
import torch
from PIL import Image
from timm.data import ImageDataset, create_transform
from torch.utils.data import DataLoader

from backbones.common.cli import (
    SAME_WORK_EVERYWHERE,
    add_workers_argument,
    command_parser,
    non_negative_float,
    positive_float,
    positive_int,
)
from backbones.common.commands import write_document
from backbones.common.devices import (
    TIMED_IN_FP32,
    add_amp_argument,
    add_device_argument,
    device_name,
    pick_amp,
    torch_threads,
)
from backbones.common.distributed import DistInfo
from backbones.common.errors import UsageError
from backbones.common.images import find_classes, scan_split
from backbones.common.jpeg import pillow_only
from backbones.common.log import logger, show_log
from backbones.common.random_state import seed_all
from backbones.complexity import measure_complexity
from classification.engine.prefetch import DEPTH, tensors_in
from classification.engine.steps import PassOptions, model_input, train_one_epoch
from classification.engine.trainer import RunOptions, StepOptions, training_state
from classification.loaders import DECODE_CHOICES, ImageData, check_decode, make_loaders, pick_augment
from classification.models import model_data_config
from classification.recipes import recipe_for
from classification.studies.launcher import LaunchedCommand, tool_command, update_of_timm_line
from classification.studies.results_file import results_document
from classification.studies.timing import SteadyWindow, available_cores
from classification.token_labeling.annotate import GENERATION_SHAPING, generate_token_labels
from classification.token_labeling.label_store import StoreRows, TokenLabelStore, list_digest, write_label_store
from classification.training_pieces import training_pieces

MODELS = ('lvvit_s', 'deit_small_patch16_224')
STEP_OPTIONS = ('fused_optimizer', 'channels_last', 'bf16', 'compile')
DISTINCT_IMAGES = 64  # distinct synthetic JPEGs; the other entries are hard links to them
PREFETCH_FACTOR = 2  # torch's DataLoader default, which the training loaders keep
CPU_MIN_BATCHES = 4  # the fewest batches of a window on a CPU (its steps take seconds) and of one core's pipeline
HELP_SECONDS = 300  # the longest timm's train.py --help may take (its imports on a cold disk)
TOLERANCE = 1.1  # separate windows of a noisy machine: a figure this far above its ceiling is an error
TRAIN_FLOPS_PER_MAC = 6  # a training step: the forward's 2 FLOPs per MAC, the backward's 4 (the usual MFU count)
# dense bf16/fp16 tensor-core peaks, TFLOP/s (NVIDIA's data sheets), by the device's name; the first match counts
HALF_PRECISION_PEAKS = (('H100 PCIe', 756.0), ('H100 NVL', 835.0), ('H100', 989.4), ('H200', 989.4),
                        ('A100', 312.0))
# the per-core figures' ratios: name -> (numerator, denominator)
PER_CORE_RATIOS = {'batched_over_pil': ('batched', 'pil'), 'workers_half_over_timm': ('batched_workers_half', 'timm'),
                   'pil_over_timm': ('pil', 'timm'), 'workers_half_over_pil': ('batched_workers_half', 'pil'),
                   'pillow_decode_workers_half_over_timm': ('batched_workers_half_pillow_decode', 'timm'),
                   'pillow_decode_pil_over_timm': ('pil_pillow_decode', 'timm'),
                   'simplejpeg_gain_workers_half': ('batched_workers_half', 'batched_workers_half_pillow_decode'),
                   'simplejpeg_gain_pil': ('pil', 'pil_pillow_decode')}


def parse_args(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    parser = command_parser(description, 'benchmark_loop.py')
    parser.add_argument('--models', nargs='+', default=list(MODELS),
                        help='models, each with its own recipe (token labeling for LV-ViT)')
    parser.add_argument('--data-dir', help='an ImageNet-layout folder (default: synthetic JPEGs)')
    parser.add_argument('--token-label-dir', help="--data-dir's token-label store (default: the synthetic data's)")
    parser.add_argument('--images', type=positive_int, default=16384,
                        help='synthetic training entries (64 distinct JPEGs, the rest hard links)')
    parser.add_argument('--batch-size', type=positive_int, default=16, help='images per batch')
    parser.add_argument('--seconds', type=non_negative_float, default=30.0,
                        help='the least time each stage is timed, after its warm-up')
    parser.add_argument('--min-batches', type=positive_int,
                        help='the fewest batches each stage is timed (default: 200 on a GPU, 4 on a CPU)')
    add_workers_argument(parser, 2, SAME_WORK_EVERYWHERE, least=1)
    add_device_argument(parser)
    add_amp_argument(parser, 'none', TIMED_IN_FP32, ('none', 'bf16', 'fp16'))
    parser.add_argument('--augment', choices=['auto', 'pil', 'batched'], default='auto',
                        help="the whole loop's augmentation path (auto: batched on GPUs, pil on CPUs)")
    parser.add_argument('--decode', choices=DECODE_CHOICES, default='cpu',
                        help="where the batched path's JPEGs are decoded (gpu: by the device half, with nvJPEG)")
    parser.add_argument('--compile', action='store_true',
                        help='the step, the loop and train_cls with torch.compile (compiled in the warm-up)')
    parser.add_argument('--compare-step', action='store_true',
                        help='also time the model step with each step option alone against the plain step')
    parser.add_argument('--compare-loop', action='store_true',
                        help='also time the serial loop (train_cls --serial-loop) against the overlapped one')
    parser.add_argument('--train-cls', action='store_true',
                        help='also time a real train_cls.py run on the data, from its update lines')
    parser.add_argument('--skip-updates', type=positive_int, default=50,
                        help="train_cls's updates left out of its timing (start-up and the loader's prefetch)")
    parser.add_argument('--timm-train', metavar='TRAIN_PY',
                        help="timm's own train.py (from its repository): also time it beside train_cls on each model "
                             'without token labeling')
    parser.add_argument('--timm-args', nargs='*', default=[], metavar='ARG',
                        help="more arguments for timm's train.py, e.g. --channels-last (after the recipe's)")
    parser.add_argument('--peak-tflops', type=positive_float,
                        help="the device's peak TFLOP/s for the step's MFU (default: H100's, H200's, A100's in bf16)")
    parser.add_argument('--per-core-only', action='store_true',
                        help='time the input pipelines per core alone, not the workers, the step or the loop')
    parser.add_argument('--json', action='store_true', help='print the figures as one JSON object')
    args = parser.parse_args(argv)
    args.device = device_name(args.device)  # a GPU that is not there is a one-line error
    check_decode(args.decode, 'batched', torch.device(args.device))
    if args.timm_train:
        check_timm_train(args)
    if args.min_batches is None:
        args.min_batches = 200 if args.device == 'cuda' else CPU_MIN_BATCHES
    return args


def synthetic_imagenet(root: Path, images: int, classes: int = 4, seed: int = 0) -> Path:
    """ImageNet-like 500x375 JPEGs (quality 90, smooth shapes with grain); the training entries after the first
    DISTINCT_IMAGES are hard links to them (`source_entry`), entry n of class n mod `classes`."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:375, 0:500]
    for split, count in (('train', images), ('val', classes)):
        for i in range(count):
            folder = root / split / f'n{i % classes:08d}'
            folder.mkdir(parents=True, exist_ok=True)
            if split == 'train' and i >= DISTINCT_IMAGES:
                (folder / f'{i:05d}.JPEG').hardlink_to(root / source_entry(i, classes))
                continue
            fx, fy, phase = rng.uniform(5, 40, 3)
            rgb = np.stack([128 + 90 * np.sin(x / fx + phase * c) * np.cos(y / fy - c) for c in range(3)], -1)
            rgb += rng.normal(0, 12, rgb.shape)
            Image.fromarray(np.uint8(np.clip(rgb, 0, 255))).save(folder / f'{i:05d}.JPEG', quality=90)
    return root


def source_entry(i: int, classes: int = 4) -> str:
    """The distinct training JPEG that synthetic entry `i` is a link to, or is (relative to the data folder)."""
    source = i % DISTINCT_IMAGES
    return f'train/n{source % classes:08d}/{source:05d}.JPEG'


def synthetic_labels(data: Path, output: Path, device: torch.device) -> Path:
    """A token-label store for the synthetic set: a random annotator's maps of the distinct JPEGs, shared by links."""
    tmp = output.parent
    distinct = tmp / 'distinct'
    for path in sorted({source_entry(i) for i in range(DISTINCT_IMAGES)}):
        (distinct / path).parent.mkdir(parents=True, exist_ok=True)
        (distinct / path).hardlink_to(data / path)
    annotator = tmp / 'annotator.pth'
    seed_all(0)
    torch.save(timm.create_model('resnet10t', num_classes=len(find_classes(data / 'train'))).state_dict(),
               annotator)
    meta = generate_token_labels(distinct, 'resnet10t', tmp / 'distinct_labels', DistInfo(device=device),
                                 checkpoint=str(annotator), img_size=448, topk=5, workers=0)
    source = TokenLabelStore(tmp / 'distinct_labels')
    paths = [path for path, _ in scan_split(data, 'train')[1]]
    rows = source.rows_of([source_entry(int(Path(path).stem)) for path in paths])

    def shard_rows(start: int, stop: int) -> Iterator[StoreRows]:
        yield StoreRows(np.arange(start, stop), tuple(array[rows[start:stop]] for array in source.arrays()))

    write_label_store(output, {**meta, 'paths_sha256': list_digest(paths)}, paths, GENERATION_SHAPING, DistInfo(),
                      shard_rows)
    return output


def endless(loader: Iterable[dict]) -> Iterator[dict]:
    """The loader's batches epoch after epoch (each epoch starts its workers again, as in training)."""
    while True:
        yield from loader


class BenchedModel:
    """One model under the benchmark: its recipe at the benchmark's batch, data and store, its timing windows."""

    def __init__(self, model_name: str, data: ImageData, args: argparse.Namespace, info: DistInfo) -> None:
        self.name, self.data, self.args, self.info = model_name, data, args, info
        self.data_cfg = model_data_config(model_name)
        self.recipe = replace(recipe_for(model_name), batch_size=args.batch_size,
                              img_size=self.data_cfg['input_size'][-1])
        self.store = TokenLabelStore(data.token_labels) if self.recipe.uses_score_maps else None

    def window(self, workers: int, min_batches: int | None = None) -> SteadyWindow:
        """A window of at least `min_batches` past the workers' prefetch and the loop's prefetcher (DEPTH + 1
        batches, trained uncounted in the window: a loop's figure errs low by at most that many)."""
        return SteadyWindow(self.args.seconds, min_batches or self.args.min_batches,
                            workers * PREFETCH_FACTOR + 2 + DEPTH + 1, self.info.device)

    def loaders(self, augment: str, workers: int):
        """(training loader, the device half of the augmentation or None)."""
        options = RunOptions(Path('unused'), workers=workers, seed=0)
        train_loader, _, classes, device_tf = make_loaders(self.data, self.store, self.recipe, self.data_cfg, self.info,
                                                           options, augment, self.args.decode)
        self.num_classes, self.updates_per_epoch = len(classes), len(train_loader)
        return train_loader, device_tf

    def step_pieces(self, options: StepOptions, amp: str, preset: str | None = None):
        """(model, objective, step state) as a training run builds them (`preset` over the model's recipe)."""
        r = self.recipe if preset is None else recipe_for(self.name, preset)
        model, objective = training_pieces(self.name, r, self.num_classes, 0, self.info)
        state, _ = training_state(model, model, r.optimization(r.batch_size), 1000, amp, self.info.device, options)
        return model, objective, state


def reported(images_per_second: float, bench: BenchedModel, stage: str) -> float:
    """Logs a stage's figure as soon as it is measured (a run stopped by a time limit keeps what it measured)."""
    logger.info(f'{bench.name}: {stage}: {images_per_second:.1f} img/s')
    return images_per_second


def pipeline_images_per_second(bench: BenchedModel, augment: str, workers: int, with_device_half: bool = True,
                               sizes: dict[str, float] | None = None) -> float:
    """Batches through the loader (and `with_device_half`); the bytes per image the workers send into `sizes`."""
    loader, device_tf = bench.loaders(augment, workers)
    # --min-batches is for the GPU's short steps: one core's pipeline makes 200 batches of 256 in minutes, not seconds
    window = bench.window(workers, min_batches=CPU_MIN_BATCHES if workers == 0 else None)
    for batch in window.batches(endless(loader)):
        if sizes is not None and augment not in sizes:
            sizes[augment] = tensor_bytes(batch) / len(batch['label'])
        if with_device_half:
            model_input(batch, bench.info, device_tf)
    return reported(window.images_per_second(), bench, f'input pipeline, {augment} path, {workers} workers'
                    + ('' if with_device_half else " (the workers' half alone)"))


def timm_pipeline_images_per_second(bench: BenchedModel, sizes: dict[str, float]) -> float:
    """timm's own input pipeline (create_transform, ImageDataset, timm's collation) in this process."""
    r, config = bench.recipe, bench.data_cfg
    transform = create_transform(r.img_size, is_training=True, scale=(r.scale_min, 1.0), hflip=r.hflip,
                                 auto_augment=r.auto_augment.replace('-inc1', '') if r.auto_augment else None,
                                 interpolation=r.interpolation, mean=config['mean'], std=config['std'],
                                 re_prob=r.reprob, re_mode='pixel')
    loader = DataLoader(ImageDataset(str(Path(bench.data.root) / 'train'), transform=transform),
                        batch_size=bench.args.batch_size, shuffle=True, drop_last=True)
    window = bench.window(0, min_batches=CPU_MIN_BATCHES)
    for batch in window.batches({'image': images, 'label': labels} for images, labels in endless(loader)):
        sizes.setdefault('timm', tensor_bytes(batch) / len(batch['label']))
    return reported(window.images_per_second(), bench, "timm's create_transform, 0 workers")


def tensor_bytes(value: object) -> int:
    """The bytes of the tensors in a batch (`tensors_in`: the batched path's packed regions and plans too)."""
    return sum(t.numel() * t.element_size() for t in tensors_in(value))


def compiled_graphs() -> int:
    """The graphs torch.compile has made in this process so far."""
    return torch._dynamo.utils.counters['stats']['unique_graphs']


class Timed(NamedTuple):
    images_per_second: float
    compiled_in_window: int  # graphs compiled after the warm-up: the figure includes their compilation
    data_wait: float | None = None  # the training pass's share of time waiting for batches (its warm-up included)


def timed_training(window: SteadyWindow, source: Iterable[dict], train: Callable[[Iterable[dict]], object]) -> Timed:
    """`train` over `window.batches(source)`, counting the graphs compiled once the window's clock has started."""
    at_start = []

    def batches() -> Iterator[dict]:
        for batch in window.batches(source):
            if not at_start and window.started is not None:
                at_start.append(compiled_graphs())
            yield batch

    trained = train(batches())
    rate = window.images_per_second()
    return Timed(rate, compiled_graphs() - at_start[0] if at_start else 0, getattr(trained, 'data_wait', None))


def report_compiled(timed: Timed, bench: BenchedModel, stage: str) -> Timed:
    if timed.compiled_in_window:
        logger.warning(f'{bench.name}: {stage}: {timed.compiled_in_window} graph(s) compiled inside the timing window, '
                       f'after the warm-up: the figure includes compilation (the step recompiles in its steady state)')
    reported(timed.images_per_second, bench, stage)
    return timed


def step_images_per_second(bench: BenchedModel, batch: dict, options: StepOptions, amp: str,
                           preset: str | None = None, pieces: tuple | None = None) -> Timed:
    """The training step alone (with the token targets' building) on one batch on the device, with `pieces`."""
    model, objective, state = pieces or bench.step_pieces(options, amp, preset)
    window = bench.window(0)  # (a recipe without token labeling leaves the batch's maps unread)
    timed = timed_training(window, itertools.repeat(batch),
                           lambda batches: train_one_epoch(model, batches, objective, state, bench.info,
                                                           PassOptions(amp)))
    return report_compiled(timed, bench, f'model step {options} amp {amp}' + (f' ({preset} recipe)' if preset else ''))


def loop_images_per_second(bench: BenchedModel, augment: str, options: StepOptions, overlap: bool = True,
                           pieces: tuple | None = None) -> Timed:
    """`train_one_epoch` over the real loader, epoch after epoch (`overlap`: ahead), with `pieces` (`step_pieces`)."""
    loader, device_tf = bench.loaders(augment, bench.args.workers)
    model, objective, state = pieces or bench.step_pieces(options, bench.args.amp)
    timed = timed_training(bench.window(bench.args.workers), endless(loader),
                           lambda batches: train_one_epoch(model, batches, objective, state, bench.info, PassOptions(
                               bench.args.amp, transform=device_tf, overlap=overlap)))
    order = 'overlapped' if overlap else 'serial'
    return report_compiled(timed, bench, f'whole loop, {augment} path, {order}'
                           + (', compiled' if options.compile else ''))


def train_cls_images_per_second(bench: BenchedModel, augment: str, output: Path) -> dict[str, float | int]:
    """`tools/train_cls.py` itself on the benched model and data, one update line per update (`timed_updates`)."""
    model_name, data, args = bench.name, bench.data, bench.args
    options = [model_name, '--data-dir', data.root, '--output', output, '--epochs', '1000', '--batch-size',
               args.batch_size, '--workers', args.workers, '--device', args.device, '--amp', args.amp, '--augment',
               augment, '--log-interval', '1', '--pictures', '0',
               *(['--decode', args.decode] if augment == 'batched' else []), *(['--compile'] if args.compile else [])]
    if data.token_labels is not None and recipe_for(model_name).uses_score_maps:
        options += ['--token-label-dir', data.token_labels]
    return timed_updates(LaunchedCommand(tool_command('train_cls', options)), bench)


def timm_train_command(script: Path, model_name: str, num_classes: int, data_root: Path, output: Path,
                       args: argparse.Namespace) -> list[str]:
    """timm's own train.py with train_cls's recipe, batch, workers, device and precision, logging every update."""
    r = recipe_for(model_name)
    amp = {'bf16': ['--amp', '--amp-dtype', 'bfloat16'], 'fp16': ['--amp'], 'none': []}[args.amp]
    # the script where it was given: the commands run in the checkout
    command = [sys.executable, str(script.resolve()), '--data-dir', str(data_root), '--model', model_name,
               '--num-classes', str(num_classes), '-b', str(args.batch_size), '-j', str(args.workers),
               '--device', args.device, *amp, '--epochs', '1000', '--opt', r.opt,
               '--lr', str(r.lr_base * args.batch_size / r.lr_base_batch), '--weight-decay', str(r.weight_decay),
               '--sched', 'cosine', '--warmup-epochs', str(r.warmup_epochs), '--warmup-lr', str(r.warmup_lr),
               '--min-lr', str(r.min_lr), '--reprob', str(r.reprob), '--remode', 'pixel',
               '--mixup', str(r.mixup), '--cutmix', str(r.cutmix), '--smoothing', str(r.smoothing),
               '--drop-path', str(r.drop_path), '--train-interpolation', r.interpolation, '--pin-mem',
               '--log-interval', '1', '--output', str(output)]
    # timm's increasing Posterize reaches 0 bits, which Pillow 12 refuses: its train.py stops with 'bits must be
    # between or equal to 1 and 8' at the first such draw. The policy without 'inc' has the same ops at the same cost.
    command += ['--aa', r.auto_augment.replace('-inc1', '')] if r.auto_augment else []
    command += ['--model-ema', '--model-ema-decay', str(r.ema_decay)] if r.ema_decay else []
    return [*command, *args.timm_args]


def check_timm_train(args: argparse.Namespace) -> None:
    """Before any timing: `--timm-train` is a file with a model to run, taking every option the comparison passes."""
    if not Path(args.timm_train).is_file():
        raise UsageError(f'--timm-train {args.timm_train}: no such file (timm\'s train.py, from a clone of '
                         f'https://github.com/huggingface/pytorch-image-models at the installed timm\'s version)')
    plain = [m for m in args.models if not recipe_for(m).token_labeling]
    if not plain:
        raise UsageError(f"--timm-train: timm's train.py runs the models without token labeling, and --models gives "
                         f"only token-labeling ones ({', '.join(args.models)}); add e.g. deit_small_patch16_224")
    command = timm_train_command(Path(args.timm_train), plain[0], 1000, Path('data'), Path('out'), args)
    wanted = sorted({a for a in command[2:] if a.startswith('--')} - set(args.timm_args))
    script = command[1]  # as the run starts it
    with LaunchedCommand([sys.executable, script, '--help'], f'--timm-train {args.timm_train}',
                         limit=HELP_SECONDS) as shown:
        status = shown.wait()
    missing = [option for option in wanted if option not in '\n'.join(shown.log)]
    if status != 0 or missing:
        last = ([line for line in shown.log if line.strip()] or ['(no message)'])[-1].strip()
        why = (f'its --help did not end in {HELP_SECONDS} s' if status is None else f'its --help failed: {last}'
               if status != 0 else f"it takes no {', '.join(missing)}")
        raise UsageError(f"--timm-train {args.timm_train}: not timm's train.py ({why}); give train.py from a clone of "
                         f"https://github.com/huggingface/pytorch-image-models at the installed timm's version")


def timed_updates(run: LaunchedCommand, bench: BenchedModel) -> dict[str, float | int]:
    """Images/s of a training run's update lines in a window after `--skip-updates`; then the run is stopped."""
    args = bench.args
    window = SteadyWindow(args.seconds, args.min_batches, max(args.skip_updates, args.workers * PREFETCH_FACTOR + 2))
    with run:
        rate, updates = run.steady_rate(window, args.batch_size, bench.updates_per_epoch,  # as the loaders listed it
                                        'give more --images, or fewer --skip-updates or --min-batches')
    return {'img_s': reported(rate, bench, run.name), 'updates_timed': updates, 'after_updates': window.first}


def device_batch(bench: BenchedModel, augment: str) -> dict:
    """One training batch as model input on the device (read in this process: no workers beside the step timings)."""
    loader, device_tf = bench.loaders(augment, workers=0)
    batch = next(iter(loader))
    batch['image'] = model_input(batch, bench.info, device_tf)
    on_device = {key: batch[key].to(bench.info.device) for key in ('label', 'scores', 'classes') if key in batch}
    return {**batch, **on_device}


def peak_tflops(args: argparse.Namespace) -> float | None:
    """The device's peak for the step's precision: `--peak-tflops`, or the known half-precision peak of the GPU."""
    if args.peak_tflops or args.device != 'cuda' or args.amp == 'none':
        return args.peak_tflops
    name = torch.cuda.get_device_name()
    return next((peak for key, peak in HALF_PRECISION_PEAKS if key in name), None)


def step_flops(bench: BenchedModel, images_per_second: float, peak: float | None) -> dict[str, float | None]:
    """The training step's FLOPs per image (6 per forward MAC), its TFLOP/s and its share of `peak` (MFU)."""
    macs = measure_complexity(bench.name, bench.recipe.img_size, num_classes=bench.num_classes).macs
    per_image = TRAIN_FLOPS_PER_MAC * macs
    achieved = per_image * images_per_second / 1e12
    return {'per_image_gflop': per_image / 1e9, 'tflop_s': achieved, 'peak_tflop_s': peak,
            'mfu': achieved / peak if peak else None}


def pipeline_ceilings(per_core: dict[str, float], workers: int, cores: int, device: str) -> dict[str, float]:
    """Images/s that `workers` loader processes cannot beat on `cores` cores: the one-core rate times the workers that
    run at once; on a CPU device, also the whole batched path's one-core rate."""
    busy = min(workers, cores)
    workers_half = busy * per_core['batched_workers_half']  # also bounds any pipeline that does more per image
    batched = min(workers_half, cores * per_core['batched']) if device == 'cpu' else workers_half
    return {'pil': busy * per_core['pil'], 'batched': batched, 'workers_half': workers_half}


def measurement_errors(f: dict[str, object], workers: int) -> list[str]:
    """The figures more than TOLERANCE above their bounds (ceiling, peak, the slower of pipeline and step)."""
    pool, ceiling = f[f'pipeline_{workers}_workers_img_s'], f[f'pipeline_{workers}_workers_ceiling_img_s']
    errors = [f'the {workers}-worker {path} pipeline\'s {pool[path]:.1f} img/s is above its ceiling of '
              f'{ceiling[path]:.1f}' for path in ('pil', 'batched') if pool[path] > TOLERANCE * ceiling[path]]
    loop = f['loop']
    stages = min(pool[loop['augment']], f['model_step_img_s'])
    mfu = f.get('step_flops', {}).get('mfu')
    if mfu is not None and mfu > 1:
        errors.append(f"the step's {f['step_flops']['tflop_s']:.1f} TFLOP/s is above the device's peak of "
                      f"{f['step_flops']['peak_tflop_s']:g}")
    for what, rate in (("the whole loop's", loop['img_s']), ("the serial loop's", loop.get('serial_img_s')),
                       ("train_cls's", f.get('train_cls', {}).get('img_s'))):
        if rate is not None and rate > TOLERANCE * stages:
            errors.append(f'{what} {rate:.1f} img/s is above the slower of its input pipeline and its step, '
                          f'{stages:.1f}')
    errors += [f'the {stage} compiled {n} graph(s) inside its timing window: its figure includes compilation'
               for stage, n in f.get('compiled_in_window', {}).items()]
    timm_rate = f.get('timm_train', {}).get('img_s')
    if timm_rate is not None and timm_rate > TOLERANCE * ceiling['workers_half']:
        errors.append(f"timm's train.py's {timm_rate:.1f} img/s is above what {workers} workers can decode and "
                      f"draw, {ceiling['workers_half']:.1f} (the batched path's workers' half, which does less)")
    return errors


def benchmark_model(model_name: str, data: ImageData, args: argparse.Namespace) -> dict[str, object]:
    info = DistInfo(device=torch.device(args.device))
    bench = BenchedModel(model_name, data, args, info)
    figures: dict[str, object] = {'model': model_name, 'token_labeling': bench.recipe.uses_score_maps,
                                  'batch_size': args.batch_size, 'img_size': bench.recipe.img_size}
    sizes: dict[str, float] = {}
    figures['pipeline_per_core_img_s'] = per_core = per_core_images_per_second(bench, sizes)
    figures['bytes_per_image'] = sizes
    figures['kib_per_image'] = {path: size / 1024 for path, size in sizes.items()}
    if args.per_core_only:
        return {**figures, 'measurement_errors': []}
    figures[f'pipeline_{args.workers}_workers_img_s'] = pool = {
        path: pipeline_images_per_second(bench, path, args.workers) for path in ('pil', 'batched')}
    figures[f'pipeline_{args.workers}_workers_ceiling_img_s'] = ceiling = pipeline_ceilings(
        per_core, args.workers, available_cores(), args.device)
    figures[f'pipeline_{args.workers}_workers_over_ceiling'] = {path: pool[path] / ceiling[path] for path in pool}
    loop_path = pick_augment(args.augment, info.device)
    batch = device_batch(bench, loop_path)
    trainer = StepOptions(compile=args.compile)
    variants = {'trainer': (trainer, args.amp, None)}
    if args.compare_step:
        variants.update(step_variants())
        if bench.recipe.token_labeling:  # what token labeling costs: the same model's step in the Standard recipe
            variants['standard'] = (StepOptions(), args.amp, 'standard')
    timed_steps = {label: step_images_per_second(bench, batch, *variant) for label, variant in variants.items()}
    steps = {label: timed.images_per_second for label, timed in timed_steps.items()}
    step = figures['model_step_img_s'] = steps['trainer']
    figures['compiled'] = args.compile
    compiled_in_window = {f'step {label}': t.compiled_in_window for label, t in timed_steps.items()}
    figures['step_flops'] = step_flops(bench, step, peak_tflops(args))
    if args.compare_step:
        figures['step_options'] = {**{f'{k}_img_s': v for k, v in steps.items() if k != 'trainer'},
                                   **{f'{k}_ratio': steps[k] / steps['plain'] for k in STEP_OPTIONS}}
        if 'standard' in steps:
            figures['step_options']['token_labeling_ratio'] = step / steps['standard']
    timed_loop = loop_images_per_second(bench, loop_path, trainer)
    loop = figures['loop'] = {'augment': loop_path, 'img_s': timed_loop.images_per_second}
    loop['of_step'] = loop['img_s'] / step
    compiled_in_window['whole loop'] = timed_loop.compiled_in_window
    if args.compare_loop:
        serial = loop_images_per_second(bench, loop_path, trainer, overlap=False)
        loop['serial_img_s'], compiled_in_window['serial loop'] = serial.images_per_second, serial.compiled_in_window
        loop['overlap_gain'] = loop['img_s'] / loop['serial_img_s']
    figures['compiled_in_window'] = {stage: n for stage, n in compiled_in_window.items() if n}
    against_timm = args.timm_train is not None and not bench.recipe.token_labeling
    if args.train_cls or against_timm:
        with tempfile.TemporaryDirectory() as output:
            figures['train_cls'] = train_cls_images_per_second(bench, loop_path, Path(output))
    if against_timm:
        with tempfile.TemporaryDirectory() as output:
            script = Path(args.timm_train)
            command = timm_train_command(script, bench.name, bench.num_classes, bench.data.root, Path(output), args)
            timm_run = figures['timm_train'] = timed_updates(
                LaunchedCommand(command, f'timm\'s {script.name}', update_of_timm_line), bench)
        timm_run['suite_ratio'] = figures['train_cls']['img_s'] / timm_run['img_s']
    figures['bound'] = 'input pipeline' if pool[loop_path] < step else 'model step'
    figures['measurement_errors'] = measurement_errors(figures, args.workers)
    return figures


def per_core_images_per_second(bench: BenchedModel, sizes: dict[str, float]) -> dict[str, float]:
    """One core's input pipelines (no workers): both paths, the workers' half, timm's, Pillow-only decodes."""
    with torch_threads(1):
        per_core = {path: pipeline_images_per_second(bench, path, 0, sizes=sizes) for path in ('pil', 'batched')}
        per_core['batched_workers_half'] = pipeline_images_per_second(bench, 'batched', 0, with_device_half=False)
        per_core['timm'] = timm_pipeline_images_per_second(bench, sizes)
        with pillow_only():
            per_core['pil_pillow_decode'] = pipeline_images_per_second(bench, 'pil', 0)
            per_core['batched_workers_half_pillow_decode'] = pipeline_images_per_second(bench, 'batched', 0,
                                                                                        with_device_half=False)
    return {**per_core, **{ratio: per_core[a] / per_core[b] for ratio, (a, b) in PER_CORE_RATIOS.items()}}


def step_variants() -> dict[str, tuple[StepOptions, str, None]]:
    """The step with none of the trainer's step options, then with each alone: (options, amp, preset)."""
    plain = StepOptions(fused_optimizer=False, channels_last=False, compile=False)
    return {'plain': (plain, 'none', None), 'fused_optimizer': (replace(plain, fused_optimizer=True), 'none', None),
            'channels_last': (replace(plain, channels_last=True), 'none', None), 'bf16': (plain, 'bf16', None),
            'compile': (replace(plain, compile=True), 'none', None)}


def describe(f: dict[str, object], workers: int) -> list[str]:
    core = f['pipeline_per_core_img_s']
    lines = [f"{f['model']}  batch {f['batch_size']}  {f['img_size']} px  token labeling {f['token_labeling']}"
             + ('  compiled (torch.compile)' if f.get('compiled') else ''),
             f"  input pipeline, 1 core:      pil {core['pil']:7.1f} img/s   batched {core['batched']:7.1f} img/s "
             f"(x{core['batched_over_pil']:.2f}; its workers' half alone {core['batched_workers_half']:7.1f} img/s)",
             f"  timm's create_transform, 1 core: {core['timm']:7.1f} img/s   (the pil path "
             f"x{core['pil_over_timm']:.2f}, the batched workers' half x{core['workers_half_over_timm']:.2f})",
             f"  the same with Pillow's decode alone: pil {core['pil_pillow_decode']:7.1f} img/s "
             f"(x{core['pillow_decode_pil_over_timm']:.2f} timm's), the batched workers' half "
             f"{core['batched_workers_half_pillow_decode']:7.1f} img/s "
             f"(x{core['pillow_decode_workers_half_over_timm']:.2f} timm's); simplejpeg's gain: pil "
             f"x{core['simplejpeg_gain_pil']:.2f}, workers' half x{core['simplejpeg_gain_workers_half']:.2f}",
             '  bytes per image from the workers: ' + '   '.join(f'{path} {size / 1024:,.0f} KiB'
                                                           for path, size in f['bytes_per_image'].items())]
    if 'model_step_img_s' not in f:  # --per-core-only
        return lines
    pool, ceiling = f[f'pipeline_{workers}_workers_img_s'], f[f'pipeline_{workers}_workers_ceiling_img_s']
    lines += [f"  input pipeline, {workers} workers:   pil {pool['pil']:7.1f} img/s (ceiling {ceiling['pil']:.1f})   "
              f"batched {pool['batched']:7.1f} img/s (ceiling {ceiling['batched']:.1f})",
              f"  model step:                  {f['model_step_img_s']:7.1f} img/s   {describe_flops(f['step_flops'])}",
              f"  whole loop ({f['loop']['augment']}):           {f['loop']['img_s']:7.1f} img/s   "
              f"(x{f['loop']['of_step']:.2f} of the step)   bound by the {f['bound']}"]
    if 'serial_img_s' in f['loop']:
        lines.append(f"  whole loop, serial:          {f['loop']['serial_img_s']:7.1f} img/s   (the overlapped loop "
                     f"x{f['loop']['overlap_gain']:.2f})")
    if 'train_cls' in f:
        run = f['train_cls']
        lines.append(f"  tools/train_cls.py:          {run['img_s']:7.1f} img/s   ({run['updates_timed']} updates "
                     f"after its first {run['after_updates']})")
    if 'timm_train' in f:
        run = f['timm_train']
        lines.append(f"  timm's train.py:             {run['img_s']:7.1f} img/s   ({run['updates_timed']} updates "
                     f"after its first {run['after_updates']}; train_cls x{run['suite_ratio']:.2f})")
    if 'step_options' in f:
        o = f['step_options']
        lines.append(f"  step options alone vs plain step ({o['plain_img_s']:.1f} img/s): "
                     + ', '.join(f"{k} x{o[k + '_ratio']:.2f}" for k in STEP_OPTIONS))
        if 'token_labeling_ratio' in o:
            lines.append(f"  the same model's step without token labeling (Standard recipe): {o['standard_img_s']:.1f} "
                         f"img/s (token labeling x{o['token_labeling_ratio']:.2f})")
    return lines + [f'  MEASUREMENT ERROR: {error}' for error in f['measurement_errors']]


def describe_flops(flops: dict) -> str:
    line = f"({flops['tflop_s']:.3g} TFLOP/s at {flops['per_image_gflop']:.1f} GFLOP per image"
    return line + (f", MFU {flops['mfu']:.1%} of {flops['peak_tflop_s']:g})" if flops['mfu'] is not None else ')')


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    args = parse_args(argv, description)
    show_log(stream=sys.stderr if args.json else None)  # with --json standard output is the JSON document
    pick_amp(args.amp, torch.device(args.device))  # and so is fp16 on a CPU
    labelled = [m for m in args.models if recipe_for(m).uses_score_maps]
    with tempfile.TemporaryDirectory() as tmp:
        labels = Path(args.token_label_dir) if args.token_label_dir else None
        if args.data_dir:
            root = Path(args.data_dir)
            find_classes(root / 'train')  # a missing folder is named first
            if labels is None and labelled:
                raise UsageError(f'{labelled[0]} trains with token labels: give --token-label-dir, the store of '
                                 f'{root} (tools/generate_token_labels.py or tools/import_token_labels.py)')
        else:
            root = synthetic_imagenet(Path(tmp) / 'data', args.images)
            if labels is None and labelled:
                labels = synthetic_labels(root, Path(tmp) / 'labels', torch.device(args.device))
        data = ImageData(root, labels)
        results = [benchmark_model(name, data, args) for name in args.models]
    figures = {'cores': available_cores(), 'amp': args.amp, 'workers': args.workers, 'seconds': args.seconds,
               'min_batches': args.min_batches, 'models': results}
    document = results_document('loop', 'benchmark_loop.py', argv, figures, args.device)
    if args.json:
        write_document(json.dumps(document))
    else:
        logger.info(f"{document['machine']}  torch {document['torch']}  commit {document['commit']}  amp {args.amp}  "
                    f"each stage timed >= {args.seconds:g} s and >= {args.min_batches} batches after its warm-up")
        for figures in results:
            logger.info('\n'.join(describe(figures, args.workers)))
    if any(f['measurement_errors'] for f in results):
        logger.error('some figures are above what the machine can do (MEASUREMENT ERROR): time longer windows on a '
                     'quiet machine')
        return 1
    return 0

