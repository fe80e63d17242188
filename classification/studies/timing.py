"""Timing for the benchmarks and studies: a fixed number of calls (torch's benchmark Timer, which waits for the GPU),
a steady-state window of batches or training updates, the seconds of one call, and the cores this process may use."""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import torch
import torch.utils.benchmark as torch_benchmark


def seconds_per_call(fn: Callable[[], object], steps: int, warmup: int = 1) -> float:
    """Mean seconds of a call of `fn` over `steps` after `warmup` (torch's Timer: it waits for the GPU)."""
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


T = TypeVar('T')


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """`fn()` and the wall-clock seconds it took."""
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


class SteadyWindow:
    """A steady-state timing of batches or of updates: after `warmup`, at least `seconds` and `min_batches`."""

    def __init__(self, seconds: float, min_batches: int, warmup: int,
                 device: torch.device = torch.device('cpu')) -> None:
        if warmup < 1:
            raise ValueError(f'a steady-state window needs a warm-up of at least one batch, got {warmup}')
        self.seconds, self.min_batches, self.warmup, self.device = seconds, min_batches, warmup, device
        self.images, self.timed, self.started = 0, 0, None
        self.first = 0  # the batch the clock started after

    def done(self, count: int, images: int) -> bool:
        """Batch `count` (from 1) is done, with `images` images since the last call: whether the window is complete."""
        if self.started is None:
            if count >= self.warmup:
                synchronize(self.device)
                self.started, self.first = time.perf_counter(), count
            return False
        self.images += images
        self.timed = count - self.first
        return self.timed >= self.min_batches and time.perf_counter() - self.started >= self.seconds

    def batches(self, source: Iterable[dict]) -> Iterator[dict]:
        """The batches of `source` (dicts with a 'label' per image) until the window is complete."""
        for count, batch in enumerate(source, 1):
            yield batch
            if self.done(count, len(batch['label'])):
                return

    def images_per_second(self) -> float:
        synchronize(self.device)
        return self.images / (time.perf_counter() - self.started)


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity, which a job scheduler may narrow)."""
    return len(os.sched_getaffinity(0))
