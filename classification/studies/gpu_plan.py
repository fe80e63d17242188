"""What a GPU session runs (tools/measure_gpu.py; docs/speed.md, "A GPU session"): the stages in the order of value,
their sizes on a GPU and at smoke sizes, each stage's predicted length, and `--plan`: the device calls a session's
time holds, with the wheels a call carries to the device machine."""
from __future__ import annotations

from dataclasses import dataclass

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
    """The steps' precision: bf16 autocast on a GPU; fp32 on a CPU, where bf16 runs emulated."""
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
    min_batches: int  # the step, loop and pipeline windows' fewest batches
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
    """A stage's length on one H100 or H200 with `sizes` (the 2026-11 sessions' figures), `built` the shared data an
    earlier stage made: its start-up, what it builds, its warm-ups and its timing windows."""
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
    """Each stage's predicted length in one call of `stages`, each shared data built by its first stage."""
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
    """The device calls a session with `device_seconds` should make, and the stages that fit none: the machine's start
    first, then calls of at most MAX_CALL seconds, each holding the stages that fit, in order."""
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
    """`--plan`: the wheels to prepare, each call's command line and seconds, the stages that do not fit."""
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
