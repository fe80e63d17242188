"""The classification runs' samplers: the training loader's shuffle, sharded over the processes and resumable
mid-epoch (each index handed on as its `SamplePlace`), timm's repeated augmentation, and evaluation shards that see
each item once over all processes."""
from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from timm.data.distributed_sampler import RepeatAugSampler
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from backbones.common.distributed import DistInfo, SamplePlace
from backbones.common.errors import DataError
from backbones.common.lifecycle import ignore_stop_signals


class ResumableSampler(Sampler[int]):
    """A training sampler whose next pass can start part of the way in (`skip`), yielding `SamplePlace`s."""

    def __init__(self, sampler: Sampler[int], rank: int | None = None) -> None:
        self.sampler, self.start, self.rank = sampler, 0, rank

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def skip(self, count: int) -> None:
        """Leave out the first `count` indices of the next pass only."""
        self.start = count

    def __iter__(self):
        start, self.start = self.start, 0
        drawn = itertools.islice(iter(self.sampler), start, None)
        if self.rank is None:
            return drawn
        return (SamplePlace(self.rank, position, index) for position, index in enumerate(drawn, start))

    def __len__(self) -> int:
        return len(self.sampler) - self.start


@dataclass(frozen=True)
class Batching:
    """How a run's loaders batch (per process; reshuffled each epoch with `seed`; `places`: `SamplePlace` indices)."""

    size: int
    workers: int
    seed: int
    collate_fn: Callable
    aug_repeats: int = 0
    places: bool = False


def sharded_loaders(train_set: Dataset, eval_sets: Sequence[Dataset], batching: Batching,
                    info: DistInfo) -> list[DataLoader]:
    """The training loader (sharded, whole global batches, resumable mid-epoch), then one per evaluation set."""
    if len(train_set) < batching.size * info.world_size:
        raise DataError(f'{len(train_set)} training images are fewer than one global batch '
                        f'({batching.size} x {info.world_size} processes)')
    common = dict(num_workers=batching.workers, pin_memory=info.device.type == 'cuda', collate_fn=batching.collate_fn,
                  worker_init_fn=ignore_stop_signals if batching.workers else None)
    if batching.aug_repeats > 1:
        sampler = RepeatAugSampler(train_set, info.world_size, info.rank, shuffle=True,
                                   num_repeats=batching.aug_repeats)
    else:
        sampler = DistributedSampler(train_set, info.world_size, info.rank, shuffle=True, seed=batching.seed,
                                     drop_last=True)
    sampler = ResumableSampler(sampler, info.rank if batching.places else None)
    # evaluation: every world_size-th item from the rank, each seen exactly once over all processes
    return [DataLoader(train_set, batching.size, sampler=sampler, drop_last=True, **common)] + [
        DataLoader(dataset, batching.size, sampler=range(info.rank, len(dataset), info.world_size), **common)
        for dataset in eval_sets]
