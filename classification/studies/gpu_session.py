"""One borrowed GPU machine's measurements, stage by stage, the stages of one device call chosen with `--stages`
(tools/measure_gpu.py); `--plan BUDGET` says which calls a session's device time holds.

The stages, in the order of value (the default the first five, what two calls of one session hold): `sync_canary`,
the sync-debug test of the loop with `--decode gpu`; `deit_loop`, DeiT-S's whole loop with `--decode gpu` against its
step in the same process, eager and compiled; `lvvit_loop`, the same for LV-ViT-S with token labeling; `decoding`,
nvJPEG against the workers' decoding; `label_generation`, bf16 label generation against fp32; then by name
`dense_steps` (UperNet's, Mask R-CNN's and the depth model's training steps), `dense_windows` (Mask R-CNN with window
attention against global), `loop_benchmark` (the suite against timm's train.py) and `gpu_tests` (`pytest -m gpu`).
Each stage runs in a process of its own, in the call's work folder (its data shared), under the call's remaining
time (`--budget`) and 1.5 times its predicted length: one that no longer fits is skipped, one stopped keeps what it
measured; every figure is written into the results file as it comes, merged across calls (`--merge`). `--smoke`
runs every stage at tiny sizes (on a CPU the loops eager, decoding without nvJPEG, the GPU tests skipped); the tests
run it.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from backbones.common.cli import command_parser, non_negative_float, positive_float
from backbones.common.commands import write_document
from backbones.common.devices import add_device_argument, device_name
from backbones.common.errors import DataError, UsageError
from backbones.common.files import write_json_atomic
from backbones.common.log import logger
from backbones.common.outputs import output_file
from classification.studies.launcher import LaunchedCommand, tool_command
from classification.studies.results_file import check_envelope, checkout_commit, machine_slug, results_document

AMP = 'bf16'


# the wheels a session carries to the device machine (`--plan` prints their download): what the stages import
# (`imported_modules`) that the machine's image (DEVICE_IMAGE) lacks or holds at another version (timm), the
# versions this checkout's environment has, for the image's Python 3.12
CARRIED_WHEELS = ('mmengine==0.10.7', 'mmcv-lite==2.1.0', 'mmsegmentation==1.2.2', 'timm==1.0.31', 'ftfy==6.3.1',
                  'pycocotools==2.0.11', 'simplejpeg==1.9.0', 'addict', 'yapf', 'termcolor', 'prettytable', 'wcwidth',
                  'platformdirs', 'setuptools<82')
# the distributions of the device machine's image, 'cuda' (the device tool's KINDS.md, read on 2026-11-17)
DEVICE_IMAGE = frozenset((
    'absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build '
    'certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings '
    'cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils '
    'execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet '
    'httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax '
    'jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning '
    'lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib '
    'mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind '
    'narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti '
    'nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand '
    'nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink '
    'nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax '
    'opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip '
    'pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments '
    'pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout '
    'pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors '
    'scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers '
    'setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard '
    'tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch '
    'torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton '
    'typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash '
    'yarl zipp '
).split())


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
    # windows: 50 skipped updates and 15 s at up to 10,000 img/s, above the compiled step's 8,494 on an H200)
    images: int
    seconds: float  # each timing window's least length
    min_batches: int | None  # the step, loop and pipeline windows' fewest batches (None: benchmark_loop's default)
    slow_min_batches: int  # the fewest of the slow steps' windows: label generation's and the dense steps'
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


# 15 s windows: a window's figure settles within seconds of its start; the batch floor keeps a fast step's window from
# being a handful of batches (50 of DeiT-S's compiled steps take 1.5 s on an H200, 20 of NFNet-F6's fp32 ones ~5 s)
GPU = Sizes(model='deit_small_patch16_224', batch_size=256, workers=15, images=200_000, seconds=15.0,
            min_batches=50, slow_min_batches=20, skip_updates=50, loop_workers=11, decode_workers=4,
            annotator='dm_nfnet_f6', annotator_size=576, label_batch=32, token_labeling_model='lvvit_s',
            dense_scale=1.0, dense_batch=None, dense_seconds=15.0, dense_warmup=5)
SMOKE = Sizes(model='deit_tiny_patch16_224', batch_size=4, workers=1, images=64, seconds=0.0, min_batches=1,
              slow_min_batches=1, skip_updates=1, loop_workers=1, decode_workers=1, annotator='resnet10t',
              annotator_size=64, label_batch=2, token_labeling_model='lvvit_t', dense_scale=0.125, dense_batch=2,
              dense_seconds=0.0, dense_warmup=1)

STAGE_ORDER = ('sync_canary', 'deit_loop', 'lvvit_loop', 'decoding', 'label_generation', 'dense_steps',
               'dense_windows', 'loop_benchmark', 'gpu_tests')
# what two calls of one session's 15 device minutes hold (`session_plan`): the canary first, then the figures no
# session has measured, in the order of value
DEFAULT_STAGES = ('sync_canary', 'deit_loop', 'lvvit_loop', 'decoding', 'label_generation')
DENSE_CONFIGS = ('seg_configs/upernet_lvvit_s.py', 'seg_configs/maskrcnn_lvvit_s.py', 'seg_configs/depth_lvvit_s.py')
# the sync-debug test of the loop with the prefetcher and nvJPEG, eager and compiled: code never run on CUDA before
# the session fails here in seconds, not inside a timed stage
SYNC_CANARY = tuple(f'tests/test_gpu.py::test_nothing_between_two_updates_of_the_cuda_loop_waits_for_the_device'
                    f'[gpu-{compiled}]' for compiled in (False, True))
RESERVE = 15.0  # seconds a call keeps for writing its file after its last stage
LIMIT_FACTOR = 1.5  # a stage is killed at this multiple of its predicted length (a hang must not eat the call)
MAX_CALL = 540.0  # a device call's budget: 10 minutes at most, the wheels' install before it included
MACHINE_START = 90.0  # device seconds a session spends before its first call: the machine's start (1 to 2 minutes)
CALL_OVERHEAD = 30.0  # device seconds a call spends beside its budget: the tree's transfer, the wheels' install

# what a stage builds before it measures, in the call's work folder (`--work`), shared by the call's later stages;
# estimates from the sessions' 60 s for a loop stage's start, its 320,000 entries and a batch, none timed alone
SETUP_SECONDS = {'data': 20.0,  # 64 distinct synthetic JPEGs, the other 199,936 entries hard links to them
                 'labels': 15.0}  # a resnet10t annotator's maps of the distinct JPEGs, the store of every entry
STAGE_NEEDS = {'deit_loop': ('data',), 'lvvit_loop': ('data', 'labels'), 'decoding': ('data',)}


def predicted_seconds(stage: str, sizes: Sizes, built: frozenset[str] = frozenset()) -> float:
    """A stage's length on one H100 or H200 with `sizes` (from the 2026-11-26 and 2026-11-28 sessions: 16 cores,
    torch 2.11), `built` the shared data an earlier stage of the call has made: its start-up, what it builds, its
    untimed warm-ups and each timing window. A smoke run's own lengths are in its results file."""
    window, dense = sizes.seconds, sizes.dense_seconds
    start = 15  # the process's imports, the model built, one batch on the device
    step = (window + 5) + (window + 70)  # eager; compiled (compiling first)
    # eager (the workers' prefetch first); compiled: the step's compiled model, so the workers' prefetch again
    loop = (window + 25) + (window + 25)
    setup = sum(SETUP_SECONDS[part] for part in STAGE_NEEDS.get(stage, ()) if part not in built)
    return setup + {
        'sync_canary': 90.0,  # pytest's start 15, its images and labels 10, the eager run 20, the compiled 45
        'loop_benchmark': 60 + 8 * (window + 6) + 2 * (45 + window),  # its own data; 8 windows; train_cls and timm
        'deit_loop': start + step + loop,
        'lvvit_loop': start + step + loop,
        'gpu_tests': 420.0,  # 400-450 s on 2026-11-28
        'decoding': 10 + 2 * (window + 15),  # the start; the workers' decoding, then nvJPEG, each its workers' start
        'label_generation': 40 + 2 * (window + 10),  # the annotator built; fp32, then bf16
        # never run on a GPU: per config (the window comparison's two), building it and its batches, then the
        # warm-up and the window
        'dense_steps': len(DENSE_CONFIGS) * (20 + dense + 10),
        'dense_windows': 2 * (20 + dense + 10)}[stage]


def call_predictions(stages: list[str], sizes: Sizes) -> dict[str, float]:
    """Each stage's predicted length in one call that runs `stages` in order: the shared data is built once, by the
    first stage that needs it."""
    built: frozenset[str] = frozenset()
    predicted = {}
    for stage in stages:
        predicted[stage] = predicted_seconds(stage, sizes, built)
        built |= frozenset(STAGE_NEEDS.get(stage, ()))
    return predicted


@dataclass(frozen=True)
class Call:
    """One device call of a session's plan."""
    stages: tuple[str, ...]
    budget: float  # its --budget
    predicted: float  # its stages' predicted lengths and its reserve


def session_plan(device_seconds: float, stages: list[str], sizes: Sizes = GPU) -> tuple[list[Call], list[str]]:
    """The device calls a session with `device_seconds` should make, and the stages that fit none: the machine's
    start taken first, then calls of at most MAX_CALL seconds (each CALL_OVERHEAD beside it), each holding what
    fits of the stages not yet placed, in order (its shared data built by its first stage that needs it)."""
    left, calls, remaining = device_seconds - MACHINE_START, [], list(stages)
    while remaining and left - CALL_OVERHEAD > RESERVE:
        budget = min(MAX_CALL, left - CALL_OVERHEAD)
        chosen = fitting(remaining, sizes, budget - RESERVE)
        if not chosen:
            break
        calls.append(Call(tuple(chosen), budget, sum(call_predictions(chosen, sizes).values()) + RESERVE))
        remaining = [stage for stage in remaining if stage not in chosen]
        left -= budget + CALL_OVERHEAD
    return calls, remaining


def fitting(stages: list[str], sizes: Sizes, room: float) -> list[str]:
    """The stages, in order, that one call with `room` seconds holds: each where it still fits."""
    chosen: list[str] = []
    for stage in stages:
        if sum(call_predictions([*chosen, stage], sizes).values()) <= room:
            chosen.append(stage)
    return chosen


def plan_lines(device_seconds: float, stages: list[str]) -> list[str]:
    """`--plan`: the wheels to prepare, then each call's command line with its predicted seconds, then the stages
    that do not fit."""
    calls, unfitted = session_plan(device_seconds, stages)
    lines = [f'{device_seconds:g} s of device time: {MACHINE_START:g} s for the machine\'s start, then {len(calls)} '
             f'call(s), each {CALL_OVERHEAD:g} s beside its budget (the transfers, the wheels\' install)',
             'prepare: python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation '
             'cp \\', '    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl \\',
             '    ' + ' '.join(f"'{wheel}'" if '<' in wheel else wheel for wheel in CARRIED_WHEELS)]
    for number, call in enumerate(calls, 1):
        predicted = call_predictions(list(call.stages), GPU)
        merge = '--merge .gpu/gpu.json ' if number > 1 else ''
        lines += [f'call {number}, predicted {call.predicted:.0f} s ('
                  + ', '.join(f'{stage} {seconds:.0f} s' for stage, seconds in predicted.items())
                  + f', its reserve {RESERVE:g} s):',
                  f'    python3 tools/measure_gpu.py --stages {",".join(call.stages)} --budget {call.budget:.0f} '
                  f'{merge}--out $OUT/gpu.json --commit $C']
    fitted_none = ', '.join(f'{stage} ({predicted_seconds(stage, GPU):.0f} s)' for stage in unfitted)
    return lines + [f'not fitting: {fitted_none or "none"}']


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
    """A new session's results document: the machine, the versions, the source's commit (`commit`, else git's:
    a device machine's copy of the working tree may have no history, or a stale one) and the date."""
    import timm
    import torchvision

    checked = checkout_commit()
    if commit and not (checked and (checked.startswith(commit) or commit.startswith(checked))):
        # a device machine's copy may hold a stale history, or one git cannot read there: --commit is the source's
        logger.warning(f'--commit {commit}: this copy\'s git says {checked or "nothing readable"}; the figures are '
                       f'recorded at {commit}')
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


def pytest_stage(key: str, tests: tuple[str, ...], what: str) -> Callable[[Results, argparse.Namespace, float], str]:
    """`pytest -m gpu TESTS` (`what` in messages), each test's outcome recorded under `key` as it comes (a run
    stopped by its limit keeps the outcomes it reached; on a CPU every test is a skip)."""
    def run(results: Results, args: argparse.Namespace, limit: float) -> str:
        outcomes: dict[str, str] = {}
        failures: dict[str, str] = {}
        started = time.perf_counter()

        def record(timed_out: bool = False) -> None:
            counted = {kind: sum(1 for o in outcomes.values() if o == kind) for kind in ('PASSED', 'FAILED', 'SKIPPED')}
            results.update(key, {
                'how': f'python -m pytest -m gpu {" ".join(tests)}', 'passed': counted['PASSED'],
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

        with LaunchedCommand([sys.executable, '-m', 'pytest', '-m', 'gpu', *tests, '-v', '-rfE', '-p',
                              'no:cacheprovider'], what, limit=limit) as run:  # stopped: pytest's summary
            status = run.wait(on_line)
        record(timed_out=status is None)
        return outcome(status, 'some tests failed, recorded with their messages' if status == 1 else None)
    return run


def child_stage(name: str) -> Callable[[Results, argparse.Namespace, float], str]:
    """A stage run in a process of its own (this tool's `--stage NAME`) in the call's work folder: it writes its
    figures into a file of its own as they come, merged here when it ends or is stopped, and the modules it imported
    into its stage's record."""
    def run(results: Results, args: argparse.Namespace, limit: float) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            figures = Path(tmp) / f'{name}.json'
            command = tool_command('measure_gpu', [
                '--stage', name, '--stage-out', figures, '--work', args.work, '--device', args.device,
                *(['--smoke'] if args.smoke else []),
                *(['--seconds', f'{args.seconds:g}'] if args.seconds is not None else [])])
            try:  # the compiler's cache in the work folder too: nothing of the call is left behind
                with LaunchedCommand(command, limit=limit,
                                     env={'TORCHINDUCTOR_CACHE_DIR': str(Path(args.work) / 'inductor')}) as stage:
                    status = stage.wait(lambda line: logger.info(f'  {line}'))
            finally:  # an interrupted stage's figures so far are kept too (the child writes its file atomically)
                if figures.is_file():
                    written = json.loads(figures.read_text())
                    results.stage(name, modules=written.pop(MODULES, []))
                    for key, value in written.items():
                        results.update(key, value)
        return outcome(status)
    return run


STOPPED = 'stopped at its time limit (its figures so far are kept)'


def outcome(status: int | None, known: str | None = None) -> str:
    if status is None:
        return STOPPED
    return 'done' if status == 0 else known or f'failed (exit {status}): its output is above'


STAGES: dict[str, Callable[[Results, argparse.Namespace, float], str]] = {
    'sync_canary': pytest_stage('sync_canary', SYNC_CANARY, 'the sync canary'),
    'loop_benchmark': loop_benchmark_stage, 'deit_loop': child_stage('deit_loop'),
    'lvvit_loop': child_stage('lvvit_loop'),
    'gpu_tests': pytest_stage('gpu_tests', ('tests/test_gpu.py',), 'the GPU suite'),
    'decoding': child_stage('decoding'), 'label_generation': child_stage('label_generation'),
    'dense_steps': child_stage('dense_steps'), 'dense_windows': child_stage('dense_windows')}


def stage_limit(predicted: float, left: float, smoke: bool) -> tuple[float, bool]:
    """A stage's time limit and whether it is its own (LIMIT_FACTOR times its prediction) rather than what is left
    of the call; a smoke run's stages have only the call's (a CPU's lengths are not predicted)."""
    own = LIMIT_FACTOR * predicted
    return (own, True) if own < left and not smoke else (max(left, 1.0), False)


def run_stages(args: argparse.Namespace, argv: list[str] | None) -> Results:
    """The chosen stages in the order of value in one work folder (their shared data, removed at the end), each
    under its own limit and the call's remaining time, skipped with a line where its predicted length no longer
    fits."""
    started = time.perf_counter()
    new = session_document(args.device, args.commit, args.smoke, argv)
    results = open_results(Path(args.out), Path(args.merge) if args.merge else None, new, args.stages)
    plan = call_predictions(args.stages, args.sizes)
    logger.info(f'{", ".join(plan)} on {new["machine"]} at {new["commit"]}, budget {args.budget:g} s; predicted '
                f'on an H100 or H200: ' + ', '.join(f'{stage} {seconds:.0f} s' for stage, seconds in plan.items()))
    with tempfile.TemporaryDirectory(prefix='measure_gpu_') as work:
        args.work = work
        logger.info(f'work folder {work}')
        for stage, predicted in plan.items():
            run_stage(stage, predicted, args.budget - (time.perf_counter() - started) - RESERVE, results, args)
    logger.info(f'{time.perf_counter() - started:.0f} s -> {args.out}')
    return results


def run_stage(stage: str, predicted: float, left: float, results: Results, args: argparse.Namespace) -> None:
    """One stage, recorded with its status: skipped where its prediction does not fit what is `left`, killed at its
    limit (recorded as timed out where the limit was its own), its figures kept either way."""
    if predicted > left and not args.smoke:
        status = f'skipped: predicted {predicted:.0f} s, {max(left, 0):.0f} s left of the budget'
    else:
        limit, own = stage_limit(predicted, left, args.smoke)
        logger.info(f'{stage}: starting ({left:.0f} s left, its limit {limit:.0f} s)')
        stage_started = time.perf_counter()
        try:
            status = STAGES[stage](results, args, limit)
        except BaseException:  # Ctrl-C or SIGTERM: the file says so, with the figures the stage kept
            results.stage(stage, status='interrupted (its figures so far are kept)')
            raise
        if status == STOPPED and own:
            status = (f'timed out: killed at {limit:.0f} s, {LIMIT_FACTOR:g}x its predicted {predicted:.0f} s (its '
                      f'figures so far are kept)')
        results.stage(stage, seconds=round(time.perf_counter() - stage_started, 1),
                      predicted_seconds=round(predicted))
    results.stage(stage, status=status)
    logger.info(f'{stage}: {status}')


# ---- the stages run in a process of their own (`--stage`): each writes its figures as they come


def benchmark_setup(model: str, sizes: Sizes, device: str, folder: Path, images: int, decode: str = 'cpu',
                    workers: int | None = None):
    """loop_benchmark's pieces for `model` on `images` synthetic JPEGs under `folder` (and, for a model that trains
    with token labels, their store), made by the call's first stage that needs them: its BenchedModel."""
    from backbones.common.distributed import DistInfo
    from classification.loaders import ImageData
    from classification.recipes import recipe_for
    from classification.studies import loop_benchmark

    argv = ['--models', model, '--device', device, '--amp', session_amp(device), '--batch-size', str(sizes.batch_size),
            '--workers', str(workers or sizes.workers), '--seconds', f'{sizes.seconds:g}', '--decode', decode]
    argv += ['--min-batches', str(sizes.min_batches)] if sizes.min_batches else []
    args = loop_benchmark.parse_args(argv)
    root = built_once(folder / 'data', lambda path: loop_benchmark.synthetic_imagenet(path, images))
    labels = built_once(folder / 'token_labels', lambda path: loop_benchmark.synthetic_labels(
        root, path / 'store', torch.device(device))) / 'store' if recipe_for(model).uses_score_maps else None
    return loop_benchmark.BenchedModel(model, ImageData(root, labels), args, DistInfo(device=torch.device(device)))


def built_once(path: Path, build: Callable[[Path], object]) -> Path:
    """`path`, made by `build` unless an earlier stage of the call finished making it (its marker beside it says
    so): what a stage killed while building left is removed and made again."""
    marker = path.with_name(f'{path.name}.built')
    if not marker.exists():
        shutil.rmtree(path, ignore_errors=True)
        build(path)
        marker.touch()
    return path


ChildStage = Callable[[Sizes, str, Path, Callable[[str, object], None]], None]


def loop_stage(key: str, model_of: Callable[[Sizes], str]) -> ChildStage:
    """The whole loop (`--decode gpu`, `loop_workers` loader processes) against the trainer's step on one batch
    already on the device, in the same process and on the same model (the loop trains the model the step timing
    compiled), eager then compiled, with the loop's data-wait share (on a CPU:
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
    """The batched path's input pipeline with `decode_workers` loader processes: JPEGs decoded by the workers, then
    by nvJPEG on the device (`--decode gpu`; not on a CPU), each in its steady state."""
    from classification.studies import loop_benchmark

    figures = {'how': f'the batched path\'s input pipeline, {sizes.decode_workers} workers, batch {sizes.batch_size}, '
                      f'synthetic 500x375 JPEGs, each timed >= {sizes.seconds:g} s after its warm-up',
               'workers': sizes.decode_workers}
    for decode in ('cpu', 'gpu'):
        if decode == 'gpu' and device != 'cuda':
            logger.info('decoding: nvJPEG is skipped on a CPU')
            continue
        # epochs longer than the window: the workers are not started again inside it
        setup = benchmark_setup(sizes.model, sizes, device, tmp, images=sizes.images, decode=decode,
                                workers=sizes.decode_workers)
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
        window = SteadyWindow(sizes.seconds, sizes.slow_min_batches, warmup=2, device=on)
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
    config's own pipeline, each timed in its steady state (classification/studies/dense/training_step.py)."""
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
    """Mask R-CNN's training step with ViTDet's window attention against global attention, each in a fresh process
    (`dense_steps_stage`'s sizes), their ratios of step time and peak memory."""
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
    """Stage `name` in the call's work folder, its figures written into `out` as they come, then the modules it
    imported (`imported_modules`)."""
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
        f'the stages of this call, separated by commas (default {",".join(DEFAULT_STAGES)}: the canary and the '
        f'figures no session has measured that two calls of one session hold (--plan); the others are '
        f'{", ".join(s for s in STAGE_ORDER if s not in DEFAULT_STAGES)}), run in the '
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
    p.add_argument('--plan', type=positive_float, metavar='BUDGET',
                   help="print the calls a session with BUDGET seconds of device time should make (the machine's "
                        'start included) for --stages, and the stages that do not fit; measure nothing')
    p.add_argument('--stage', choices=sorted(CHILD_STAGES), help=argparse.SUPPRESS)  # the stages' own processes
    p.add_argument('--stage-out', help=argparse.SUPPRESS)
    p.add_argument('--work', help=argparse.SUPPRESS)  # the call's work folder, where its stages share their data
    return p


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    args = build_parser(description).parse_args(argv)
    if args.plan is not None:
        write_document('\n'.join(plan_lines(args.plan, args.stages)))  # the plan is this command's result
        return 0
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
        run_child_stage(args.stage, Path(args.stage_out), args.sizes, args.device, Path(args.work))
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
