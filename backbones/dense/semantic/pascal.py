"""The Pascal sets of VOCdevkit, each an image folder, a mask folder and split files listing the images: Pascal
Context-59 (VOC2010, masks from mmseg's converter), Pascal VOC 2012 (palette PNGs as published: 0 background, 1..20
the classes, 255 the boundaries, ignored) and its training set with SBD's images ("trainaug", as mmseg's converter
writes them). Checked and written as `layouts.PublishedLayout` says."""
from __future__ import annotations

from collections.abc import Callable
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


# SBD's images beside VOC 2012's training set, as mmseg's tools/dataset_converters/voc_aug.py writes them: their
# masks (class indices, 0 background) and the split file of those in neither VOC split (9,118 of them)
AUG_MASKS, AUG_SPLIT = 'SegmentationClassAug', 'ImageSets/Segmentation/aug.txt'


@DATASETS.register_module()
class PascalVOCAugIdsDataset(PascalVOCIdsDataset):
    """VOC 2012's training set with SBD's images, the 10,582 of "trainaug" (mmseg's voc12aug): the split file's images
    with VOC's masks, then `aug_ann_file`'s with theirs in `aug_seg_map_path`. One data set, where mmseg concatenates
    two: the suite's data checks and the embedded data read a loader's data set alone."""

    def __init__(self, *args, aug_ann_file: str = AUG_SPLIT, aug_seg_map_path: str = AUG_MASKS, **kwargs) -> None:
        self.aug_ann_file, self.aug_seg_map_path = aug_ann_file, aug_seg_map_path
        super().__init__(*args, **kwargs)

    def load_data_list(self) -> list[dict]:
        voc = super().load_data_list()
        root = Path(self.data_root or '')
        names = split_names(root / self.aug_ann_file, PascalVOCAugLayout.layout)
        overlap = {Path(entry['img_path']).stem for entry in voc} & set(names)
        if overlap:
            raise DataError(f'{root / self.aug_ann_file} lists {len(overlap)} image(s) of {self.ann_file} too, e.g. '
                            f'{sorted(overlap)[0]}: each would be trained on twice ({PascalVOCAugLayout.layout})')
        return voc + [dict(img_path=str(Path(self.data_prefix['img_path']) / f'{name}{self.img_suffix}'),
                           seg_map_path=str(root / self.aug_seg_map_path / f'{name}{self.seg_map_suffix}'),
                           label_map=self.label_map, reduce_zero_label=self.reduce_zero_label, seg_fields=[])
                      for name in names]


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


def write_listed(data: SmallDenseData, split: str, names: list[str], root: Path, masks: Path,
                 write_mask: Callable[[Path, np.ndarray], None], split_file: Path) -> None:
    """The pages `names` of `split` as JPEGImages/NAME.jpg, their masks in `masks` (`write_mask` of each page's stored
    values) and `split_file` listing them."""
    for name in names:
        copy_image(data, split, name, root / 'JPEGImages' / f'{name}.jpg')
        write_mask(masks / f'{name}.png', page_mask(data, split, name))
    split_file.parent.mkdir(parents=True, exist_ok=True)
    split_file.write_text(''.join(f'{name}\n' for name in names))


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
        return self.listed(dataset_cfg, under(dataset_cfg, dataset_cfg.get('ann_file') or ''), images, annotations)

    def listed(self, dataset_cfg: dict, split_file: Path, images: Path, annotations: Path) -> list[Pair]:
        """The images `split_file` lists, each in `images`, with its mask in `annotations`."""
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
        write_listed(data, split, names, root, root / self.mask_folder, self.write_mask,
                     root / 'ImageSets' / self.split_folder / f'{TRAIN_VAL[split]}.txt')

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


@register_layout
class PascalVOCAugLayout(PascalVOCLayout):
    """VOC 2012's training set with SBD's images (`PascalVOCAugIdsDataset`); its validation set is VOC's."""

    name = 'pascal_voc12_aug'
    title = 'Pascal VOC 2012 with SBD (trainaug)'
    dataset_types = ('PascalVOCAugIdsDataset',)
    layout = (f'Pascal VOC 2012\'s layout with SBD\'s images: {PascalVOCLayout.layout.partition(": ")[2]}, and '
              f'{AUG_MASKS}/*.png (class indices), {AUG_SPLIT} (the SBD images in neither VOC split)')
    converter = ('; mmseg\'s tools/dataset_converters/voc_aug.py writes SegmentationClassAug and aug.txt from SBD\'s '
                 'benchmark.tgz')
    small_type = 'PascalVOCAugIdsDataset'
    voc_share = 3  # the embedded training pages: one in this many in VOC's own part, the others in SBD's

    def pairs(self, dataset_cfg: dict, images: Path, annotations: Path) -> list[Pair]:
        """VOC's training images, then SBD's (`aug_ann_file`, their masks in `aug_seg_map_path`)."""
        masks = under(dataset_cfg, dataset_cfg.get('aug_seg_map_path', AUG_MASKS))
        if not masks.is_dir():
            raise missing(masks, 'folder', self.layout, self.converter)
        split_file = under(dataset_cfg, dataset_cfg.get('aug_ann_file', AUG_SPLIT))
        return super().pairs(dataset_cfg, images, annotations) + self.listed(dataset_cfg, split_file, images, masks)

    def write_split(self, data: SmallDenseData, root: Path, split: str, names: list[str]) -> None:
        """The training pages' first third as VOC's training set, the others as SBD's (grayscale masks)."""
        voc = names if split != 'training' else names[:len(names) // self.voc_share]
        super().write_split(data, root, split, voc)
        if split == 'training':
            write_listed(data, split, names[len(voc):], root, root / AUG_MASKS,
                         lambda path, stored: write_png(path, train_ids(stored)), root / AUG_SPLIT)
