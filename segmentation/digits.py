"""The embedded segmentation set: scikit-learn's handwritten digits on real photographs, in ADE20K's layout.

Used by the tools when no ADE20K is on disk. Each image is a dimmed crop of one of scikit-learn's two sample
photographs with up to three digits inked on it in light colours, side by side without overlap (light strokes on a
dark ground, as in the classification scans). Annotations follow ADE20K: 1 is background, 2..11 are the digits
0..9, and 0 marks the digits' soft edges, which are ignored like ADE20K's "other" (reduce_zero_label).

Sizes: images are 192x144 (4:3, a quarter of ADE20K's test scale, at which the tools run the configs) and a digit
is 44-72 px, which the test resize shows at 39-64 px, near the 48 px the classification digits are trained at
(three tokens of 16 px). The validation images use only the scans the classification run holds out (every
fifth), so pretraining never saw their digits.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import List, Tuple

import cv2
import numpy as np

from classification.digits import VAL_EVERY
from mmseg.datasets import BaseSegDataset
from mmseg.registry import DATASETS

BACKGROUND_GAIN = (0.2, 0.45)  # the photographs are dimmed so that the light ink stands out, as in the scans
INK = (170, 255)  # per-channel range of the ink colour
CLASSES = ('background',) + tuple(str(d) for d in range(10))
SPLITS = {'training': 400, 'validation': 80}
IMAGE_SIZE = (192, 144)  # width, height
DIGIT_SIZE = (44, 72)  # pixels, the side of a digit's 8x8 scan once inked
DIGITS_PER_IMAGE = 3  # at most; a digit that finds no free place after a few tries is left out
VERSION = 'digits-seg v2: dimmed photographs, light ink, 44-72 px digits, held-out scans for validation\n'
READY = 'READY'


@DATASETS.register_module()
class DigitsSegDataset(BaseSegDataset):
    """The embedded digits set: ADE20K's file layout and label convention, 11 classes."""

    METAINFO = dict(classes=CLASSES, palette=[[120, 120, 120]] + [
        [int(c) for c in cv2.cvtColor(np.uint8([[[18 * d, 220, 255]]]), cv2.COLOR_HSV2RGB)[0, 0]] for d in range(10)])

    def __init__(self, img_suffix: str = '.jpg', seg_map_suffix: str = '.png', reduce_zero_label: bool = True,
                 **kwargs) -> None:
        super().__init__(img_suffix=img_suffix, seg_map_suffix=seg_map_suffix, reduce_zero_label=reduce_zero_label,
                         **kwargs)


def _load_photos() -> List[np.ndarray]:
    """scikit-learn's two sample photographs (RGB, uint8)."""
    from sklearn.datasets import load_sample_images
    return list(load_sample_images().images)


def _photo_background(rng: np.random.Generator, photos: List[np.ndarray]) -> np.ndarray:
    """A random crop of a random photograph, resized to IMAGE_SIZE and dimmed; float32 RGB."""
    width, height = IMAGE_SIZE
    photo = photos[rng.integers(len(photos))]
    crop_w = int(min(photo.shape[1], photo.shape[0] * width / height) * rng.uniform(0.35, 1.0))
    crop_h = crop_w * height // width
    y, x = rng.integers(photo.shape[0] - crop_h + 1), rng.integers(photo.shape[1] - crop_w + 1)
    image = cv2.resize(photo[y:y + crop_h, x:x + crop_w], IMAGE_SIZE, interpolation=cv2.INTER_AREA).astype(np.float32)
    return image * rng.uniform(*BACKGROUND_GAIN)


def _ink_digit(rng: np.random.Generator, image: np.ndarray, scan: np.ndarray, top: int, left: int, size: int
              ) -> np.ndarray:
    """Ink an 8x8 scan (values 0..16) into `image` as a `size` square at (top, left), in a random light colour, in
    place; returns the ink coverage (0..1) of that square."""
    ink = cv2.resize(scan / 16.0, (size, size), interpolation=cv2.INTER_LINEAR).clip(0, 1)
    window = (slice(top, top + size), slice(left, left + size))
    colour = rng.uniform(*INK, 3).astype(np.float32)
    image[window] = image[window] * (1 - ink[..., None]) + colour * ink[..., None]
    return ink


def _free_place(rng: np.random.Generator, size: int, taken: List[Tuple[int, int, int]]) -> Tuple[int, int] | None:
    """A top-left corner for a `size` square that overlaps no square in `taken` (top, left, size); None if none
    was found in a few tries."""
    width, height = IMAGE_SIZE
    for _ in range(10):
        top, left = int(rng.integers(height - size + 1)), int(rng.integers(width - size + 1))
        if all(top + size <= t or t + s <= top or left + size <= l or l + s <= left for t, l, s in taken):
            return top, left
    return None


def _compose(rng: np.random.Generator, photos: List[np.ndarray], scans: np.ndarray, digits: np.ndarray
             ) -> Tuple[np.ndarray, np.ndarray]:
    """One image (RGB) and its ADE20K-style annotation."""
    width, height = IMAGE_SIZE
    image = _photo_background(rng, photos)
    label = np.ones((height, width), np.uint8)
    taken: List[Tuple[int, int, int]] = []
    for _ in range(DIGITS_PER_IMAGE):
        size = int(rng.integers(DIGIT_SIZE[0], DIGIT_SIZE[1] + 1))
        place = _free_place(rng, size, taken)
        if place is None:
            continue
        taken.append((*place, size))
        k = rng.integers(len(scans))
        ink = _ink_digit(rng, image, scans[k], *place, size)
        window = (slice(place[0], place[0] + size), slice(place[1], place[1] + size))
        label[window] = np.where(ink >= 0.5, digits[k] + 2, np.where(ink > 0.2, 0, label[window]))
    return image.round().astype(np.uint8), label


def scan_splits(count: int) -> dict:
    """Scan indices per split: validation takes the scans the classification run holds out, training the rest."""
    index = np.arange(count)
    return {'training': index[index % VAL_EVERY != 0], 'validation': index[index % VAL_EVERY == 0]}


def write_digits_ade(root: str | Path, seed: int = 0) -> Path:
    """Write the set under `root` ({images,annotations}/{training,validation}); do nothing if it is complete.

    A set written by an older version of this function is replaced.
    """
    from sklearn.datasets import load_digits
    root = Path(root)
    ready = root / READY
    if ready.is_file() and ready.read_text() == VERSION:
        return root
    shutil.rmtree(root, ignore_errors=True)
    scans, digits = load_digits(return_X_y=True)
    scans = scans.reshape(-1, 8, 8)
    photos = _load_photos()
    for index, (split, scan_index) in enumerate(scan_splits(len(scans)).items()):
        rng = np.random.default_rng([seed, index])
        (root / 'images' / split).mkdir(parents=True, exist_ok=True)
        (root / 'annotations' / split).mkdir(parents=True, exist_ok=True)
        for i in range(SPLITS[split]):
            image, label = _compose(rng, photos, scans[scan_index], digits[scan_index])
            stem = f'digits_{split}_{i:05d}'
            cv2.imwrite(str(root / 'images' / split / f'{stem}.jpg'), cv2.cvtColor(image, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 95])
            cv2.imwrite(str(root / 'annotations' / split / f'{stem}.png'), label)
    ready.write_text(VERSION)
    return root
