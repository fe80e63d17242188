"""Training batches made ready ahead of their step: on the device, through the batch transform (the batched path's
decoding and device half, CIFAR's upsampling and augmentation), with the objective's targets made before the forward.

`Prefetcher` does it `DEPTH` batches ahead, on a GPU on a thread and a CUDA stream of their own (on a CPU in the same
order on the training thread). Each batch's random draws come from a generator seeded with the batch's own key,
never from the training thread's streams: a batch prepared ahead, in a resumed run or serially
(`Prefetcher(..., depth=0)`, `train_cls --serial-loop`) draws the same. docs/speed.md ("The loop at the step's pace")
tells the design."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple, Protocol

import torch

from backbones.common.distributed import DistInfo
from backbones.common.random_state import hash_seed

DEPTH = 2  # batches prepared ahead of the one a step takes


class BatchTransform(Protocol):
    def __call__(self, images, seed: int | None = None) -> torch.Tensor:
        """The model input of a batch's images on the device, its random draws from a generator seeded with `seed`."""


class Objective(Protocol):
    """What turns a batch and the model's output into the loss (the classification applications define them)."""

    def prepare(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, object]:
        """The images the model sees (mixed by mixup/cutmix, or as they are) and their targets, which the loss takes."""

    def loss(self, output, batch: dict, targets: object, device: torch.device) -> torch.Tensor:
        """The loss of the model's `output` on `batch`."""

    def targets_ahead(self, batch: dict, device: torch.device) -> dict:
        """`batch` with the targets the objective can make before the forward (no random draws), or as it is."""


def to_device(value, device: torch.device):
    """A batch value on `device`: what has `.to` copied without blocking the host, sequences element by element."""
    if isinstance(value, (list, tuple)):
        moved = [to_device(v, device) for v in value]
        return type(value)(*moved) if hasattr(value, '_fields') else type(value)(moved)  # named tuples too
    return value.to(device, non_blocking=True) if hasattr(value, 'to') else value


def tensors_in(value) -> Iterator[torch.Tensor]:
    """The tensors in a batch value: in its dicts, sequences and dataclasses (the batched path's packed regions)."""
    if isinstance(value, torch.Tensor):
        yield value
        return
    if isinstance(value, dict):
        value = list(value.values())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = [getattr(value, f.name) for f in dataclasses.fields(value)]
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors_in(v)


class OnThisThread(contextlib.AbstractContextManager):
    """An executor that runs each call at once, on the calling thread."""

    def __exit__(self, *_) -> None:
        return None

    def submit(self, fn, *args) -> Future:
        future = Future()
        try:
            future.set_result(fn(*args))
        except Exception as exc:  # raised when the batch's turn comes, as from a thread
            future.set_exception(exc)
        return future


@functools.cache
def preparing_stream(device: torch.device) -> torch.cuda.Stream:
    """One stream per device for every pass (one of torch's pool each pass would spread the cached memory)."""
    return torch.cuda.Stream(device)


class Prepared(NamedTuple):
    batch: dict
    done: torch.cuda.Event | None  # recorded on the preparing stream after the batch's last kernel (GPUs)


class BatchPreparation:
    """One batch made ready on `stream` (None: the current one): its tensors on the device, `transform` on its images
    with the batch's seed and, with `ahead`, the objective's targets made before the forward."""

    def __init__(self, info: DistInfo, transform: BatchTransform | None, objective: Objective, ahead: bool,
                 stream: torch.cuda.Stream | None) -> None:
        self.device, self.transform, self.objective = info.device, transform, objective
        self.ahead, self.stream = ahead, stream

    def __call__(self, batch: dict, seed: int) -> Prepared:
        with contextlib.nullcontext() if self.stream is None else torch.cuda.stream(self.stream):
            ready = {key: to_device(value, self.device) for key, value in batch.items()}
            if 'image' in ready:  # not a batch whose images were all unreadable (--skip-unreadable)
                if self.transform is not None:
                    ready['image'] = self.transform(ready['image'], seed)
                if self.ahead:
                    ready = self.objective.targets_ahead(ready, self.device)
            done = None
            if self.stream is not None:
                done = torch.cuda.Event()
                done.record(self.stream)
        return Prepared(ready, done)


class Prefetcher:
    """`prefetch(batches, seed, first)` yields each batch ready for its step, `depth` batches ahead (0: serially); batch
    n draws from `hash_seed(seed, n)`; a batch that fails to prepare raises in its turn."""

    def __init__(self, info: DistInfo, transform: BatchTransform | None, objective: Objective,
                 depth: int = DEPTH, thread: bool | None = None) -> None:
        self.device, self.depth = info.device, depth
        # a thread of its own where it works beside the step: on a GPU; on a CPU the step already takes the cores,
        # and a thread there only competes with it (the loop at x0.91 on 2 cores), so the batches are prepared
        # ahead in the same order on the training thread (`thread` chooses, for the tests)
        self.thread = self.device.type == 'cuda' if thread is None else thread
        if self.device.type == 'cuda' and self.device.index is None:  # the thread sets its device by index
            self.device = torch.device('cuda', torch.cuda.current_device())
        stream = preparing_stream(self.device) if depth and self.device.type == 'cuda' else None
        self.prepare = BatchPreparation(info, transform, objective, ahead=depth > 0, stream=stream)

    def __call__(self, batches: Iterable[dict], seed: int, first: int = 0) -> Iterator[dict]:
        numbered = ((batch, hash_seed(seed, n)) for n, batch in enumerate(batches, start=first))
        if not self.depth:
            yield from (self.prepare(batch, key).batch for batch, key in numbered)
            return
        pending: deque[Future] = deque()
        ahead = 0  # the first batch alone, then `depth` ahead
        with ThreadPoolExecutor(1, thread_name_prefix='prefetch', initializer=self.on_thread) if self.thread \
                else OnThisThread() as thread:
            try:
                for batch, key in numbered:
                    pending.append(thread.submit(self.prepare, batch, key))
                    if len(pending) > ahead:
                        yield self.handed_over(pending.popleft().result())
                        ahead = self.depth
                while pending:
                    yield self.handed_over(pending.popleft().result())
            finally:
                for future in pending:
                    future.cancel()

    def on_thread(self) -> None:
        if self.device.type == 'cuda':
            torch.cuda.set_device(self.device)  # a new thread starts on device 0

    def handed_over(self, prepared: Prepared) -> dict:
        """The batch for the training stream, waiting (on the device) for the preparing stream's event."""
        if prepared.done is None:
            return prepared.batch
        training = torch.cuda.current_stream(self.device)
        training.wait_event(prepared.done)
        for tensor in tensors_in(prepared.batch):
            if tensor.device.type == 'cuda':
                tensor.record_stream(training)
        return prepared.batch

