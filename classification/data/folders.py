"""ImageNet-layout folders as training and evaluation data: images, labels, crop geometry and token labels."""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from timm.data import create_transform
from torch.utils.data import Dataset, default_collate

from backbones.common.distributed import DistInfo, SamplePlace, computed_once
from backbones.common.images import ImageReadError, check_same_classes, read_image
from backbones.common.log import logger
from backbones.common.random_state import cpu_streams_kept, seed_sample
from classification.data.batch_augment import collate_regions
from classification.engine.memory import release_free_memory
from classification.sources.path_list import PathList
from classification.sources.source import ItemReader, open_split
from classification.sources.tars import MemberFile
from classification.token_labeling.label_store import TokenLabelStore


class ImageFolderDataset(Dataset):
    """One split of a classification data set, as its source lists it: `image`, `label`, `index`, `geometry` and the
    store's `scores`, `classes`, `extent`, `has_map`; an unreadable image None with `skip_unreadable`. The index is in
    NumPy arrays, which forked workers share."""

    def __init__(
            self,
            data_dir: str | Path,
            split: str,
            transform: Callable,
            classes: Sequence[str] | None = None,
            label_store: TokenLabelStore | None = None,
            skip_unreadable: bool = False,
            classes_from: str = 'the training split',
            max_images: int | None = None,
            info: DistInfo | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.classes, self.paths, self.labels, self.reader = split_listing(
            self.data_dir, split, classes, classes_from, max_images, info or DistInfo())
        self.transform = transform
        self.label_store = label_store
        self.skip_unreadable = skip_unreadable
        self.epoch_seed: tuple | None = None  # (run seed, epoch): see set_epoch
        if label_store is not None:
            check_same_classes(label_store.classes, self.classes, f'the token-label store {label_store.root}',
                               str(self.data_dir / split))
            self.rows = label_store.rows_of(self.paths)

    def __len__(self) -> int:
        return len(self.paths)

    def sample(self, index: int) -> tuple[str, int]:
        return self.paths[index], int(self.labels[index])

    def set_epoch(self, seed: int, epoch: int) -> None:
        """From now on each sample's augmentation is drawn from streams seeded from (seed, epoch, its place in the
        pass), whichever process reads it: workers and resumes do not change the training."""
        self.epoch_seed = (seed, epoch)

    def file(self, index: int) -> Path | MemberFile:
        """Image `index`'s file, or its bytes read from its tar."""
        return self.reader.open(index, self.paths[index])

    def __getitem__(self, item: int | SamplePlace) -> dict | None:
        return self.__getitems__([item])[0]

    def __getitems__(self, items: Sequence[int | SamplePlace]) -> list[dict | None]:
        """Samples, as torch's loaders fetch a batch; after `set_epoch` each drawn from its own streams, and the
        reading process's streams put back (MixToken, drop-path draw on from them)."""
        if self.epoch_seed is None:
            return [self.read(item) for item in items]
        with cpu_streams_kept():
            return [self.read(item, seeded=True) for item in items]

    def read(self, drawn: int | SamplePlace, seeded: bool = False) -> dict | None:
        """One sample (`__getitems__`); `seeded`: its augmentation drawn from the streams of its key."""
        placed = isinstance(drawn, SamplePlace)
        index = drawn.index if placed else drawn
        if seeded:
            seed_sample(*self.epoch_seed, *((drawn.rank, drawn.position) if placed else (index,)))
        label = int(self.labels[index])
        try:
            # a transform that `takes_path` decodes the file itself (no more of it than its crop needs)
            file = self.file(index)
            out = self.transform(file) if getattr(self.transform, 'takes_path', False) \
                else self.transform(read_image(file))
        except ImageReadError:
            if self.skip_unreadable:
                return None
            raise
        item = {'label': label, 'index': index}
        if isinstance(out, tuple):  # (image, geometry[, plan of the batched augmentation])
            item.update(zip(('image', 'geometry', 'plan'), out))
        else:
            item['image'] = out
        if self.label_store is not None:
            row = int(self.rows[index])
            scores, classes = self.label_store.read(row)
            item['scores'], item['classes'] = torch.from_numpy(scores), torch.from_numpy(classes.astype('int64'))
            item['extent'], item['has_map'] = torch.from_numpy(self.label_store.extent(row)), \
                self.label_store.has_map(row)
        return item


def split_listing(data_dir: Path, split: str, classes: Sequence[str] | None, classes_from: str,
                  max_images: int | None, info: DistInfo) -> tuple[list[str], PathList, np.ndarray, ItemReader]:
    """The split's listing, made once by the main process and given to the others."""

    def listing() -> tuple[list[str], PathList, np.ndarray, ItemReader]:
        start = time.perf_counter()
        listed = open_split(data_dir, split, classes, classes_from)
        found, samples, reader = listed.classes, listed.samples, listed.reader
        logger.info(f'{data_dir / split}: listed {len(samples)} images in {time.perf_counter() - start:.1f} s')
        if max_images is not None:
            kept = spread_evenly(range(len(samples)), max_images)
            warn_of_empty_classes(found, samples, [samples[i] for i in kept],
                                  f'{data_dir / split}: {max_images} images kept')
            samples, reader = [samples[i] for i in kept], reader.take(kept)
        label_type = np.int16 if len(found) <= np.iinfo(np.int16).max else np.int32
        return (found, PathList(path for path, _ in samples), np.array([label for _, label in samples], label_type),
                reader)

    listed = computed_once(listing, info)
    release_free_memory()  # the listing's temporaries: not inherited by loader workers (see the function)
    return listed


def spread_evenly(samples: Sequence, count: int) -> Sequence:
    """At most `count` of `samples`, evenly spaced over the list (so that every class keeps its share)."""
    if count >= len(samples):
        return samples
    return [samples[i * len(samples) // count] for i in range(count)]


def warn_of_empty_classes(classes: Sequence[str], listed: list[tuple[str, int]], kept: list[tuple[str, int]],
                          what: str) -> None:
    """Warn of the classes the `kept` part of the split leaves without an image, and the count that keeps all."""
    empty = sorted(set(range(len(classes))) - {label for _, label in kept})
    if empty:
        smallest = min(np.bincount([label for _, label in listed], minlength=len(classes))[
            sorted({label for _, label in listed})])
        logger.warning(f'warning: {what} leave {len(empty)} of {len(classes)} classes without an image '
                       f'({", ".join(classes[i] for i in empty[:5])}{", ..." if len(empty) > 5 else ""}): the '
                       f'model never trains on them; the smallest class has {smallest} images, so keep at least '
                       f'{math.ceil(len(listed) / smallest)} images to reach every class')


def collate_skipping(items: list[dict | None]) -> dict:
    """Collate the readable items (`skipped`: the count of the others); the batched path's become `PendingImages`."""
    kept = [item for item in items if item is not None]
    pending = None
    if kept and 'plan' in kept[0]:
        pending = collate_regions([item.pop('image') for item in kept], [item.pop('plan') for item in kept])
    batch = default_collate(kept) if kept else {}
    if pending is not None:
        batch['image'] = pending
    batch['skipped'] = len(items) - len(kept)
    return batch


def eval_transform(img_size: int, crop_pct: float, interpolation: str, mean: Sequence[float], std: Sequence[float]):
    """timm's eval transform: the short side resized to img_size / crop_pct, the centre img_size kept."""
    return create_transform(img_size, is_training=False, interpolation=interpolation, mean=tuple(mean),
                            std=tuple(std), crop_pct=crop_pct)


def config_eval_transform(data_cfg: dict):
    return eval_transform(data_cfg['input_size'][-1], data_cfg['crop_pct'], data_cfg['interpolation'],
                          data_cfg['mean'], data_cfg['std'])
