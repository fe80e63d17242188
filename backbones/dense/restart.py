"""What a resumed run reads: the training sampler placed where the stopped run left it, each sample augmented from
its own seed, so that no batch done is read again (docs/segmentation.md, "Preemption").

- `PlacedInfiniteSampler` yields InfiniteSampler's indices, in its order and split over the processes as it splits
  them, from any place of that stream (`start_at`); it yields nothing until the training loop places it;
- each index comes with the pass over the data it belongs to (`Draw`), and `SeededSamples` reads the sample with
  the streams seeded from (run seed, pass, index), as classification's loaders seed theirs."""
from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any, NamedTuple

import torch
from mmengine.dataset import InfiniteSampler
from mmengine.registry import DATA_SAMPLERS

from backbones.common.random_state import sample_streams


class Draw(NamedTuple):
    """One sample the sampler hands the loader: the dataset's `index`, in pass `epoch` over the data."""

    epoch: int
    index: int


@DATA_SAMPLERS.register_module()
class PlacedInfiniteSampler(InfiniteSampler):
    """mmengine's InfiniteSampler as `Draw`s, placed by `start_at(n)` after its first `n` samples (unread)."""

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int | None = None) -> None:
        super().__init__(dataset, shuffle=shuffle, seed=seed)
        self.start: int | None = None  # this process's samples to leave out; None: not placed yet

    def start_at(self, taken: int) -> None:
        self.start = taken

    def __iter__(self) -> Iterator[Draw]:
        return iter(()) if self.start is None else self.draws(self.start)

    def draws(self, taken: int) -> Iterator[Draw]:
        """This process's share of the endless stream, after its first `taken` samples (InfiniteSampler's split)."""
        generator = torch.Generator()
        generator.manual_seed(self.seed)
        position = self.rank + self.world_size * taken
        epoch = 0
        while True:
            # every pass's order is drawn, the skipped ones' too: each one continues the generator of the previous
            order = torch.randperm(self.size, generator=generator) if self.shuffle else torch.arange(self.size)
            end = (epoch + 1) * self.size
            if position < end:
                indices = order.tolist()
                while position < end:
                    yield Draw(epoch, indices[position - epoch * self.size])
                    position += self.world_size
            epoch += 1


class SeededSamples:
    """A dataset read by `Draw`s: each sample read with Python's, NumPy's and torch's streams seeded from (seed,
    pass, index), the reading process's own streams left as they were; everything else is the dataset's."""

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset, self.seed = dataset, int(seed)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, draw: Draw) -> Any:
        with sample_streams(self.seed, draw.epoch, draw.index):
            return self.dataset[draw.index]

    def __getattr__(self, name: str) -> Any:
        if name == 'dataset':  # not set yet (an unpickled copy in a loader process)
            raise AttributeError(name)
        return getattr(self.dataset, name)
