"""The embedded digits written in a fine-grained transfer set's published layout (`classification.sources.
transfer_sets`): what tools/transfer.py runs a set's preset on when the set is not on disk, read by the same reader as
the real set. Every fifth scan is a test image (as the scans folder's validation split); the others train.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
from PIL import Image

from backbones.common.distributed import DistInfo, barrier
from backbones.common.files import write_folder_once
from backbones.common.outputs import output_folder
from classification.digits.cls_data import RECIPE as SCANS_RECIPE
from classification.digits.scans import VAL_EVERY, render_scan
from classification.loaders import ImageData
from classification.recipes import Recipe
from classification.sources.transfer_sets import StanfordCars

SETS_DIR = Path('data/digits_transfer')  # each layout in a folder of its own
VERSION = 'digits in the published layouts, 32 px JPEG, every fifth a test image\n'
DIGIT_NAMES = ('zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine')
# The digits' scale for a transfer preset: the scans folder's (48 px, 8 epochs, batch 32, milder crops, no flips, no
# EMA), and no MixUp or CutMix, with which DeiT-S stayed near chance (21%, then 8 to 12% top-1 in its first 4 epochs);
# the rest (optimizer, smoothing) is the preset's.
RECIPE = {**SCANS_RECIPE, 'mixup': 0.0, 'cutmix': 0.0}


@dataclass(frozen=True)
class Scan:
    number: int  # from 1, in the data set's order
    label: int  # the digit
    image: Image.Image
    test: bool


def scans(count: int | None = None) -> list[Scan]:
    """scikit-learn's digit scans (the first `count`), as 32 px RGB images."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    picks = range(len(digits.target) if count is None else count)
    return [Scan(n + 1, int(digits.target[n]),
                 Image.fromarray(np.uint8(np.round(render_scan(digits.images[n], 32) * 255)), 'L').convert('RGB'),
                 n % VAL_EVERY == 0) for n in picks]


def save_jpeg(image: Image.Image, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, quality=95)


def write_flowers(root: Path, items: list[Scan]) -> None:
    """jpg/image_NNNNN.jpg, imagelabels.mat (class = digit + 1), setid.mat (every tenth training scan in `valid`)."""
    from scipy.io import savemat
    for scan in items:
        save_jpeg(scan.image, root / 'jpg' / f'image_{scan.number:05d}.jpg')
    savemat(root / 'imagelabels.mat', {'labels': np.array([[s.label + 1 for s in items]], np.uint8)})
    train = [s.number for s in items if not s.test]
    savemat(root / 'setid.mat', {'trnid': np.array([[n for i, n in enumerate(train) if i % 10]], np.uint16),
                                 'valid': np.array([train[::10]], np.uint16),
                                 'tstid': np.array([[s.number for s in items if s.test]], np.uint16)})


def cars_annotations(items: list[Scan]) -> np.ndarray:
    """The devkit's `annotations` struct array (bounding box, class from 1, file name) of `items`."""
    fields = [(name, 'O') for name in ('bbox_x1', 'bbox_y1', 'bbox_x2', 'bbox_y2', 'class', 'fname')]
    return np.array([[(1, 1, 32, 32, s.label + 1, f'{s.number:05d}.jpg') for s in items]], dtype=fields)


def write_cars(root: Path, items: list[Scan]) -> None:
    """cars_train/NNNNN.jpg, cars_test/NNNNN.jpg, the devkit's class names and annotations."""
    from scipy.io import savemat
    for scan in items:
        save_jpeg(scan.image, root / ('cars_test' if scan.test else 'cars_train') / f'{scan.number:05d}.jpg')
    (root / 'devkit').mkdir(exist_ok=True)
    savemat(root / StanfordCars.META, {'class_names': np.array([[f'digit {name}' for name in DIGIT_NAMES]],
                                                               dtype=object)})
    savemat(root / StanfordCars.TRAIN_ANNOS, {'annotations': cars_annotations([s for s in items if not s.test])})
    savemat(root / StanfordCars.TEST_ANNOS, {'annotations': cars_annotations([s for s in items if s.test])})


def write_pets(root: Path, items: list[Scan]) -> None:
    """images/NAME_N.jpg and annotations/{trainval,test}.txt ("NAME_N CLASS SPECIES BREED", class = digit + 1)."""
    lines = {True: [], False: []}
    for scan in items:
        name = f'{DIGIT_NAMES[scan.label]}_{scan.number}'
        save_jpeg(scan.image, root / 'images' / f'{name}.jpg')
        lines[scan.test].append(f'{name} {scan.label + 1} 1 {scan.label + 1}')
    (root / 'annotations').mkdir(exist_ok=True)
    (root / 'annotations' / 'trainval.txt').write_text('\n'.join(lines[False]) + '\n')
    (root / 'annotations' / 'test.txt').write_text('\n'.join(lines[True]) + '\n')


def inaturalist_writer(year: int) -> Callable[[Path, list[Scan]], None]:
    """trainYEAR.json and valYEAR.json over train_valYEAR/Digits/CATEGORY/N.jpg (categories 0..9, as iNat's from 0)."""
    def write(root: Path, items: list[Scan]) -> None:
        categories = [{'id': digit, 'name': f'digit {name}', 'supercategory': 'Digits'}
                      for digit, name in enumerate(DIGIT_NAMES)]
        for test in (False, True):
            part = [s for s in items if s.test == test]
            files = [f'train_val{year}/Digits/{s.label}/{s.number}.jpg' for s in part]
            for scan, file in zip(part, files):
                save_jpeg(scan.image, root / file)
            content = {'images': [{'id': s.number, 'file_name': f, 'width': 32, 'height': 32}
                                  for s, f in zip(part, files)],
                       'annotations': [{'id': s.number, 'image_id': s.number, 'category_id': s.label} for s in part],
                       'categories': categories}
            (root / f'{"val" if test else "train"}{year}.json').write_text(json.dumps(content))
    return write


def write_class_folders(root: Path, items: list[Scan]) -> None:
    """train/DIGIT/N.jpg and val/DIGIT/N.jpg: any folder data set's layout (ImageNet's)."""
    for scan in items:
        save_jpeg(scan.image, root / ('val' if scan.test else 'train') / str(scan.label) / f'{scan.number}.jpg')


WRITERS: dict[str, Callable[[Path, list[Scan]], None]] = {
    'flowers102': write_flowers, 'cars': write_cars, 'pets': write_pets,
    'inat2018': inaturalist_writer(2018), 'inat2019': inaturalist_writer(2019), 'folder': write_class_folders}


def write_layout(dataset: str, root: Path, count: int | None = None) -> Path:
    """The digits (the first `count` scans) in `dataset`'s layout under `root`, written whole once."""
    return write_folder_once(root, VERSION, lambda folder: WRITERS[dataset](folder, scans(count)))


@dataclass(frozen=True)
class EmbeddedTransferSet:
    """The digits in `dataset`'s layout under `root`/DATASET: tools/transfer.py's data without --data-dir."""

    dataset: str
    root: Path = SETS_DIR
    description: ClassVar[str] = 'the embedded digits written in the data set\'s layout (1,797 scans, on first use)'
    recipe_values: ClassVar[dict] = RECIPE

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument('--digits-dir', type=output_folder, default=SETS_DIR,
                            help=f'where the embedded digits are written in each layout (default {SETS_DIR})')

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EmbeddedTransferSet:
        return cls(args.dataset, args.digits_dir)

    def image_data(self, recipe: Recipe, info: DistInfo) -> ImageData:
        folder = self.root / self.dataset
        if info.is_main:
            write_layout(self.dataset, folder)
        barrier(info)
        return ImageData(folder)

    def annotation(self, recipe: Recipe) -> None:
        """None: a transfer recipe learns from no annotator's maps."""
