"""The seam between a classification data set's storage and everything that reads it: a source lists one split (its
classes, each image's name and label) and opens an image's bytes (`open_split`).

An image's name is its path relative to the data folder in the ImageNet layout (`train/n01440764/x.JPEG`), whatever
the storage: token-label stores key their rows by it. A source is a class registered with `register_source`;
`open_split` asks each in turn, by its `precedence` (lowest first; then in registration order), whether the split
is stored its way, the default (class folders) last."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, ClassVar, Protocol

import numpy as np

from backbones.common.log import logger


class ItemReader(Protocol):
    """Opens the images of a listing: picklable, for the loader workers it is sent to."""

    def open(self, index: int, name: str) -> Path | BinaryIO:
        """Image `index` of the listing (named `name`): a file to read, or its bytes as a file object."""
        ...

    def take(self, positions: Sequence[int] | np.ndarray) -> ItemReader:
        """The reader of the listing's images at `positions`, in that order."""
        ...


@dataclass
class Listing:
    """One split as a source lists it: its classes, (name, label) of each image, how to open them, and the entry of
    the data folder it read them from (`D/SPLIT/`, `D/SPLIT.tar`, ...; None: the data folder is itself the tar)."""

    classes: list[str]
    samples: list[tuple[str, int]]
    reader: ItemReader
    read_from: Path | None = None


class ImageSource(ABC):
    name: ClassVar[str]  # in words, for messages: 'class folders'
    default: ClassVar[bool] = False  # asked last: it lists any folder
    # asked in this order, lowest first: a storage another source would misread as its own is asked before it
    precedence: ClassVar[int] = 50

    @abstractmethod
    def list_split(self, data_dir: Path, split: str, classes: Sequence[str] | None,
                   classes_from: str) -> Listing | None:
        """The split if it is stored this way (else None): its classes (or `classes`), images in order, their reader."""

    def split_classes(self, data_dir: Path, split: str) -> list[str] | None:
        """The split's classes, sorted, if it is stored this way (else None)."""
        listing = self.list_split(data_dir, split, None, '')
        return None if listing is None else listing.classes


HUB_SPLITS = {'val': 'validation'}  # the suite's split name -> the Hub's, read where the suite's is not there


def split_names(split: str) -> tuple[str, ...]:
    """The names a split may be stored under: its own, then the Hub's (`val`: `validation`)."""
    return (split, HUB_SPLITS[split]) if split in HUB_SPLITS else (split,)


SOURCES: list[ImageSource] = []  # in registration order


def register_source(source: type[ImageSource]) -> type[ImageSource]:
    """Class decorator: `source` joins the sources `open_split` asks."""
    SOURCES.append(source())
    return source


def sources() -> list[ImageSource]:
    """The sources in the order they are asked: by precedence (then as registered), the default last."""
    return sorted(SOURCES, key=lambda source: (source.default, source.precedence))


def open_split(data_dir: str | Path, split: str, classes: Sequence[str] | None = None,
               classes_from: str = 'the training split') -> Listing:
    """The split of `data_dir` as the first source that stores it lists it."""
    data_dir = Path(data_dir)
    for source in sources():
        listing = source.list_split(data_dir, split, classes, classes_from)
        if listing is not None:
            name_unread_entries(data_dir, split, listing.read_from)
            return listing
    raise AssertionError('no default image source registered')  # the class folders' source lists any folder


def name_unread_entries(data_dir: Path, split: str, read_from: Path | None) -> None:
    """Every entry of the data folder that looks meant for the split (`SPLIT`, `SPLIT.*`) but was not read, named in
    a warning: a tar beside the split's folder, a second storage of it (its index files aside)."""
    if read_from is None or not data_dir.is_dir():
        return
    for entry in sorted(data_dir.iterdir()):
        if ((entry.name == split or entry.name.startswith(f'{split}.')) and entry != read_from
                and not entry.name.endswith('.index.npz')):
            logger.warning(f'warning: {entry} is not read: the split {split} is read from {read_from}')


def split_classes(data_dir: str | Path, split: str) -> list[str]:
    """The split's classes, sorted, as the first source that stores it finds them."""
    for source in sources():
        found = source.split_classes(Path(data_dir), split)
        if found is not None:
            return found
    raise AssertionError('no default image source registered')
