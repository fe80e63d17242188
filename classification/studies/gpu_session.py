"""One borrowed GPU machine's measurements, stage by stage, the stages of one device call chosen with `--stages`
(tools/measure_gpu.py).

The stages, in the order of value (the default runs the first six, the figures no session has measured yet):
`deit_loop`, DeiT-S's whole loop with `--decode gpu` against its step in the same process, eager and compiled, with
its data-wait share; `lvvit_loop`, the same for LV-ViT-S with token labeling; `decoding`, nvJPEG against the workers'
decoding; `label_generation`, bf16 label generation against fp32; `dense_steps`, the training steps of UperNet,
Mask R-CNN and the depth model in their steady state; `dense_windows`, Mask R-CNN with window attention against
global attention; then by name `loop_benchmark` (the suite against
timm's train.py and the loop with the workers decoding, tools/benchmark_loop.py) and `gpu_tests` (`pytest -m gpu`, a
call of its own). Each stage runs in a process of its own under the call's remaining time (`--budget`); a stage
whose predicted length no longer fits is skipped with a line saying so, and one stopped at its limit keeps what it
measured: every figure is written into the results file as it comes (atomically), and the file is merged across
calls (`--merge` the earlier call's file). `--smoke` runs the stages at tiny sizes (on a CPU: the stages that need
CUDA are skipped, each with a line saying so, and the loops decode in the workers, eager only); the tests run it.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from backbones.common.cli import command_parser, non_negative_float, positive_float
from backbones.common.devices import add_device_argument, device_name
from backbones.common.errors import DataError, UsageError
from backbones.common.files import write_json_atomic
from backbones.common.log import logger
from backbones.common.outputs import output_file
from classification.studies.launcher import LaunchedCommand, tool_command
from classification.studies.results_file import check_envelope, checkout_commit, machine_slug, results_document

AMP = 'bf16'


def session_amp(device: str) -> str:
    """The steps' precision: bf16 autocast on a GPU; fp32 on a CPU, where bf16 runs emulated (a smoke run's steps
    took seconds an image) and the figures measure nothing anyway."""
    return AMP if device == 'cuda' else 'none'


@dataclass(frozen=True)
class Sizes:
    """What the stages run: the GPU session's sizes, or the smoke run's."""
    model: str
    batch_size: int
    workers: int
    # the synthetic training entries: loop windows stay in one epoch (the loop benchmark's train_cls and timm
    # windows: 50 skipped updates and 30 s at up to 10,000 img/s, above the compiled step's 8,494 on an H200)
    images: int
    seconds: float  # each timing window's least length
    min_batches: int | None  # each window's fewest batches (None: benchmark_loop's default, 200 on a GPU)
    skip_updates: int  # train_cls's and timm's updates before their window
    loop_workers: int  # the loader processes of the loop stages: a 12-core share of a node, one core for training
    decode_workers: int  # the loader processes of the decoding comparison (a node with few cores per GPU)
    annotator: str
    annotator_size: int
    label_batch: int  # label generation's batch
    token_labeling_model: str  # the lvvit_loop stage's
    dense_scale: float  # the dense steps' sizes: the data sets' (1.0), or smaller for a smoke run
    dense_batch: int | None  # the dense steps' batch (None: each config's per-GPU batch)
    dense_seconds: float  # each dense step's least window
    dense_warmup: int  # each dense step's steps before its window (kernel choice, the allocator)


GPU = Sizes(model='deit_small_patch16_224', batch_size=256, workers=15, images=320_000, seconds=30.0,
            min_batches=None, skip_updates=50, loop_workers=11, decode_workers=4, annotator='dm_nfnet_f6',
            annotator_size=576, label_batch=32, token_labeling_model='lvvit_s', dense_scale=1.0, dense_batch=None,
            dense_seconds=20.0, dense_warmup=5)
SMOKE = Sizes(model='deit_tiny_patch16_224', batch_size=4, workers=1, images=64, seconds=0.0, min_batches=1,
              skip_updates=1, loop_workers=1, decode_workers=1, annotator='resnet10t', annotator_size=64,
              label_batch=2, token_labeling_model='lvvit_s', dense_scale=0.125, dense_batch=2, dense_seconds=0.0,
              dense_warmup=1)

STAGE_ORDER = ('deit_loop', 'lvvit_loop', 'decoding', 'label_generation', 'dense_steps', 'dense_windows',
               'loop_benchmark', 'gpu_tests')
# no session measured these
DEFAULT_STAGES = ('deit_loop', 'lvvit_loop', 'decoding', 'label_generation', 'dense_steps', 'dense_windows')
DENSE_CONFIGS = ('seg_configs/upernet_lvvit_s.py', 'seg_configs/maskrcnn_lvvit_s.py', 'seg_configs/depth_lvvit_s.py')
NEEDS_CUDA = {'gpu_tests': 'the GPU suite runs on CUDA; on a CPU every test is a skip',
              'decoding': 'nvJPEG decodes on CUDA'}
RESERVE = 15.0  # seconds a call keeps for writing its file after its last stage


def predicted_seconds(stage: str, sizes: Sizes) -> float:
    """A stage's length on one H100 or H200 with `sizes` (from the 2026-11-26 and 2026-11-28 sessions: 16 cores,
    torch 2.11): its start-ups and untimed warm-ups, plus each timing window. A smoke run's own lengths are in its
    results file."""
    window = sizes.seconds
    step = (window + 5) + (window + 70)  # eager; compiled (compiling first)
    loop = (window + 25) + (window + 90)  # eager (the workers' prefetch first); compiled (compiling again)
    return {'loop_benchmark': 60 + 8 * (window + 6) + 2 * (45 + window),  # data; 8 windows; train_cls and timm
            'deit_loop': 60 + step + loop,  # data and a batch
            'lvvit_loop': 75 + step + loop,  # data, its token labels and a batch
            'gpu_tests': 420.0,  # 400-450 s on 2026-11-28
            'decoding': 60 + 2 * (window + 15),  # data; the workers' decoding, then nvJPEG
            'label_generation': 40 + 2 * (window + 10),  # the annotator built; fp32, then bf16
            # never run on a GPU: per config (the window comparison's two), building it and its batches, then the
            # warm-up and the window
            'dense_steps': len(DENSE_CONFIGS) * (20 + sizes.dense_seconds + 10),
            'dense_windows': 2 * (20 + sizes.dense_seconds + 10)}[stage]


class Results:
    """The session's results file (the envelope, study gpu_session): every figure written into its figures as it
    comes, atomically; a call adds to the file it merges."""

    def __init__(self, path: Path, document: dict) -> None:
        self.path, self.document = path, document
        self.data = document['figures']

    def update(self, key: str, value: object) -> None:
        self.data[key] = value
        write_json_atomic(self.path, self.document)

    def stage(self, name: str, **facts: object) -> None:
        self.update('stages', {**self.data.get('stages', {}), name: {**self.data.get('stages', {}).get(name, {}),
                                                                     **facts}})


def session_document(device: str, commit: str | None, smoke: bool, argv: list[str] | None) -> dict:
    """A new session's results document: the machine, the versions, the source's commit (git's, or `commit` where
    this copy has no history: a device machine's copy of the working tree) and the date."""
    import timm
    import torchvision

    checked = checkout_commit()
    if commit and checked not in (None, commit):
        raise UsageError(f'--commit {commit}: this checkout is at {checked}')
    if checked is None and not commit:
        raise UsageError('give --commit (git rev-parse --short HEAD where the session was prepared): this copy has '
                         'no git history, and a figure needs its commit')
    versions = {'torchvision': torchvision.__version__, 'timm': timm.__version__,
                'python': '.'.join(map(str, sys.version_info[:3])), 'smoke': smoke}
    return results_document('gpu_session', 'measure_gpu.py', argv, versions, device, commit=commit or checked)


def open_results(out: Path, merge: Path | None, new: dict, stages: list[str]) -> Results:
    """The results file `out`, starting from `merge` (an earlier call's file) or from `out` itself where it exists;
    an earlier file of another machine, commit or size (--smoke) is refused, not mixed in."""
    source = merge if merge is not None else out
    if merge is not None and not merge.is_file():
        raise UsageError(f'--merge {merge}: no such file')
    if merge is not None and out.exists() and out.resolve() != merge.resolve():
        raise UsageError(f'--out {out} exists: give a new file for the merged figures (or --out {merge})')
    if not source.is_file():
        document = new
    else:
        try:
            document = check_envelope(json.loads(source.read_text()), str(source))
        except (ValueError, DataError) as exc:
            raise UsageError(f'{source}: not a results file ({exc})') from None
        if document['study'] != 'gpu_session':
            raise UsageError(f'{source}: not a GPU session\'s results (its study is {document["study"]})')
        # the machine by its GPU (or cores): the cores a call may use can differ on the same machine
        earlier = {'machine': machine_slug(document['machine']), 'commit': document['commit'],
                   'smoke': document['figures'].get('smoke')}
        now = {'machine': machine_slug(new['machine']), 'commit': new['commit'], 'smoke': new['figures']['smoke']}
        for key, value in earlier.items():
            if value != now[key]:
                raise UsageError(f'{source} holds figures of {key} {value!r}, this session\'s is {now[key]!r}: '
                                 f'give another --out (and no --merge)')
    results = Results(out, document)
    results.update('calls', [*document['figures'].get('calls', []), stages])
    return results


# ---- the parts' stages, run by the parent: each a command whose lines it reads


BENCHMARK_FIGURE = re.compile(r'^(\S+): (.+): ([\d.]+) img/s$')  # loop_benchmark's `reported` lines


def loop_benchmark_stage(results: Results, args: argparse.Namespace, limit: float) -> str:
    """tools/benchmark_loop.py on DeiT-S: the whole loop against its step (and the serial loop), train_cls and,
    given --timm-train, timm's train.py on the same data; each figure recorded as the benchmark logs it, its JSON
    document at the end."""
    sizes = args.sizes
    options = ['--models', sizes.model, '--device', args.device, '--amp', session_amp(args.device),
               '--batch-size', sizes.batch_size, '--workers', sizes.workers, '--images', sizes.images, '--seconds',
               f'{sizes.seconds:g}',
               '--skip-updates', sizes.skip_updates, '--compare-loop', '--train-cls', '--json']
    options += ['--min-batches', sizes.min_batches] if sizes.min_batches else []
    # the file given, wherever this call runs: the benchmark runs in the checkout
    options += ['--timm-train', Path(args.timm_train).resolve()] if args.timm_train else []
    if not args.timm_train:
        logger.info("loop_benchmark: no --timm-train: timm's train.py is not timed (the suite against it is part 1's "
                    "first figure: bring train.py from a clone of timm's repository)")
    progress: dict[str, float] = {}

    def on_line(line: str) -> None:
        logger.info(f'  {line}')
        found = BENCHMARK_FIGURE.match(line)
        if found:
            progress[found[2]] = float(found[3])
            results.update('loop_benchmark_progress', dict(progress))

    with tempfile.TemporaryDirectory() as tmp:
        document = Path(tmp) / 'benchmark.json'
        # its figures' lines on standard error as they come, its document on standard output at its end
        with LaunchedCommand(tool_command('benchmark_loop', options), limit=limit, stdout=document) as run:
            status = run.wait(on_line)
        if status is not None and document.is_file() and document.read_text().strip():
            results.update('loop_benchmark', json.loads(document.read_text())['figures'])
    return outcome(status, 'exit 1: a figure above its ceiling (MEASUREMENT ERROR), recorded as such' if status == 1
                   else None)


PYTEST_OUTCOME = re.compile(r'^(tests/\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)')
PYTEST_FAILURE = re.compile(r'^(?:FAILED|ERROR) tests/\S+::(\S+) - (.*)$')


def gpu_tests_stage(results: Results, args: argparse.Namespace, limit: float) -> str:
    """`pytest -m gpu tests/test_gpu.py`, each test's outcome recorded as it comes (a run stopped by its limit keeps
    the outcomes it reached)."""
    outcomes: dict[str, str] = {}
    failures: dict[str, str] = {}
    started = time.perf_counter()

    def record(timed_out: bool = False) -> None:
        counted = {kind: sum(1 for o in outcomes.values() if o == kind) for kind in ('PASSED', 'FAILED', 'SKIPPED')}
        results.update('gpu_tests', {
            'how': 'python -m pytest -m gpu tests/test_gpu.py', 'passed': counted['PASSED'],
            'failed': counted['FAILED'] + sum(1 for o in outcomes.values() if o == 'ERROR'),
            'skipped': counted['SKIPPED'], 'outcomes': dict(outcomes), 'failures': dict(failures),
            'seconds': round(time.perf_counter() - started, 1), 'timed_out': timed_out})

    def on_line(line: str) -> None:
        logger.info(f'  {line}')
        found, failure = PYTEST_OUTCOME.match(line), PYTEST_FAILURE.match(line)
        if found:
            outcomes[found[1].split('::', 1)[1]] = found[2]
            record()
        elif failure:
            failures[failure[1]] = failure[2][:300]
            record()

    with LaunchedCommand([sys.executable, '-m', 'pytest', '-m', 'gpu', 'tests/test_gpu.py', '-v', '-rfE', '-p',
                          'no:cacheprovider'], 'the GPU suite', limit=limit) as run:  # stopped: pytest's summary
        status = run.wait(on_line)
    record(timed_out=status is None)
    return outcome(status, 'some tests failed, recorded with their messages' if status == 1 else None)


def child_stage(name: str) -> Callable[[Results, argparse.Namespace, float], str]:
    """A stage run in a process of its own (this tool's `--stage NAME`): it writes its figures into a file of its
    own as they come, merged here when it ends or is stopped."""
    def run(results: Results, args: argparse.Namespace, limit: float) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            figures = Path(tmp) / f'{name}.json'
            command = tool_command('measure_gpu', [
                '--stage', name, '--stage-out', figures, '--device', args.device, *(['--smoke'] if args.smoke else []),
                *(['--seconds', f'{args.seconds:g}'] if args.seconds is not None else [])])
            try:
                with LaunchedCommand(command, limit=limit) as stage:
                    status = stage.wait(lambda line: logger.info(f'  {line}'))
            finally:  # an interrupted stage's figures so far are kept too (the child writes its file atomically)
                if figures.is_file():
                    for key, value in json.loads(figures.read_text()).items():
                        results.update(key, value)
        return outcome(status)
    return run


def outcome(status: int | None, known: str | None = None) -> str:
    if status is None:
        return 'stopped at its time limit (its figures so far are kept)'
    return 'done' if status == 0 else known or f'failed (exit {status}): its output is above'


STAGES: dict[str, Callable[[Results, argparse.Namespace, float], str]] = {
    'loop_benchmark': loop_benchmark_stage, 'deit_loop': child_stage('deit_loop'),
    'lvvit_loop': child_stage('lvvit_loop'), 'gpu_tests': gpu_tests_stage, 'decoding': child_stage('decoding'),
    'label_generation': child_stage('label_generation'), 'dense_steps': child_stage('dense_steps'),
    'dense_windows': child_stage('dense_windows')}


def run_stages(args: argparse.Namespace, argv: list[str] | None) -> Results:
    """The chosen stages in the order of value, each under the call's remaining time, skipped with a line where its
    predicted length no longer fits or it needs CUDA the machine lacks."""
    started = time.perf_counter()
    new = session_document(args.device, args.commit, args.smoke, argv)
    results = open_results(Path(args.out), Path(args.merge) if args.merge else None, new, args.stages)
    plan = {stage: predicted_seconds(stage, args.sizes) for stage in args.stages}
    logger.info(f'{", ".join(plan)} on {new["machine"]} at {new["commit"]}, budget {args.budget:g} s; predicted '
                f'on an H100 or H200: ' + ', '.join(f'{stage} {seconds:.0f} s' for stage, seconds in plan.items()))
    for stage, predicted in plan.items():
        left = args.budget - (time.perf_counter() - started) - RESERVE
        if stage in NEEDS_CUDA and args.device != 'cuda':
            status = f'skipped: needs CUDA ({NEEDS_CUDA[stage]})'
        elif predicted > left and not args.smoke:
            status = f'skipped: predicted {predicted:.0f} s, {max(left, 0):.0f} s left of the budget'
        else:
            logger.info(f'{stage}: starting ({left:.0f} s left)')
            stage_started = time.perf_counter()
            try:
                status = STAGES[stage](results, args, max(left, 1.0))
            except BaseException:  # Ctrl-C or SIGTERM: the file says so, with the figures the stage kept
                results.stage(stage, status='interrupted (its figures so far are kept)')
                raise
            results.stage(stage, seconds=round(time.perf_counter() - stage_started, 1),
                          predicted_seconds=round(predicted))
        results.stage(stage, status=status)
        logger.info(f'{stage}: {status}')
    logger.info(f'{time.perf_counter() - started:.0f} s -> {args.out}')
    return results


# ---- the stages run in a process of their own (`--stage`): each writes its figures as they come


def benchmark_setup(model: str, sizes: Sizes, device: str, folder: Path, images: int, decode: str = 'cpu',
                    workers: int | None = None):
    """loop_benchmark's pieces for `model` on `images` synthetic JPEGs written under `folder` (and, for a model that
    trains with token labels, their store): its BenchedModel."""
    from backbones.common.distributed import DistInfo
    from classification.loaders import ImageData
    from classification.recipes import recipe_for
    from classification.studies import loop_benchmark

    argv = ['--models', model, '--device', device, '--amp', session_amp(device), '--batch-size', str(sizes.batch_size),
            '--workers', str(workers or sizes.workers), '--seconds', f'{sizes.seconds:g}', '--decode', decode]
    argv += ['--min-batches', str(sizes.min_batches)] if sizes.min_batches else []
    args = loop_benchmark.parse_args(argv)
    root = loop_benchmark.synthetic_imagenet(folder / 'data', images)
    labels = loop_benchmark.synthetic_labels(root, folder / 'labels', torch.device(device)) \
        if recipe_for(model).uses_score_maps else None
    return loop_benchmark.BenchedModel(model, ImageData(root, labels), args, DistInfo(device=torch.device(device)))


ChildStage = Callable[[Sizes, str, Path, Callable[[str, object], None]], None]


def loop_stage(key: str, model_of: Callable[[Sizes], str]) -> ChildStage:
    """The whole loop (`--decode gpu`, `loop_workers` loader processes) against the trainer's step on one batch
    already on the device, in the same process, eager then compiled, with the loop's data-wait share (on a CPU:
    the workers decode, and the compiled pair is skipped: compiling there takes minutes and has no peak to
    compare); its figures go under `key`."""
    def run(sizes: Sizes, device: str, tmp: Path, save: Callable[[str, object], None]) -> None:
        from classification.engine.trainer import StepOptions
        from classification.studies import loop_benchmark

        model, decode, amp = model_of(sizes), 'gpu' if device == 'cuda' else 'cpu', session_amp(device)
        setup = benchmark_setup(model, sizes, device, tmp, images=sizes.images, decode=decode,
                                workers=sizes.loop_workers)
        batch = loop_benchmark.device_batch(setup, 'batched')
        figures: dict[str, object] = {}
        loops = {'how': f'the whole loop (the batched path, --decode {decode}, {sizes.loop_workers} workers, the '
                        f'prefetcher) and the trainer step ({amp} autocast, fused AdamW, channels-last) on one batch '
                        f'on the device, batch {sizes.batch_size}, each timed >= {sizes.seconds:g} s after its '
                        f'warm-up, eager and torch.compile; data_wait: the loop pass\'s share of time waiting for '
                        f'batches, its warm-up included', 'decode': decode, 'workers': sizes.loop_workers,
                 'models': {model: figures}}
        for label, compiled in (('eager', False), ('compiled', True)):
            if compiled and device != 'cuda':
                logger.info(f'{model}: the compiled step and loop are skipped on a CPU')
                continue
            options = StepOptions(compile=compiled)
            step = loop_benchmark.step_images_per_second(setup, batch, options, amp)
            loop = loop_benchmark.loop_images_per_second(setup, 'batched', options)
            figures[label] = {'step_img_s': step.images_per_second, 'loop_img_s': loop.images_per_second,
                              'loop_of_step': loop.images_per_second / step.images_per_second,
                              'data_wait': loop.data_wait,
                              'compiled_in_window': step.compiled_in_window + loop.compiled_in_window,
                              **loop_benchmark.step_flops(setup, step.images_per_second,
                                                          loop_benchmark.peak_tflops(setup.args))}
            save(key, loops)
    return run


def decoding_stage(sizes: Sizes, device: str, tmp: Path, save: Callable[[str, object], None]) -> None:
    """The batched path's input pipeline with `decode_workers` loader processes: JPEGs decoded by the workers, then
    by nvJPEG on the device (`--decode gpu`), each in its steady state."""
    from classification.studies import loop_benchmark

    figures = {'how': f'the batched path\'s input pipeline, {sizes.decode_workers} workers, batch {sizes.batch_size}, '
                      f'synthetic 500x375 JPEGs, each timed >= {sizes.seconds:g} s after its warm-up',
               'workers': sizes.decode_workers}
    for decode in ('cpu', 'gpu'):
        # epochs longer than the window: the workers are not started again inside it
        setup = benchmark_setup(sizes.model, sizes, device, tmp / f'data_{decode}', images=sizes.images,
                                decode=decode, workers=sizes.decode_workers)
        figures[f'{decode}_img_s'] = loop_benchmark.pipeline_images_per_second(setup, 'batched', sizes.decode_workers)
        save('decoding', figures)


def label_generation_stage(sizes: Sizes, device: str, tmp: Path, save: Callable[[str, object], None]) -> None:
    """The paper's annotator at its size (random weights time the same) as generate_token_labels runs it on each
    batch: the dense forward under fp32, then bf16 autocast, and the top-5 on fp32 scores, on a batch already on the
    device, each timed in its steady state (the decoding is the decoding stage's)."""
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
        window = SteadyWindow(sizes.seconds, sizes.min_batches or 20, warmup=2, device=on)
        with torch.no_grad():
            for images in window.batches(itertools.repeat(batch)):
                with autocast(on, amp):
                    scores = dense_scores(model, images['image'])
                scores.float().topk(5, dim=-1)
        key = 'fp32_img_s' if amp == 'none' else 'bf16_img_s'
        figures[key] = window.images_per_second()
        logger.info(f"label generation's forward, {'fp32' if amp == 'none' else amp}: {figures[key]:.1f} img/s")
        save('label_generation', figures)


def dense_steps_stage(sizes: Sizes, device: str, tmp: Path, save: Callable[[str, object], None]) -> None:
    """The training step of UperNet, Mask R-CNN and the depth model on LV-ViT-S as train_seg runs each config (its
    optimizer, its per-GPU batch, fp32 as the configs train), on batches of the data sets' sizes made by the
    config's own pipeline, each timed in its steady state (classification/studies/dense_step_benchmark.py)."""
    from classification.studies.dense_step_benchmark import time_dense_step

    figures: dict[str, object] = {
        'how': f"each config's training step on batches its training pipeline made from synthetic images of the "
               f"data set's usual size (x{sizes.dense_scale:g}), the logged losses read each step as mmengine's loop "
               f"does, timed >= {sizes.dense_seconds:g} s after {sizes.dense_warmup} steps", 'configs': {}}
    for config in DENSE_CONFIGS:
        step = time_dense_step(config, torch.device(device), sizes.dense_seconds, sizes.min_batches or 20,
                               sizes.dense_warmup, scale=sizes.dense_scale, batch_size=sizes.dense_batch)
        logger.info(f'{config}: {step.img_s:.1f} img/s ({step.it_s:.2f} it/s of {step.batch_size})')
        figures['configs'][Path(config).stem] = step.as_dict()
        save('dense_steps', figures)


def dense_windows_stage(sizes: Sizes, device: str, tmp: Path, save: Callable[[str, object], None]) -> None:
    """Mask R-CNN's training step with ViTDet's window attention against global attention, each in a fresh process
    (`dense_steps_stage`'s sizes), their ratios of step time and peak memory."""
    from classification.studies.dense_step_benchmark import compare_window_attention

    windows = compare_window_attention(torch.device(device), sizes.dense_seconds, sizes.min_batches or 20,
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


def run_child_stage(name: str, out: Path, sizes: Sizes, device: str) -> None:
    written: dict[str, object] = {}

    def save(key: str, value: object) -> None:
        written[key] = value
        write_json_atomic(out, written)

    with tempfile.TemporaryDirectory(prefix='measure_gpu_') as tmp:  # SIGINT at a limit still removes it
        CHILD_STAGES[name](sizes, device, Path(tmp), save)


def stage_list(text: str) -> list[str]:
    """`--stages`: stage names separated by commas, run in the order of value whatever order they are given in."""
    names = [name.strip() for name in text.split(',') if name.strip()]
    unknown = [name for name in names if name not in STAGE_ORDER]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f'{", ".join(unknown) or "no stage"}: the stages are '
                                         f'{", ".join(STAGE_ORDER)}')
    return [stage for stage in STAGE_ORDER if stage in names]


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    p = command_parser(description, 'measure_gpu.py')
    p.add_argument('--stages', type=stage_list, default=list(DEFAULT_STAGES), help=(
        f'the stages of this call, separated by commas (default {",".join(DEFAULT_STAGES)}: the figures no session '
        f'has measured; the others are {", ".join(s for s in STAGE_ORDER if s not in DEFAULT_STAGES)}), run in the '
        f'order {", ".join(STAGE_ORDER)}'))
    p.add_argument('--out', type=output_file, help='the results file: every figure is written into it as it comes '
                   '(on the device machine, under $OUT, so that it comes back)')
    p.add_argument('--merge', help="an earlier call's results file to add this call's figures to (the same device "
                                   'and commit)')
    p.add_argument('--timm-train', help="timm's train.py, from a clone of timm's repository at the installed timm's "
                                        'version (loop_benchmark: without it the suite is not timed against it)')
    p.add_argument('--commit', help="the source's commit, where this copy has no git history (a device machine's)")
    p.add_argument('--budget', type=positive_float, default=540.0,
                   help='seconds this call may take (default 540: a call is at most 10 minutes, the install before '
                        'it included); a stage whose predicted length does not fit what is left is skipped, the last '
                        'one stopped at the budget')
    p.add_argument('--seconds', type=non_negative_float,
                   help=f'each timing window\'s least length (default {GPU.seconds:g}, the dense steps\' '
                        f'{GPU.dense_seconds:g}; smoke {SMOKE.seconds:g})')
    add_device_argument(p)  # cpu only with --smoke
    p.add_argument('--smoke', action='store_true', help='tiny sizes, for a CPU: every stage runs its code once, the '
                                                        'stages that need CUDA skipped with a line saying so')
    p.add_argument('--stage', choices=sorted(CHILD_STAGES), help=argparse.SUPPRESS)  # the stages' own processes
    p.add_argument('--stage-out', help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    args = build_parser(description).parse_args(argv)
    if args.device is None and not args.smoke and not torch.cuda.is_available():
        raise UsageError('no GPU is visible: this tool measures a GPU (--smoke --device cpu runs it at tiny sizes)')
    args.device = device_name(args.device)
    if args.device == 'cpu' and not args.smoke:
        raise UsageError('--device cpu: only with --smoke (the figures are a GPU\'s)')
    sizes = SMOKE if args.smoke else GPU
    if args.seconds is not None:
        sizes = replace(sizes, seconds=args.seconds, dense_seconds=args.seconds)
    args.sizes = sizes
    if args.stage:
        run_child_stage(args.stage, Path(args.stage_out), args.sizes, args.device)
        return 0
    if args.out is None:
        raise UsageError('give --out, the results file')
    if args.timm_train and not Path(args.timm_train).is_file():
        raise UsageError(f'--timm-train {args.timm_train}: no such file')
    results = run_stages(args, argv)
    failed = [name for name, stage in results.data.get('stages', {}).items()
              if str(stage.get('status', '')).startswith('failed')]
    if failed:  # the figures measured are kept in the file; the call is not a success
        logger.error(f'{", ".join(failed)} failed (their output is above); the other figures are in {args.out}')
        return 1
    return 0
