"""Where a command runs and in what precision: `--device` resolved (a GPU that is not there is an error), `--amp`
resolved per device (`pick_amp`), with their options declared once for every command that has them, and TF32 on CUDA
for the trainers (`use_tf32`)."""
from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

import torch

from backbones.common.errors import UsageError


def check_precision(args: argparse.Namespace) -> None:
    """--amp fp16 means the same in every command: refused before any work where the command runs on a CPU."""
    if getattr(args, 'amp', None) == 'fp16':
        pick_amp('fp16', torch.device(device_name(getattr(args, 'device', None))))


DEVICES = ('cpu', 'cuda')


def resolve_device(device: str | None) -> bool:
    """Whether to use CUDA for `--device` (None: when there is a GPU); a device that is not there is an error."""
    if device is None:
        return torch.cuda.is_available()
    if device not in DEVICES:
        raise UsageError(f'--device must be one of {", ".join(DEVICES)}, got {device!r}')
    if device == 'cuda' and not torch.cuda.is_available():
        raise UsageError('--device cuda: no GPU is visible to PyTorch here (torch.cuda.is_available() is False); '
                         'use --device cpu')
    return device == 'cuda'


def device_name(device: str | None) -> str:
    """`--device` resolved to 'cuda' or 'cpu' (`resolve_device`: a GPU that is not there is an error)."""
    return 'cuda' if resolve_device(device) else 'cpu'


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """`--device cpu|cuda` (without it: cuda when PyTorch sees a GPU; see `resolve_device`, `device_name`)."""
    parser.add_argument('--device', choices=DEVICES, help='where the command runs (default: cuda when PyTorch sees '
                        'a GPU, else cpu)')


AMP_CHOICES = ('auto', 'none', 'bf16', 'fp16')


AMP_MEANINGS = {'auto': 'bf16 on GPUs that have it, fp16 on older GPUs, none on CPUs',
                'none': 'float32 throughout',
                'bf16': 'bfloat16 autocast (CPUs run it too: faster where they have bf16 instructions)',
                'fp16': 'float16 autocast (GPUs only; training scales its loss)'}


# bf16 where a command's mixed precision runs on GPUs alone (train_seg: mmengine's AmpOptimWrapper)
BF16_ON_GPUS = 'bfloat16 autocast (GPUs only)'


# why the benchmarks' --amp is none unless asked, and the studies' --workers a number of their own
TIMED_IN_FP32 = 'the benchmark times float32 unless asked, so that its figures compare across devices and runs'


def add_amp_argument(parser: argparse.ArgumentParser, default: str = 'auto', why: str = '',
                     choices: tuple[str, ...] = AMP_CHOICES, alone: str | None = None, gpus_only: bool = False
                     ) -> None:
    """`--amp` (`pick_amp` resolves it): `choices` of AMP_CHOICES; `default` other than auto only with `why`;
    `alone`, what a bare `--amp` means; `gpus_only`, for a command whose bf16 runs on GPUs alone."""
    if not set(choices) <= set(AMP_CHOICES) or default not in choices or bool(why) != (default != 'auto'):
        raise ValueError(f'--amp: choices {choices} must be among {AMP_CHOICES}, the default {default!r} among '
                         'them, and a default other than auto needs its reason')
    meanings = {**AMP_MEANINGS, 'bf16': BF16_ON_GPUS} if gpus_only else AMP_MEANINGS
    text = 'mixed precision; ' + '; '.join(f'{choice}: {meanings[choice]}' for choice in choices)
    if why:
        text += f' (default: {default}, {why})'
    if alone:
        text += f'; --amp alone: {alone}'
    parser.add_argument('--amp', choices=choices, default=default, help=text,
                        **({'nargs': '?', 'const': alone} if alone else {}))


def pick_amp(amp: str, device: torch.device) -> str:
    """`--amp` resolved: auto is bf16 on GPUs that have it, fp16 on older GPUs, none on CPU (bf16 runs if asked)."""
    if amp != 'auto':
        if amp == 'fp16' and device.type != 'cuda':
            raise UsageError(f'--amp fp16 needs a GPU; this run is on {device} (--help says whether the command '
                             'runs bf16 on CPUs)')
        return amp
    if device.type != 'cuda':
        return 'none'
    return 'bf16' if torch.cuda.is_bf16_supported() else 'fp16'


def use_tf32(device: torch.device) -> None:
    """TensorFloat-32 matmuls and convolutions where `device` is CUDA, as timm's train.py sets them."""
    if device.type == 'cuda':
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to `count` inside the block, as they were after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
