"""The GPU session's stages that run in a process of their own (`measure_gpu.py --stage NAME`), in the call's work
folder: each writes its figures into its own file as they come."""
from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from backbones.common.files import write_json_atomic
from backbones.common.log import logger
from classification.studies.gpu_plan import DENSE_CONFIGS, Sizes, session_amp


def benchmark_setup(model: str, sizes: Sizes, device: str, folder: Path, decode: str, workers: int):
    """loop_benchmark's pieces for `model` (JPEGs, labels) under `folder`, made by the first stage that needs them."""
    from backbones.common.distributed import DistInfo
    from classification.loaders import ImageData
    from classification.recipes import recipe_for
    from classification.studies import loop_benchmark

    argv = ['--models', model, '--device', device, '--amp', session_amp(device), '--batch-size', str(sizes.batch_size),
            '--workers', str(workers), '--seconds', f'{sizes.seconds:g}', '--decode', decode, '--min-batches',
            str(sizes.min_batches)]
    args = loop_benchmark.parse_args(argv)
    root = built_once(folder / 'data', lambda path: loop_benchmark.synthetic_imagenet(path, sizes.images))
    labels = built_once(folder / 'token_labels', lambda path: loop_benchmark.synthetic_labels(
        root, path / 'store', torch.device(device))) / 'store' if recipe_for(model).uses_score_maps else None
    return loop_benchmark.BenchedModel(model, ImageData(root, labels), args, DistInfo(device=torch.device(device)))


def built_once(path: Path, build: Callable[[Path], object]) -> Path:
    """`path`, made by `build` unless an earlier stage finished making it (its marker); half-made ones made again."""
    marker = path.with_name(f'{path.name}.built')
    if not marker.exists():
        shutil.rmtree(path, ignore_errors=True)
        build(path)
        marker.touch()
    return path


ChildStage = Callable[[Sizes, str, Path, Callable[[str, object], None]], None]


def loop_stage(key: str, model_of: Callable[[Sizes], str]) -> ChildStage:
    """The whole loop against the trainer's step on the same model, eager then compiled, its data wait; under `key`."""
    def run(sizes: Sizes, device: str, tmp: Path, save: Callable[[str, object], None]) -> None:
        from classification.engine.trainer import StepOptions
        from classification.studies import loop_benchmark

        model, decode, amp = model_of(sizes), 'gpu' if device == 'cuda' else 'cpu', session_amp(device)
        setup = benchmark_setup(model, sizes, device, tmp, decode, sizes.loop_workers)
        batch = loop_benchmark.device_batch(setup, 'batched')
        figures: dict[str, object] = {}
        loops = {'how': f'the whole loop (the batched path, --decode {decode}, {sizes.loop_workers} workers, the '
                        f'prefetcher) and the trainer step ({amp} autocast, fused AdamW, channels-last) on one batch '
                        f'on the device, batch {sizes.batch_size}, each timed >= {sizes.seconds:g} s after its '
                        f'warm-up, eager and torch.compile (the loop on the model its step timing compiled); '
                        f'data_wait: the loop pass\'s share of time waiting for '
                        f'batches, its warm-up included', 'decode': decode, 'workers': sizes.loop_workers,
                 'models': {model: figures}}
        for label, compiled in (('eager', False), ('compiled', True)):
            if compiled and device != 'cuda':
                logger.info(f'{model}: the compiled step and loop are skipped on a CPU')
                continue
            options = StepOptions(compile=compiled)
            pieces = setup.step_pieces(options, amp)  # one model for the step and the loop: compiled once
            step = loop_benchmark.step_images_per_second(setup, batch, options, amp, pieces=pieces)
            loop = loop_benchmark.loop_images_per_second(setup, 'batched', options, pieces=pieces)
            figures[label] = {'step_img_s': step.images_per_second, 'loop_img_s': loop.images_per_second,
                              'loop_of_step': loop.images_per_second / step.images_per_second,
                              'data_wait': loop.data_wait,
                              'compiled_in_window': step.compiled_in_window + loop.compiled_in_window,
                              **loop_benchmark.step_flops(setup, step.images_per_second,
                                                          loop_benchmark.peak_tflops(setup.args))}
            save(key, loops)
    return run


def decoding_stage(sizes: Sizes, device: str, tmp: Path, save: Callable[[str, object], None]) -> None:
    """The batched pipeline with `decode_workers` workers, decoding by the workers, then by nvJPEG (not on a CPU)."""
    from classification.studies import loop_benchmark

    figures = {'how': f'the batched path\'s input pipeline, {sizes.decode_workers} workers, batch {sizes.batch_size}, '
                      f'synthetic 500x375 JPEGs, each timed >= {sizes.seconds:g} s after its warm-up',
               'workers': sizes.decode_workers}
    for decode in ('cpu', 'gpu'):
        if decode == 'gpu' and device != 'cuda':
            logger.info('decoding: nvJPEG is skipped on a CPU')
            continue
        # epochs longer than the window: the workers are not started again inside it
        setup = benchmark_setup(sizes.model, sizes, device, tmp, decode, sizes.decode_workers)
        figures[f'{decode}_img_s'] = loop_benchmark.pipeline_images_per_second(setup, 'batched', sizes.decode_workers)
        if decode == 'gpu':
            figures['gpu_over_cpu'] = figures['gpu_img_s'] / figures['cpu_img_s']
        save('decoding', figures)


def label_generation_stage(sizes: Sizes, device: str, tmp: Path, save: Callable[[str, object], None]) -> None:
    """The paper's annotator as generate_token_labels runs it on a batch: fp32, bf16 autocast, fp32 top-5."""
    import itertools

    import timm

    from classification.engine.steps import autocast
    from classification.studies.timing import SteadyWindow
    from classification.token_labeling.annotate import dense_scores

    on = torch.device(device)
    model = timm.create_model(sizes.annotator, num_classes=1000).eval().to(on)
    size = sizes.annotator_size
    batch = {'image': torch.randn(sizes.label_batch, 3, size, size, device=on),
             'label': torch.zeros(sizes.label_batch, dtype=torch.long)}
    figures = {'how': f"{sizes.annotator} (random weights) at {size} px, batch {sizes.label_batch} on the device: the "
                      f"dense forward and its top-5 as generate_token_labels runs them, each timed >= "
                      f"{sizes.seconds:g} s after its warm-up", 'annotator': sizes.annotator, 'img_size': size}
    for amp in ('none', 'bf16'):
        window = SteadyWindow(sizes.seconds, sizes.slow_min_batches, warmup=2, device=on)
        with torch.no_grad():
            for images in window.batches(itertools.repeat(batch)):
                with autocast(on, amp):
                    scores = dense_scores(model, images['image'])
                scores.float().topk(5, dim=-1)
        key = 'fp32_img_s' if amp == 'none' else 'bf16_img_s'
        figures[key] = window.images_per_second()
        logger.info(f"label generation's forward, {'fp32' if amp == 'none' else amp}: {figures[key]:.1f} img/s")
        if amp == 'bf16':
            figures['bf16_over_fp32'] = figures['bf16_img_s'] / figures['fp32_img_s']
        save('label_generation', figures)


def dense_steps_stage(sizes: Sizes, device: str, tmp: Path, save: Callable[[str, object], None]) -> None:
    """The training step of UperNet, Mask R-CNN and the depth model on LV-ViT-S as train_seg runs each config."""
    from classification.studies.dense.training_step import time_dense_step

    figures: dict[str, object] = {
        'how': f"each config's training step on batches its training pipeline made from synthetic images of the "
               f"data set's usual size (x{sizes.dense_scale:g}), the logged losses read each step as mmengine's loop "
               f"does, timed >= {sizes.dense_seconds:g} s after {sizes.dense_warmup} steps", 'configs': {}}
    for config in DENSE_CONFIGS:
        step = time_dense_step(config, torch.device(device), sizes.dense_seconds, sizes.slow_min_batches,
                               sizes.dense_warmup, scale=sizes.dense_scale, batch_size=sizes.dense_batch)
        logger.info(f'{config}: {step.img_s:.1f} img/s ({step.it_s:.2f} it/s of {step.batch_size})')
        figures['configs'][Path(config).stem] = step.as_dict()
        save('dense_steps', figures)


def dense_windows_stage(sizes: Sizes, device: str, tmp: Path, save: Callable[[str, object], None]) -> None:
    """Mask R-CNN's step with window attention against global attention, each in a fresh process, their ratios."""
    from classification.studies.dense.training_step import compare_window_attention

    windows = compare_window_attention(torch.device(device), sizes.dense_seconds, sizes.slow_min_batches,
                                       sizes.dense_warmup, scale=sizes.dense_scale, batch_size=sizes.dense_batch)
    ratio = windows['ratios']['windows']
    logger.info(f'Mask R-CNN, windows / global: x{ratio["time"]:.2f} the time of a step, x{ratio["memory"]:.2f} the '
                'memory')
    save('dense_windows', windows)


CHILD_STAGES: dict[str, ChildStage] = {
    'deit_loop': loop_stage('deit_loop', lambda sizes: sizes.model),
    'lvvit_loop': loop_stage('lvvit_loop', lambda sizes: sizes.token_labeling_model),
    'decoding': decoding_stage, 'label_generation': label_generation_stage, 'dense_steps': dense_steps_stage,
    'dense_windows': dense_windows_stage}


def run_child_stage(name: str, out: Path, sizes: Sizes, device: str, work: Path) -> None:
    """Stage `name` in the call's work folder, its figures into `out` as they come, then its imported modules."""
    written: dict[str, object] = {}

    def save(key: str, value: object) -> None:
        written[key] = value
        write_json_atomic(out, written)

    CHILD_STAGES[name](sizes, device, work, save)
    save(MODULES, imported_modules())


MODULES = 'imported_modules'  # a child stage's key for them, moved into its stage's record
OWN_PACKAGES = ('backbones', 'classification')


def imported_modules() -> list[str]:
    """The modules of this checkout's packages this process has imported: what the stage needs of the device
    machine is what they import (the tests import them where only DEVICE_IMAGE and CARRIED_WHEELS are there)."""
    return sorted(name for name in list(sys.modules) if name.partition('.')[0] in OWN_PACKAGES)

