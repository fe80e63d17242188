"""The embedded segmentation set: scikit-learn's handwritten digits on real photographs, in ADE20K's layout.

Used by the tools when no ADE20K is on disk. Each image is a crop of one of scikit-learn's two sample photographs
with a few digits (from disjoint halves of the 1,797 scans for training and validation) inked on it at random
sizes, colours and places. Annotations follow ADE20K: 1 is background, 2..11 are the digits 0..9, and 0 marks the
digits' soft edges, which are ignored like ADE20K's "other" (reduce_zero_label). Images are 4:3, 192x144, a
quarter of ADE20K's scale, and the tools run the configs at a quarter of their sizes on it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Tuple

import cv2
import numpy as np

from mmseg.datasets import BaseSegDataset
from mmseg.registry import DATASETS

CLASSES = ('background',) + tuple(str(d) for d in range(10))
SPLITS = {'training': 320, 'validation': 40}
IMAGE_SIZE = (192, 144)  # width, height
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


def _backgrounds() -> list[np.ndarray]:
    from sklearn.datasets import load_sample_images
    return [cv2.cvtColor(img, cv2.COLOR_RGB2BGR) for img in load_sample_images().images]


def _compose(rng: np.random.Generator, photos: list[np.ndarray], scans: np.ndarray, digits: np.ndarray
             ) -> Tuple[np.ndarray, np.ndarray]:
    """One image (BGR) and its ADE20K-style annotation."""
    width, height = IMAGE_SIZE
    photo = photos[rng.integers(len(photos))]
    crop_w = int(min(photo.shape[1], photo.shape[0] * width / height) * rng.uniform(0.35, 1.0))
    crop_h = crop_w * height // width
    y, x = rng.integers(photo.shape[0] - crop_h + 1), rng.integers(photo.shape[1] - crop_w + 1)
    image = cv2.resize(photo[y:y + crop_h, x:x + crop_w], IMAGE_SIZE, interpolation=cv2.INTER_AREA).astype(np.float32)
    label = np.ones((height, width), np.uint8)
    for _ in range(rng.integers(2, 5)):
        k = rng.integers(len(scans))
        size = int(rng.integers(32, 72))
        ink = cv2.resize(scans[k] / 16.0, (size, size), interpolation=cv2.INTER_LINEAR).clip(0, 1)
        top, left = rng.integers(height - size + 1), rng.integers(width - size + 1)
        window = (slice(top, top + size), slice(left, left + size))
        colour = rng.uniform(0, 255, 3).astype(np.float32)
        image[window] = image[window] * (1 - ink[..., None]) + colour * ink[..., None]
        label[window] = np.where(ink >= 0.5, digits[k] + 2, np.where(ink > 0.2, 0, label[window]))
    return image.round().astype(np.uint8), label


def write_digits_ade(root: str | Path, seed: int = 0) -> Path:
    """Write the set under `root` ({images,annotations}/{training,validation}); do nothing if it is complete."""
    from sklearn.datasets import load_digits
    root = Path(root)
    if (root / READY).exists():
        return root
    scans, digits = load_digits(return_X_y=True)
    scans = scans.reshape(-1, 8, 8)
    order = np.random.default_rng(seed).permutation(len(scans))
    halves = {'training': order[:len(order) // 2], 'validation': order[len(order) // 2:]}
    photos = _backgrounds()
    for index, (split, count) in enumerate(SPLITS.items()):
        rng = np.random.default_rng([seed, index])
        (root / 'images' / split).mkdir(parents=True, exist_ok=True)
        (root / 'annotations' / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            image, label = _compose(rng, photos, scans[halves[split]], digits[halves[split]])
            stem = f'digits_{split}_{i:05d}'
            cv2.imwrite(str(root / 'images' / split / f'{stem}.jpg'), image, [cv2.IMWRITE_JPEG_QUALITY, 95])
            cv2.imwrite(str(root / 'annotations' / split / f'{stem}.png'), label)
    (root / READY).write_text('scikit-learn digits on scikit-learn sample images\n')
    return root
