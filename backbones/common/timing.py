"""Timing for the benchmarks: torch's benchmark Timer (it waits for the GPU), a GPU wait for wall-clock spans, and
what a figure was measured on."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import torch
import torch.utils.benchmark as torch_benchmark


def seconds_per_call(fn: Callable[[], object], steps: int, warmup: int = 1) -> float:
    """Mean seconds of one call of `fn` over `steps` calls after `warmup` ones (torch's benchmark Timer: it waits for
    the GPU, and here uses all of torch's threads)."""
    for _ in range(warmup):
        fn()
    timer = torch_benchmark.Timer(stmt='fn()', globals={'fn': fn}, num_threads=torch.get_num_threads())
    return timer.timeit(steps).mean


def images_per_second(step: Callable[[], None], batch_size: int, steps: int, warmup: int) -> float:
    return batch_size / seconds_per_call(step, steps, warmup)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a wall-clock span on a GPU ends when its kernels have run)."""
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity, which a job scheduler may narrow)."""
    return len(os.sched_getaffinity(0))


def measured_on(device: str) -> dict[str, object]:
    """What a figure needs beside it: the device in words, the cores, torch's version and the source's commit."""
    name = torch.cuda.get_device_name() if device == 'cuda' else 'CPU'
    try:
        commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=Path(__file__).parent, text=True,
                                capture_output=True, timeout=10).stdout.strip() or 'unknown'
    except OSError:  # no git
        commit = 'unknown'
    return {'device': name, 'cores': available_cores(), 'torch': torch.__version__, 'commit': commit}
