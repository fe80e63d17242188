"""The Pascal sets of VOCdevkit, each an image folder, a mask folder and split files listing the images: Pascal
Context-59 (VOC2010, masks from mmseg's converter) and Pascal VOC 2012 (palette PNGs as published: 0 background, 1..20
the classes, 255 the boundaries, ignored). Checked and written as `layouts.PublishedLayout` says."""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import numpy as np
from mmseg.datasets import PascalContextDataset59, PascalVOCDataset
from mmseg.registry import DATASETS
from PIL import Image

from backbones.common.errors import DataError
from backbones.dense.layouts import SmallDenseData, register_layout
from backbones.dense.semantic.layouts import (
    TRAIN_VAL,
    ClassesById,
    Pair,
    PublishedLayout,
    copy_image,
    missing,
    page_mask,
    train_ids,
    under,
    write_png,
)


@DATASETS.register_module()
class PascalContextIdsDataset59(ClassesById, PascalContextDataset59):
    """mmseg's PascalContextDataset59 (59 classes, mask value 0 ignored), its classes by id if asked."""


@DATASETS.register_module()
class PascalVOCIdsDataset(ClassesById, PascalVOCDataset):
    """mmseg's PascalVOCDataset (21 classes with the background, 255 ignored), its classes by id if asked."""


def split_names(split_file: Path, layout: str) -> list[str]:
    """A split file's image names, one a line, stripped as mmseg; a blank or repeated name is a DataError."""
    names: dict[str, int] = {}
    for number, line in enumerate(split_file.read_text().splitlines(), 1):
        name = line.strip()
        if not name or name in names:
            what = 'is blank' if not name else f'lists {name} again (first on line {names[name]})'
            raise DataError(f'{split_file}, line {number} {what}: one image name a line, each once ({layout})')
        names[name] = number
    return list(names)


class SplitFileLayout(PublishedLayout):
    """A Pascal set: JPEGImages, a mask folder and ImageSets/`split_folder`/{train,val}.txt under its root."""

    mask_folder: ClassVar[str]
    split_folder: ClassVar[str]
    img_suffix = '.jpg'
    seg_map_suffix = '.png'

    @property
    def small_prefix(self) -> dict[str, dict[str, str]]:
        return {split: dict(img_path='JPEGImages', seg_map_path=self.mask_folder) for split in TRAIN_VAL}

    def pairs(self, dataset_cfg: dict, images: Path, annotations: Path) -> list[Pair]:
        """The images its split file lists."""
        split_file = under(dataset_cfg, dataset_cfg.get('ann_file') or '')
        if not split_file.is_file():
            raise missing(split_file, 'split file', self.layout, self.converter)
        img_suffix, seg_suffix = self.suffix(dataset_cfg, 'img'), self.suffix(dataset_cfg, 'seg_map')
        names = split_names(split_file, self.layout)
        absent = [name for name in names if not (images / f'{name}{img_suffix}').is_file()]
        if absent:
            raise DataError(f'{split_file} lists {len(absent)} image(s) not in {images}, e.g. {absent[0]}{img_suffix} '
                            f'({self.layout})')
        return [Pair(images / f'{name}{img_suffix}', (annotations / f'{name}{seg_suffix}',)) for name in names]

    def use_small(self, dataset_cfg: dict, data: SmallDenseData, split: str) -> None:
        super().use_small(dataset_cfg, data, split)
        dataset_cfg['ann_file'] = f'ImageSets/{self.split_folder}/{TRAIN_VAL[split]}.txt'

    def write_split(self, data: SmallDenseData, root: Path, split: str, names: list[str]) -> None:
        """The JPEGs, their masks (`write_mask`) and the split file."""
        for name in names:
            copy_image(data, split, name, root / 'JPEGImages' / f'{name}.jpg')
            self.write_mask(root / self.mask_folder / f'{name}.png', page_mask(data, split, name))
        split_file = root / 'ImageSets' / self.split_folder / f'{TRAIN_VAL[split]}.txt'
        split_file.parent.mkdir(parents=True, exist_ok=True)
        split_file.write_text(''.join(f'{name}\n' for name in names))

    def write_mask(self, path: Path, stored: np.ndarray) -> None:
        """A page's mask (class c stored as c + 1, 0 ignored) in this set's values."""
        write_png(path, stored)


@register_layout
class PascalContextLayout(SplitFileLayout):
    name = 'pascal_context59'
    title = 'Pascal Context-59'
    dataset_types = ('PascalContextDataset59', 'PascalContextIdsDataset59')
    root = 'data/VOCdevkit/VOC2010'
    layout = ('Pascal Context\'s layout: JPEGImages/*.jpg, SegmentationClassContext/*.png (0 background, ignored; '
              '1..59 the classes), ImageSets/SegmentationContext/{train,val}.txt')
    converter = ('; mmseg\'s tools/dataset_converters/pascal_context.py writes the masks and split files from '
                 'trainval_merged.json')
    mask_folder = 'SegmentationClassContext'
    split_folder = 'SegmentationContext'
    classes = 59
    small_type = 'PascalContextIdsDataset59'
    small_reduce_zero_label = True  # the pages' stored values are Context's: class c as c + 1, 0 ignored


# VOC's palette: index i's colour from the bits of i, three at a time, into the high bits of red, green and blue
VOC_PALETTE = [sum(((i >> (3 * k + c)) & 1) << (7 - k) for k in range(3)) for i in range(256) for c in range(3)]


@register_layout
class PascalVOCLayout(SplitFileLayout):
    name = 'pascal_voc12'
    title = 'Pascal VOC 2012'
    dataset_types = ('PascalVOCDataset', 'PascalVOCIdsDataset')
    root = 'data/VOCdevkit/VOC2012'
    layout = ('Pascal VOC 2012\'s layout: JPEGImages/*.jpg, SegmentationClass/*.png (palette PNGs: 0 background, '
              '1..20 the classes, 255 ignored), ImageSets/Segmentation/{train,val}.txt')
    converter = '; VOCtrainval_11-May-2012.tar holds them, unpacked under data/VOCdevkit'
    mask_folder = 'SegmentationClass'
    split_folder = 'Segmentation'
    classes = 21
    small_type = 'PascalVOCIdsDataset'
    small_reduce_zero_label = False

    def write_mask(self, path: Path, stored: np.ndarray) -> None:
        """A palette PNG of train ids (class c as c, 255 ignored), as VOC publishes its masks."""
        path.parent.mkdir(parents=True, exist_ok=True)
        mask = Image.fromarray(train_ids(stored), mode='P')
        mask.putpalette(VOC_PALETTE)
        mask.save(path)
