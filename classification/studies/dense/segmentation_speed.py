"""Segmentation speed on the embedded digits pages: evaluation images/s single-scale against multi-scale + flip
(four ways, and its ten single passes), and training iterations/s; or (`--restart-at`) how long a resumed run's
loader takes to its first batch: the logic of tools/benchmark_seg.py."""
from __future__ import annotations

import argparse
import copy
import os
from itertools import cycle, islice

import torch
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope
from mmengine.runner import Runner

import backbones.dense  # noqa: F401  (first: it lets mmseg import on mmcv-lite; registers the suite's modules)

# isort: split
from mmseg.models.segmentors import SegTTAModel
from mmseg.registry import DATASETS, MODELS

from backbones.common.cli import add_workers_argument, command_parser, positive_int
from backbones.common.devices import add_device_argument, device_name
from backbones.common.log import logger
from backbones.common.outputs import output_file
from backbones.dense.config import load_config
from backbones.dense.runner import SuiteRunner, check_batch_trains
from backbones.dense.test import use_multi_scale
from backbones.dense.tta import flipping_tta_pipeline, mirror_image
from classification.digits.seg_data import EmbeddedPages
from classification.studies.results_file import write_results
from classification.studies.timing import seconds_per_call
from classification.studies.timing import timed as timed_call


def parse_args(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    parser = command_parser(description, 'benchmark_seg.py')
    parser.add_argument('--config', default='seg_configs/upernet_lvvit_s.py', help='the config whose model is timed')
    add_device_argument(parser)
    parser.add_argument('--full-size', action='store_true', help="ADE20K's sizes instead of a quarter of them")
    parser.add_argument('--images', type=positive_int, default=8, help='evaluation images timed per mode')
    parser.add_argument('--iters', type=positive_int, default=5, help='training iterations timed')
    parser.add_argument('--batch-size', type=positive_int, default=2, help='training images per iteration')
    parser.add_argument('--restart-at', type=positive_int, metavar='ITER', help=(
        "time only a resumed run's loader at iteration ITER, to its first batch: mmengine's replay (estimated from "
        '--replayed iterations) against the sampler placed there'))
    parser.add_argument('--replayed', type=positive_int, default=20, help='iterations of the replay timed')
    add_workers_argument(parser)
    parser.add_argument('--json', type=output_file, help='also write the figures here')
    args = parser.parse_args(argv)
    args.device = device_name(args.device)
    return args


def loader(cfg, key: str):
    dataloader = copy.deepcopy(cfg[key])
    dataloader.update(num_workers=0, persistent_workers=False)
    return Runner.build_dataloader(dataloader)


def timed(fn, batches: list) -> float:
    """Seconds `fn` takes on batches[1:] in all, after a warm-up call on batches[0]."""
    fn(batches[0])
    rest = cycle(batches[1:])
    return seconds_per_call(lambda: fn(next(rest)), len(batches) - 1, warmup=0) * (len(batches) - 1)


def restart_seconds(loader_cfg: dict, iteration: int, replayed: int) -> dict:
    """Seconds from a resumed run's loop start to its first batch at `iteration`: mmengine's replay and ours."""
    def build(sampler: str):
        return SuiteRunner.build_dataloader({**copy.deepcopy(loader_cfg), 'sampler': dict(type=sampler)}, seed=0)

    load_before = os.getloadavg()[0]
    read = iter(build('InfiniteSampler'))  # its first batch starts the loader's processes
    first = timed_call(lambda: next(read))[1]
    rest = timed_call(lambda: [next(read) for _ in range(replayed)])[1]
    placed = build('PlacedInfiniteSampler')
    placed.sampler.start_at(iteration * placed.batch_size)
    after = timed_call(lambda: next(iter(placed)))[1]
    before = first + iteration * rest / replayed
    return {'load_average_1min': [load_before, os.getloadavg()[0]], 'iteration': iteration,
            'batch_size': placed.batch_size, 'workers': placed.num_workers, 'replayed_timed': replayed,
            'first_batch_s': first, 'replayed_batch_s': rest / replayed, 'images_replayed': iteration *
            placed.batch_size, 'before_s': before, 'before_hours': before / 3600, 'after_s': after,
            'speedup': before / after}


def multi_scale_costs(cfg, model, args) -> dict:
    """Multi-scale + flip: the suite's test (each scale and its mirror image in one batch), the same window by window,
    and mmseg's (ten views, one by one), against the ten single passes; the pipelines' images/s."""
    ms_cfg = copy.deepcopy(cfg)
    ms_cfg.tta_model['flip'] = True
    use_multi_scale(ms_cfg, flip=True)
    results, tta = {}, MODELS.build(ms_cfg.model).to(args.device).eval()
    tta.module.load_state_dict(model.state_dict())
    mmseg_cfg = copy.deepcopy(ms_cfg)
    mmseg_cfg.test_dataloader.dataset.pipeline = flipping_tta_pipeline(ms_cfg.tta_pipeline)
    for name, config in (('suite', ms_cfg), ('mmseg', mmseg_cfg)):
        dataset = DATASETS.build(copy.deepcopy(config.test_dataloader.dataset))
        results[f'ms_pipeline_img_per_s_{name}'] = args.images / seconds_per_call(
            lambda: [dataset[i] for i in range(args.images)], 1, warmup=1)
    batches = list(islice(loader(ms_cfg, 'test_dataloader'), args.images + 1))
    mmseg_batches = list(islice(loader(mmseg_cfg, 'test_dataloader'), args.images + 1))
    window_batch = tta.module.test_cfg.get('window_batch', 1)
    with torch.no_grad():
        seconds = timed(tta.test_step, batches)
        tta.module.test_cfg.window_batch = 1
        window_by_window = timed(tta.test_step, batches)
        tta.module.test_cfg.window_batch = window_batch
        mmseg_seconds = timed(SegTTAModel(module=tta.module).test_step, mmseg_batches)
        single_passes = sum(timed(tta.module.test_step, [pick(batch, i) for batch in batches])
                            for i in range(2 * len(batches[0]['inputs'])))
    results['ms_flip_img_per_s'] = args.images / seconds
    results['ms_flip_img_per_s_window_by_window'] = args.images / window_by_window
    results['ms_flip_img_per_s_mmseg'] = args.images / mmseg_seconds
    results['ms_flip_cost_over_single_passes'] = seconds / single_passes
    results['ms_flip_speedup_over_mmseg'] = mmseg_seconds / seconds
    results['window_batch_speedup'] = window_by_window / seconds
    return results


def pick(batch: dict, index: int) -> dict:
    """View `index` of a multi-scale batch as a single-scale batch: even indices the scales, odd their mirrors."""
    view = {key: value[index // 2] for key, value in batch.items()}
    return mirror_image(view) if index % 2 else view


def main(argv: list[str] | None = None, description: str | None = None) -> dict:
    """tools/benchmark_seg.py."""
    args = parse_args(argv, description)
    init_default_scope('mmseg')
    cfg = load_config(args.config, {'model.backbone.pretrained': None})
    pages = EmbeddedPages(scale=1.0) if args.full_size else EmbeddedPages()
    pages.use_data(cfg)
    cfg.train_dataloader.batch_size = args.batch_size
    results = {'config': args.config, 'device': args.device, 'full_size': args.full_size}
    if args.restart_at:
        cfg.train_dataloader.update(num_workers=args.workers, persistent_workers=False)
        results['restart'] = restart_seconds(cfg.train_dataloader, args.restart_at, args.replayed)
        return report(results, args, 'seg_restart', argv)
    model = MODELS.build(cfg.model).to(args.device)
    check_batch_trains(model, args.batch_size, 1, '--batch-size')  # before minutes of evaluation

    model.eval()
    ss_batches = list(islice(loader(cfg, 'test_dataloader'), args.images + 1))
    with torch.no_grad():
        results['ss_img_per_s'] = args.images / timed(model.test_step, ss_batches)
    results.update(multi_scale_costs(cfg, model, args))
    results['ms_flip_slowdown'] = results['ss_img_per_s'] / results['ms_flip_img_per_s']

    model.train()
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    train_batches = list(islice(cycle(loader(cfg, 'train_dataloader')), args.iters + 1))
    seconds = timed(lambda batch: model.train_step(batch, optim), train_batches)
    results['train_it_per_s'] = args.iters / seconds
    results['train_img_per_s'] = args.iters * args.batch_size / seconds
    return report(results, args, 'seg_benchmark', argv)


def report(results: dict, args: argparse.Namespace, study: str, argv: list[str] | None) -> dict:
    """The figures logged (and, given --json, written there as `study`'s results file), returned."""
    for key, value in results.items():
        logger.info(f'{key}: {value:.3f}' if isinstance(value, float) else f'{key}: {value}')
    if args.json:
        write_results(args.json, study, 'benchmark_seg.py', argv, results, args.device)
    return results
