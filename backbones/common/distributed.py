"""torchrun process groups (NCCL on GPU, gloo on CPU), reductions, and a sample's place in a training pass (the
samplers themselves are `classification.engine.samplers`)."""
from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import torch
import torch.distributed as dist

from backbones.common.devices import resolve_device
from backbones.common.log import logger

T = TypeVar('T')


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device('cpu')

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str | None = None) -> DistInfo:
    """Join the process group torchrun describes in the environment (or run alone); pick this process's device."""
    world_size = int(os.environ.get('WORLD_SIZE', 1))
    local_rank = int(os.environ.get('LOCAL_RANK', 0))
    use_cuda = resolve_device(device)
    dev = torch.device('cuda', local_rank) if use_cuda else torch.device('cpu')
    if use_cuda:
        torch.cuda.set_device(dev)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group('nccl' if use_cuda else 'gloo')
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank != 0:
        logger.setLevel('ERROR')  # the main process speaks for all: they run the same code
    return DistInfo(rank, world_size, local_rank, dev)


def run_distributed(run: Callable[[DistInfo], T], device: str | None = None) -> T:
    """`run(info)` in the process group torchrun describes (or alone), leaving the group afterwards."""
    info = init_distributed(device)
    try:
        return run(info)
    finally:
        cleanup(info)


def computed_once(compute: Callable[[], T], info: DistInfo) -> T:
    """`compute()` in the main process alone, its result (or error) given to every process."""
    if not info.distributed:
        return compute()
    box: list = [None]
    if info.is_main:
        try:
            box[0] = (True, compute())
        except Exception as e:  # every process stops with the same one-line error
            box[0] = (False, e)
    dist.broadcast_object_list(box, src=0)
    ok, value = box[0]
    if not ok:
        raise value
    return value


def barrier(info: DistInfo) -> None:
    if info.distributed:
        dist.barrier()


def cleanup(info: DistInfo) -> None:
    if info.distributed and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(values: Sequence[float], info: DistInfo) -> list[float]:
    """Sum numbers over all processes (float64 on this process's device)."""
    t = torch.tensor(list(values), dtype=torch.float64, device=info.device)
    if info.distributed:
        dist.all_reduce(t)
    return t.tolist()


@functools.cache
def on_device(constant: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A constant tensor's copy on `device`, made once: a copy from the host every batch would make the host wait."""
    return constant.to(device)


class HostCopy(NamedTuple):
    """A tensor on its way to host memory without the host waiting (on a GPU: pinned, an event `read` waits for)."""

    host: torch.Tensor
    arrived: torch.cuda.Event | None

    @classmethod
    def of(cls, tensor: torch.Tensor) -> 'HostCopy':
        if tensor.device.type != 'cuda':
            return cls(tensor, None)
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        arrived = torch.cuda.Event()
        arrived.record(torch.cuda.current_stream(tensor.device))
        return cls(host, arrived)

    def read(self) -> torch.Tensor:
        if self.arrived is not None:
            self.arrived.synchronize()
        return self.host


class LaggingSum:
    """Sums of a few numbers over all processes, read one round late (no round waits for the device)."""

    def __init__(self, info: DistInfo, size: int) -> None:
        self.info, self.size = info, size
        self.pending: HostCopy | None = None

    def exchange(self, values: Sequence[float]) -> list[float]:
        previous = self.read()
        summed = torch.tensor(list(values), dtype=torch.float64)
        if self.info.device.type == 'cuda':
            summed = summed.pin_memory().to(self.info.device, non_blocking=True)
        if self.info.distributed:
            dist.all_reduce(summed, async_op=True).wait()  # on a GPU the training stream waits, not the host
        self.pending = HostCopy.of(summed)
        return previous

    def read(self) -> list[float]:
        return [0.0] * self.size if self.pending is None else self.pending.read().tolist()


class SamplePlace(NamedTuple):
    """A sample as a training loader draws it: the dataset's `index`, drawn `position`-th in process `rank`'s share
    of the pass, which its augmentation's draws follow (the same in any loader worker, not for a repeated copy)."""

    rank: int
    position: int
    index: int
