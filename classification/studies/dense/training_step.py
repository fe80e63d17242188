"""Each dense config's training step in its steady state, as tools/train_seg.py runs it on one GPU (the config's model,
optimizer and per-GPU batch), on batches its own training pipeline made from synthetic images of the data set's
usual size, only its reading steps (`Load...`) left out (tools/measure_gpu.py's `dense_steps`; docs/speed.md); and
steps compared in fresh processes (`compare_steps`, `COMPARISONS`): Mask R-CNN with window attention against global
attention, UperNet on a frozen backbone and the linear head against UperNet fine-tuning it."""
from __future__ import annotations

import argparse
import itertools
import multiprocessing
import resource
from dataclasses import asdict, dataclass

import numpy as np
import torch
from mmcv.transforms import Compose
from mmengine.config import Config
from mmengine.dataset import pseudo_collate
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope

import backbones.dense  # noqa: F401  (first: it lets mmseg import on mmcv-lite; registers the suite's modules)

# isort: split
from mmseg.registry import MODELS

from backbones.common.cli import command_parser, positive_int
from backbones.common.devices import add_device_argument, device_name
from backbones.common.log import logger
from backbones.common.outputs import output_file
from backbones.dense.config import load_config, scale_sizes
from backbones.dense.tasks import task_of
from classification.studies.results_file import write_results
from classification.studies.timing import SteadyWindow

# the same detector with global attention, with ViTDet's windows (14 tokens, 4 global blocks, relative positions),
# and with those windows without relative positions: (config, options over it); the first is the baseline
WINDOW_VARIANTS = {'global': ('seg_configs/maskrcnn_lvvit_s.py', {}),
                   'windows': ('seg_configs/maskrcnn_lvvit_s_windowed.py', {}),
                   'windows_without_rel_pos': ('seg_configs/maskrcnn_lvvit_s_windowed.py',
                                               {'model.backbone.rel_pos': False})}
# UperNet fine-tuning its backbone, the same on the frozen backbone, and DINOv2's linear head on it
FROZEN_VARIANTS = {'fine_tuned': ('seg_configs/upernet_lvvit_s.py', {}),
                   'frozen': ('seg_configs/upernet_lvvit_s.py', {'model.backbone.frozen': True}),
                   'linear': ('seg_configs/linear_lvvit_s.py', {})}
# each comparison's variants, the image size its configs are written for, its default batch (UperNet's pooling
# pyramid's batch norms take 2 images at least) and its results' study name
COMPARISONS = {'windows': (WINDOW_VARIANTS, 1024, 1, 'dense_windows'),
               'frozen': (FROZEN_VARIANTS, 512, 2, 'dense_frozen')}


@dataclass(frozen=True)
class DenseStep:
    """One config's step timed: images and iterations per second, its batch, its largest image, its peak memory."""
    config: str
    task: str
    batch_size: int
    largest_image: tuple[int, int]  # (height, width)
    img_s: float
    it_s: float
    peak_memory_gib: float | None
    # on a CPU: the process's resident memory at its peak so far, and before the first step (model and batches)
    peak_process_gib: float | None = None
    resting_process_gib: float | None = None

    @property
    def peak_above_rest_gib(self) -> float | None:
        """On a CPU: the process's resident memory at its peak above what it held before the first step."""
        return None if self.peak_process_gib is None else self.peak_process_gib - self.resting_process_gib

    def as_dict(self) -> dict:
        return {**asdict(self), 'largest_image': list(self.largest_image),
                'peak_above_rest_gib': self.peak_above_rest_gib}


def training_batches(cfg: Config, count: int, batch_size: int, scale: float, seed: int = 0) -> list[dict]:
    """`count` batches of `batch_size` from the config's pipeline on its task's synthetic samples times `scale`."""
    task = task_of(cfg)
    steps = [step for step in cfg.train_dataloader.dataset.pipeline if not step['type'].startswith('Load')]
    pipeline = Compose(steps)
    width, height = (max(1, round(side * scale)) for side in task.usual_image)
    rng = np.random.default_rng(seed)
    np.random.seed(seed)  # the pipelines' own draws
    return [pseudo_collate([pipeline(task.loaded_sample(rng, width, height)) for _ in range(batch_size)])
            for _ in range(count)]


def dense_config(path: str, scale: float, options: dict | None = None) -> Config:
    """The config with random weights, its sizes times `scale`, `options` merged over it."""
    cfg = load_config(path, {'model.backbone.pretrained': None, **(options or {})})
    if scale != 1.0:
        scale_sizes(cfg.train_dataloader.dataset.pipeline, scale)
        scale_sizes(cfg.model.get('data_preprocessor', {}), scale)
    return cfg


def time_dense_step(path: str, device: torch.device, seconds: float, min_batches: int, warmup: int,
                    scale: float = 1.0, batch_size: int | None = None, batches: int = 4,
                    options: dict | None = None) -> DenseStep:
    """The config's training step (`options` over it): `warmup` steps, then at least `seconds` and `min_batches`."""
    init_default_scope('mmseg')
    cfg = dense_config(path, scale, options)
    batch_size = batch_size or cfg.train_dataloader.batch_size
    data = training_batches(cfg, batches, batch_size, scale)
    model = MODELS.build(cfg.model).to(device).train()
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
    resting = resident_gib()
    window = SteadyWindow(seconds, min_batches, warmup=warmup, device=device)
    largest = (0, 0)
    for count, batch in enumerate(itertools.cycle(data), 1):
        for value in model.train_step(batch, optim).values():
            value.item()  # mmengine's loop reads the logged losses each step
        largest = max(largest, largest_image(batch))
        if window.done(count, batch_size):
            break
    img_s = window.images_per_second()
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == 'cuda' else None
    peak_resident = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB on Linux, in GiB
    process = (peak_resident, resting) if device.type == 'cpu' else (None, None)
    return DenseStep(path, task_of(cfg).name, batch_size, largest, img_s, img_s / batch_size, peak, *process)


def resident_gib() -> float:
    """This process's resident memory now (Linux's /proc/self/statm), in GiB."""
    with open('/proc/self/statm') as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2 ** 30


def step_in_fresh_process(path: str, device: torch.device, seconds: float, min_batches: int, warmup: int,
                          scale: float, batch_size: int | None, options: dict) -> DenseStep:
    """`time_dense_step` in a spawned process: its peak memory is that config's alone."""
    with multiprocessing.get_context('spawn').Pool(1) as pool:
        return pool.apply(time_dense_step, (path, device, seconds, min_batches, warmup, scale, batch_size),
                          {'options': options})


def compare_steps(variants: dict[str, tuple[str, dict]], device: torch.device, seconds: float, min_batches: int,
                  warmup: int, scale: float = 1.0, batch_size: int | None = None) -> dict:
    """Each variant's step in a fresh process, and `ratios` of each's step time and peak memory over the first's."""
    steps = {name: step_in_fresh_process(config, device, seconds, min_batches, warmup, scale, batch_size, options)
             for name, (config, options) in variants.items()}
    baseline = steps[next(iter(variants))]
    return {**{name: step.as_dict() for name, step in steps.items()},
            'ratios': {name: {'time': baseline.img_s / step.img_s,
                              'memory': peak_memory(step) / peak_memory(baseline)}
                       for name, step in steps.items() if step is not baseline}}


def compare_window_attention(device: torch.device, seconds: float, min_batches: int, warmup: int,
                             scale: float = 1.0, batch_size: int | None = None) -> dict:
    """Mask R-CNN's step with window attention against global attention (WINDOW_VARIANTS)."""
    return compare_steps(WINDOW_VARIANTS, device, seconds, min_batches, warmup, scale, batch_size)


def peak_memory(step: DenseStep) -> float:
    """The step's peak memory: the device's, or on a CPU the process's above what it held before the first step."""
    return step.peak_memory_gib if step.peak_memory_gib is not None else step.peak_above_rest_gib


def largest_image(batch: dict) -> tuple[int, int]:
    """The batch's largest image (height, width) as the pipeline left it, before the preprocessor's padding."""
    return max(tuple(image.shape[-2:]) for image in batch['inputs'])


def parse_args(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    parser = command_parser(description, 'benchmark_dense_step.py')
    add_device_argument(parser)
    parser.add_argument('--compare', choices=sorted(COMPARISONS), default='windows',
                        help='windows: Mask R-CNN with window attention against global attention; frozen: UperNet '
                             'on a frozen backbone and the linear head against UperNet fine-tuning it')
    parser.add_argument('--size', type=positive_int, default=512,
                        help="the image size in pixels (the detector's 1024, or UperNet's 512 crops, scaled to it)")
    parser.add_argument('--batch-size', type=positive_int, help='images per step (default 1; --compare frozen: 2)')
    parser.add_argument('--seconds', type=float, default=20.0, help='each step timed for at least this long')
    parser.add_argument('--min-steps', type=positive_int, default=3, help='and at least this many steps')
    parser.add_argument('--warmup', type=positive_int, default=1, help='steps before the timing')
    parser.add_argument('--json', type=output_file, help='also write the figures here (a results file)')
    args = parser.parse_args(argv)
    args.device = device_name(args.device)
    return args


def main(argv: list[str] | None = None, description: str | None = None) -> dict:
    """tools/benchmark_dense_step.py."""
    args = parse_args(argv, description)
    variants, written_for, batch_size, study = COMPARISONS[args.compare]
    figures = {'size': args.size, **compare_steps(variants, torch.device(args.device), args.seconds, args.min_steps,
                                                  args.warmup, args.size / written_for, args.batch_size or batch_size)}
    baseline = next(iter(variants))
    for name in variants:
        step = figures[name]
        memory = (f'peak memory {step["peak_memory_gib"]:.2f} GiB' if step['peak_memory_gib'] is not None else
                  f'peak memory {step["peak_above_rest_gib"]:.2f} GiB above rest')  # what the ratios compare
        logger.info(f'{name}: {step["it_s"]:.3f} steps/s, {memory}')
    for name, ratio in figures['ratios'].items():
        logger.info(f'{name} / {baseline}: x{ratio["time"]:.2f} the time of a step, x{ratio["memory"]:.2f} the '
                    f'memory')
    if args.json:
        write_results(args.json, study, 'benchmark_dense_step.py', argv, figures, args.device)
    return figures
