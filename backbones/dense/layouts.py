"""Every dense data set's folder layout and label scheme (ADE20K, COCO, NYU-v2, own data, Cityscapes, KITTI, ...),
each found by the mmseg data-set type a config reads it with: its configs' folder, what is checked on disk before a
run, and how the tasks' small data set (`SmallDenseData`) is read as it is or written in the set's own layout
(`WrittenLayout`). A layout is a class registered by `register_layout`; code elsewhere asks `layout_of(dataset)`,
never comparing data-set types or folders."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np


@dataclass(frozen=True)
class SmallDenseData:
    """A small data set in the tasks' shared layout (the embedded pages): images/{split}/NAME.jpg,
    annotations/{split}/NAME.png (class c as c + 1), depth/{split}/NAME.png, annotations/instances_{split}.json under
    `root`; `scale`, `ratio_range`, `test_ratios`: a semantic config's sizes; `mirrored`: flips allowed."""

    root: Path
    classes: tuple[str, ...]
    palette: tuple[tuple[int, int, int], ...]
    image_size: tuple[int, int]
    scale: float
    ratio_range: tuple[float, float]
    test_ratios: tuple[float, ...]
    depth_scale: float
    mirrored: bool


class DataLayout(ABC):
    """One data set's layout: class attributes say what it is; methods check it and point a config at small data."""

    title: ClassVar[str]  # in words: 'Cityscapes'
    dataset_types: ClassVar[tuple[str, ...]]  # the mmseg data-set types (registry names) that read it
    root: ClassVar[str]  # its configs' data_root ('data/cityscapes'): where it is absent, the embedded data stands in

    def check(self, dataset_cfg: dict) -> None:
        """Raise DataError (one line) naming what of this layout is missing under the data set's root, or is not in
        its id scheme, and the converter that makes it; before any file is read for training (by default nothing)."""

    @abstractmethod
    def use_small(self, dataset_cfg: dict, data: SmallDenseData, split: str) -> None:
        """Point a loader's data set of this layout at `split` of `data`, its classes the small data's."""


class WrittenLayout(DataLayout):
    """A layout small data is written in (a published set's: Cityscapes, KITTI, ...), in the set's files and ids."""

    name: ClassVar[str]  # a folder name and how it is called in messages: 'cityscapes'

    @abstractmethod
    def write_small(self, data: SmallDenseData, root: Path) -> None:
        """Write `data` under `root` in this layout and id scheme; nothing if written already (a READY mark)."""

    def small_root(self, data: SmallDenseData) -> Path:
        """Where `data` is written in this layout: beside it, in a folder named for the layout."""
        return data.root.parent / f'{data.root.name}_{self.name}'


LAYOUTS: dict[str, DataLayout] = {}  # by data-set type


def register_layout(layout: type[DataLayout]) -> type[DataLayout]:
    """Class decorator: `layout` joins the registry (one instance) under each of its data-set types, all new."""
    taken = [kind for kind in layout.dataset_types if kind in LAYOUTS]
    if taken:
        raise ValueError(f'data layout {layout.__name__}: data-set types {taken} are registered already')
    LAYOUTS.update(dict.fromkeys(layout.dataset_types, layout()))
    return layout


def layout_of(dataset_cfg: dict) -> DataLayout | None:
    """The layout a data-set config reads; None for a type no layout claims (mmseg's, of a set the suite leaves)."""
    kind = dataset_cfg.get('type')
    return LAYOUTS.get(kind) if isinstance(kind, str) else None


def image_folder(dataset_cfg: dict) -> Path:
    """A data set's folder of images (its `data_prefix` under its `data_root`, as mmengine joins them)."""
    return Path(dataset_cfg.get('data_root') or '') / (dataset_cfg.get('data_prefix') or {}).get('img_path', '')


def layout_roots() -> dict[str, str]:
    """Each registered layout's configs' data root (where the embedded data stands in when absent) and its title."""
    return {layout.root: layout.title for layout in LAYOUTS.values()}


LABEL_VALUES = 'label_values'  # a data set's meta: the value its annotation files store each class as, by index


def annotation_values(prediction: np.ndarray, meta: Mapping) -> np.ndarray:
    """Class indices as the data set (`meta`) stores them: its own table (Cityscapes), class + 1 (ADE20K) or index."""
    if meta.get(LABEL_VALUES) is not None:
        return np.asarray(meta[LABEL_VALUES], np.int64)[prediction]
    return prediction + 1 if meta.get('reduce_zero_label') else prediction
