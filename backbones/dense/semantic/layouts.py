"""The published semantic-segmentation sets the plain-ViT segmentors are compared on, in their own layouts and id
schemes: Cityscapes and COCO-Stuff-164k here, the Pascal sets in `pascal` (`backbones.dense.layouts` says what a
layout is). Each is read by mmseg's own data class, through a subclass registered here that adds two things:

- Cityscapes' masks are read as published, `*_gtFine_labelIds.png`, mapped to the 19 train ids by the official
  table through mmseg's `label_map`, where mmseg's converter has not written `*_gtFine_labelTrainIds.png`.
- With `classes_by_id` (the embedded pages written in the set's layout), classes that are not the set's own name
  its ids in order, where mmseg would refuse them (it takes a subset of the set's classes, by name).

Before a run each layout's folders, split files and annotation files are checked (`check`), each problem one line
naming the file, the layout expected and its converter; mask values by `data_check.pair_check`.
"""
from __future__ import annotations

import shutil
from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import cv2
import numpy as np
from mmseg.datasets import CityscapesDataset, COCOStuffDataset
from mmseg.registry import DATASETS

from backbones.common.errors import DataError
from backbones.common.files import ready_mark, write_folder_once
from backbones.dense.data_check import IGNORE_INDEX
from backbones.dense.layouts import LABEL_VALUES, SmallDenseData, WrittenLayout, register_layout

SMALL_VERSION = 'published layouts v1'  # the small data's layouts; a change here rewrites them
SMALL_SPLITS = ('training', 'validation')  # SmallDenseData's
SHOWN = 3

# Cityscapes' label ids (cityscapesscripts' labels.py, `id`) and the train id each is evaluated as (`trainId`);
# 255 ignored. Ids 0..33 are what *_gtFine_labelIds.png holds.
CITYSCAPES_TRAIN_IDS = {
    0: 255, 1: 255, 2: 255, 3: 255, 4: 255, 5: 255, 6: 255,  # unlabeled, ego vehicle, ..., ground
    7: 0, 8: 1, 9: 255, 10: 255,  # road, sidewalk, parking, rail track
    11: 2, 12: 3, 13: 4, 14: 255, 15: 255, 16: 255,  # building, wall, fence, guard rail, bridge, tunnel
    17: 5, 18: 255, 19: 6, 20: 7,  # pole, polegroup, traffic light, traffic sign
    21: 8, 22: 9, 23: 10, 24: 11, 25: 12, 26: 13, 27: 14, 28: 15,  # vegetation, terrain, sky, person, ..., bus
    29: 255, 30: 255, 31: 16, 32: 17, 33: 18,  # caravan, trailer, train, motorcycle, bicycle
}
CITYSCAPES_LABEL_ID_OF = {train_id: label_id for label_id, train_id in CITYSCAPES_TRAIN_IDS.items()
                          if train_id != IGNORE_INDEX}  # the one label id of each train id
CITYSCAPES_LABEL_IDS = '_gtFine_labelIds.png'
CITYSCAPES_UNLABELED = 0  # the label id the embedded pages' ignored pixels are written as


class ClassesById:
    """Mixed into an mmseg data class: with `classes_by_id`, the config's classes (the embedded data's, written in this
    set's layout) name the stored ids 0, 1, ... in order, not a subset of the set's own by name."""

    def __init__(self, *args, classes_by_id: bool = False, **kwargs) -> None:
        self.classes_by_id = classes_by_id
        super().__init__(*args, **kwargs)

    def get_label_map(self, new_classes=None) -> dict | None:
        """mmseg's label map (a classmethod there, which BaseSegDataset.__init__ calls on the instance)."""
        return None if self.classes_by_id else super().get_label_map(new_classes)


@DATASETS.register_module()
class CityscapesIdsDataset(ClassesById, CityscapesDataset):
    """mmseg's CityscapesDataset, classes by id if asked, reading *_gtFine_labelIds.png without the train ids."""

    reads_label_ids = True  # the published masks, without mmseg's converter

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # predictions are written in label ids, as Cityscapes' evaluation (cityscapesscripts) and mmseg's
        # CityscapesMetric take them, whichever masks were read
        train_id_of = {index: train_id for train_id, index in (self.label_map or {}).items() if index != IGNORE_INDEX}
        self._metainfo[LABEL_VALUES] = [CITYSCAPES_LABEL_ID_OF[train_id_of.get(index, index)]
                                        for index in range(len(self._metainfo['classes']))]

    def load_data_list(self) -> list[dict]:
        return [entry if Path(entry['seg_map_path']).is_file() else self.from_label_ids(entry)
                for entry in super().load_data_list()]

    def from_label_ids(self, entry: dict) -> dict:
        path = entry['seg_map_path'][:-len(self.seg_map_suffix)] + CITYSCAPES_LABEL_IDS
        then = self.label_map or {}
        label_map = {label_id: then.get(train_id, train_id) if train_id != IGNORE_INDEX else IGNORE_INDEX
                     for label_id, train_id in CITYSCAPES_TRAIN_IDS.items()}
        return {**entry, 'seg_map_path': path, 'label_map': label_map}


@DATASETS.register_module()
class COCOStuffIdsDataset(ClassesById, COCOStuffDataset):
    """mmseg's COCOStuffDataset (164k: 171 train ids, 255 ignored), its classes by id if asked."""


def under(dataset_cfg: dict, relative: str) -> Path:
    """A path of a data-set config, under its data_root as mmengine joins them."""
    return Path(dataset_cfg.get('data_root') or '') / relative


def missing(path: Path, kind: str, layout: str, converter: str = '') -> DataError:
    """The error of a folder or file of the layout that is not there."""
    return DataError(f'{path}: no such {kind} ({layout}{converter})')


@dataclass(frozen=True)
class Pair:
    """An image and the annotation files it may have (the first found is read)."""

    image: Path
    annotations: tuple[Path, ...]


class PublishedLayout(WrittenLayout):
    """A set of images and class maps in two folders (and a split file where it has one), written by `write_split`."""

    layout: ClassVar[str]  # the layout in words, as messages name it
    converter: ClassVar[str]  # what writes the annotations, in words ('' where the set ships them)
    img_suffix: ClassVar[str]
    seg_map_suffix: ClassVar[str]
    classes: ClassVar[int]  # how many classes its ids name
    small_type: ClassVar[str]  # the data-set type the small data is read with
    small_reduce_zero_label: ClassVar[bool]  # how this layout's masks store the pages' classes
    small_prefix: ClassVar[dict[str, dict[str, str]]]  # per split of the small data, the data set's folders

    def check(self, dataset_cfg: dict) -> None:
        prefix = dataset_cfg.get('data_prefix') or {}
        images = under(dataset_cfg, prefix.get('img_path', ''))
        annotations = under(dataset_cfg, prefix.get('seg_map_path', ''))
        if not images.is_dir():
            raise missing(images, 'folder', self.layout)
        if not annotations.is_dir():
            raise missing(annotations, 'folder', self.layout, self.converter)
        pairs = self.pairs(dataset_cfg, images, annotations)
        if not pairs:
            raise DataError(f'{images} holds no *{self.suffix(dataset_cfg, "img")} images ({self.layout})')
        self.check_annotations(pairs, dataset_cfg)

    def suffix(self, dataset_cfg: dict, kind: str) -> str:
        """The config's img_suffix or seg_map_suffix, else the data class's."""
        return dataset_cfg.get(f'{kind}_suffix', getattr(self, f'{kind}_suffix'))

    def pairs(self, dataset_cfg: dict, images: Path, annotations: Path) -> list[Pair]:
        """Each image of the data set (listed from its folder, as mmseg lists it) and its annotation; an annotation
        without its image (an image folder unpacked in part) is an error naming it."""
        img_suffix, seg_suffix = self.suffix(dataset_cfg, 'img'), self.suffix(dataset_cfg, 'seg_map')
        names = [str(path.relative_to(images))[:-len(img_suffix)] for path in sorted(images.rglob(f'*{img_suffix}'))]
        pairs = [Pair(images / f'{name}{img_suffix}', self.annotation_files(annotations, name, seg_suffix))
                 for name in names]
        kinds = tuple(path.name for path in self.annotation_files(Path(), '', seg_suffix))  # their file name endings
        paired = {path for pair in pairs for path in pair.annotations}
        unpaired = sorted(path for path in annotations.rglob('*') if path.name.endswith(kinds) and path not in paired)
        if unpaired:
            raise DataError(f'{len(unpaired)} annotation(s) in {annotations} have no image in {images}, e.g. '
                            f'{unpaired[0]}: the images were unpacked or copied in part ({self.layout})')
        return pairs

    def annotation_files(self, annotations: Path, name: str, seg_suffix: str) -> tuple[Path, ...]:
        return (annotations / f'{name}{seg_suffix}',)

    def check_annotations(self, pairs: list[Pair], dataset_cfg: dict) -> None:
        """Every image has its annotation."""
        bare = [pair for pair in pairs if not any(path.is_file() for path in pair.annotations)]
        if bare:
            raise DataError(f'{len(bare)} of {len(pairs)} images have no annotation, e.g. {bare[0].image} '
                            f'(no {" or ".join(map(str, bare[0].annotations))}; {self.layout}{self.converter})')

    def write_small(self, data: SmallDenseData, root: Path) -> None:
        if len(data.classes) > self.classes:
            raise DataError(f'{data.root}: {len(data.classes)} classes do not fit the {self.classes} ids of the '
                            f'{self.title} layout')
        write_folder_once(root, f'{SMALL_VERSION}: {self.name}; {ready_mark(data.root)}', lambda folder: [
            self.write_split(data, folder, split,
                             sorted(path.stem for path in (data.root / 'images' / split).glob('*.jpg')))
            for split in SMALL_SPLITS])

    @abstractmethod
    def write_split(self, data: SmallDenseData, root: Path, split: str, names: list[str]) -> None:
        """Write the images `names` of `split` of `data` and their class maps in this layout under `root`."""

    def use_small(self, dataset_cfg: dict, data: SmallDenseData, split: str) -> None:
        root = self.small_root(data)
        self.write_small(data, root)
        dataset_cfg.update(type=self.small_type, data_root=str(root), data_prefix=dict(self.small_prefix[split]),
                           reduce_zero_label=self.small_reduce_zero_label, classes_by_id=True)
        dataset_cfg.pop('img_suffix', None)
        dataset_cfg.pop('seg_map_suffix', None)
        fit_resizing(dataset_cfg['pipeline'], data)


def fit_resizing(pipeline: list[dict], data: SmallDenseData) -> None:
    """The pipeline's resizing at the size that `data.scale` turns into the small data's image size."""
    width, height = data.image_size
    for step in pipeline:
        if step['type'] in ('Resize', 'RandomResize') and 'scale' in step:
            step['scale'] = (round(width / data.scale), round(height / data.scale))


def page_mask(data: SmallDenseData, split: str, name: str) -> np.ndarray:
    """A page's class map as the shared layout stores it (class c as c + 1, 0 ignored)."""
    return cv2.imread(str(data.root / 'annotations' / split / f'{name}.png'), cv2.IMREAD_UNCHANGED)


def train_ids(stored: np.ndarray) -> np.ndarray:
    """The pages' stored values as train ids: class c, 255 ignored."""
    return np.where(stored == 0, IGNORE_INDEX, stored.astype(np.int64) - 1).astype(np.uint8)


def write_png(path: Path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not cv2.imwrite(str(path), pixels):
        raise DataError(f'{path}: cannot be written')


def copy_image(data: SmallDenseData, split: str, name: str, to: Path) -> None:
    to.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(data.root / 'images' / split / f'{name}.jpg', to)


TRAIN_VAL = {'training': 'train', 'validation': 'val'}  # the small data's splits as Cityscapes and Context name them
SMALL_CITY = 'small'  # the city folder a small data set is written in


@register_layout
class CityscapesLayout(PublishedLayout):
    name = 'cityscapes'
    title = 'Cityscapes'
    dataset_types = ('CityscapesDataset', 'CityscapesIdsDataset')
    root = 'data/cityscapes'
    layout = ('Cityscapes\' layout: leftImg8bit/{train,val}/CITY/*_leftImg8bit.png with '
              'gtFine/{train,val}/CITY/*_gtFine_labelIds.png or *_gtFine_labelTrainIds.png')
    converter = ''  # the suite reads the labelIds; mmseg's converter is optional
    img_suffix = '_leftImg8bit.png'
    seg_map_suffix = '_gtFine_labelTrainIds.png'
    classes = 19
    small_type = 'CityscapesIdsDataset'
    small_reduce_zero_label = False
    small_prefix = {split: dict(img_path=f'leftImg8bit/{name}', seg_map_path=f'gtFine/{name}')
                    for split, name in TRAIN_VAL.items()}

    def annotation_files(self, annotations: Path, name: str, seg_suffix: str) -> tuple[Path, ...]:
        """Its train ids (mmseg's converter's) first, else its label ids."""
        return annotations / f'{name}{seg_suffix}', annotations / f'{name}{CITYSCAPES_LABEL_IDS}'

    def check_annotations(self, pairs: list[Pair], dataset_cfg: dict) -> None:
        """Every image has its label ids or train ids, and train ids are there for all images or for none (a part
        of them is a converter's run cut short); mmseg's own data class reads train ids only."""
        super().check_annotations(pairs, dataset_cfg)
        without = [pair for pair in pairs if not pair.annotations[0].is_file()]
        if without and not getattr(DATASETS.get(dataset_cfg.get('type')), 'reads_label_ids', False):
            raise DataError(f'{without[0].annotations[0]}: no such file: mmseg\'s CityscapesDataset reads only '
                            f'*_gtFine_labelTrainIds.png, which mmseg\'s tools/dataset_converters/cityscapes.py '
                            f'writes; type=\'CityscapesIdsDataset\' (seg_configs/_base_/datasets/cityscapes.py) reads '
                            f'the *_gtFine_labelIds.png as published')
        if 0 < len(without) < len(pairs):
            raise DataError(f'{len(pairs) - len(without)} of {len(pairs)} images have *_gtFine_labelTrainIds.png, '
                            f'{without[0].image} has not ({without[0].annotations[0]} missing): mmseg\'s '
                            f'tools/dataset_converters/cityscapes.py writes them for all images; run it again, or '
                            f'remove them to read the *_gtFine_labelIds.png ({self.layout})')

    def write_split(self, data: SmallDenseData, root: Path, split: str, names: list[str]) -> None:
        """PNG images in one city folder; label ids whose train ids are the pages' classes."""
        label_ids = np.full(256, CITYSCAPES_UNLABELED, np.uint8)
        label_ids[list(CITYSCAPES_LABEL_ID_OF)] = list(CITYSCAPES_LABEL_ID_OF.values())
        folder = TRAIN_VAL[split]
        for name in names:
            image = cv2.imread(str(data.root / 'images' / split / f'{name}.jpg'), cv2.IMREAD_COLOR)
            write_png(root / 'leftImg8bit' / folder / SMALL_CITY / f'{name}{self.img_suffix}', image)
            write_png(root / 'gtFine' / folder / SMALL_CITY / f'{name}{CITYSCAPES_LABEL_IDS}',
                      label_ids[train_ids(page_mask(data, split, name))])


COCO_STUFF_SPLITS = {'training': 'train2017', 'validation': 'val2017'}


@register_layout
class COCOStuffLayout(PublishedLayout):
    name = 'coco_stuff164k'
    title = 'COCO-Stuff-164k'
    dataset_types = ('COCOStuffDataset', 'COCOStuffIdsDataset')
    root = 'data/coco_stuff164k'
    layout = ('COCO-Stuff-164k\'s layout: images/{train2017,val2017}/*.jpg, '
              'annotations/{train2017,val2017}/*_labelTrainIds.png (train ids 0..170, 255 ignored)')
    converter = ('; mmseg\'s tools/dataset_converters/coco_stuff164k.py writes the *_labelTrainIds.png from '
                 'stuffthingmaps_trainval2017')
    img_suffix = '.jpg'
    seg_map_suffix = '_labelTrainIds.png'
    classes = 171
    small_type = 'COCOStuffIdsDataset'
    small_reduce_zero_label = False
    small_prefix = {split: dict(img_path=f'images/{name}', seg_map_path=f'annotations/{name}')
                    for split, name in COCO_STUFF_SPLITS.items()}

    def write_split(self, data: SmallDenseData, root: Path, split: str, names: list[str]) -> None:
        """The JPEGs and train-id maps (class c as c, 255 ignored)."""
        folder = COCO_STUFF_SPLITS[split]
        for name in names:
            copy_image(data, split, name, root / 'images' / folder / f'{name}.jpg')
            write_png(root / 'annotations' / folder / f'{name}{self.seg_map_suffix}',
                      train_ids(page_mask(data, split, name)))
