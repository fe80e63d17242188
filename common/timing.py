"""Timing for the benchmarks: torch's benchmark Timer (it waits for the GPU) and a GPU wait for wall-clock spans."""
from __future__ import annotations

from collections.abc import Callable

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
