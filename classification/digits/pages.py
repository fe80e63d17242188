"""The embedded segmentation set, "pages": scikit-learn's handwritten digits in a row of cells on a dark page, in
ADE20K's layout.

Used by the segmentation tools when no ADE20K is on disk (`seg_data`). An image is a row of three 48 px cells, most
of them holding one digit scan inked in a light colour at a random size and place inside its cell, on a black ground
with faint noise: the look of the classification scans (light strokes on black), so that a backbone pretrained on
those transfers. Annotations follow ADE20K: 1 is background, 2..11 are the digits 0..9, and 0 marks the digits' soft
edges, which are ignored like ADE20K's "other" (reduce_zero_label).

Sizes: the configs' sizes are scaled so that their 512 px training crop becomes 48 px, the input size of the
classification pretraining, and a digit is 40-48 px, as it is there (three tokens of 16 px). The scale matters:
a backbone pretrained on digits that fill its 48 px frame recognises 66% of these cells, but only 29% of the same
digits seen in a 64 px window (LV-ViT-M, measured), and digits of one or two tokens are too small for a stride-16
backbone. The validation images use only the scans the classification run holds out (every fifth), so pretraining
never saw their digits.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np

from classification.digits.scans import VAL_EVERY, render_scan

CLASSES = ('background',) + tuple(str(d) for d in range(10))
SPLITS = {'training': 800, 'validation': 160}
IMAGE_SIZE = (144, 48)  # width, height
GRID = (3, 1)  # cells across, down
DIGIT_SIZE = (40, 48)  # pixels, the side of a digit's 8x8 scan once inked
FILL = 0.85  # chance that a cell holds a digit
INK = (170, 255)  # per-channel range of the ink colour
NOISE = 8.0  # standard deviation of the ground's noise, in grey levels
VERSION = 'digits-seg v4: row of three 48 px cells, 40-48 px light digits on black, held-out scans for validation\n'
READY = 'READY'
PALETTE = [[120, 120, 120]] + [[int(c) for c in cv2.cvtColor(np.uint8([[[18 * d, 220, 255]]]), cv2.COLOR_HSV2RGB)[0, 0]]
                               for d in range(10)]  # grey background, digits around the hue circle
# mmseg's plain dataset with the pages' classes: ADE20K's file suffixes and label convention
DATASET = dict(type='BaseSegDataset', metainfo=dict(classes=CLASSES, palette=PALETTE), img_suffix='.jpg',
               seg_map_suffix='.png', reduce_zero_label=True)


def _ink_digit(rng: np.random.Generator, image: np.ndarray, scan: np.ndarray, top: int, left: int, size: int
              ) -> np.ndarray:
    """Ink an 8x8 scan (values 0..16) into `image` as a `size` square at (top, left), in a random light colour, in
    place; returns the ink coverage (0..1) of that square."""
    ink = render_scan(scan, size)
    window = (slice(top, top + size), slice(left, left + size))
    colour = rng.uniform(*INK, 3).astype(np.float32)
    image[window] = image[window] * (1 - ink[..., None]) + colour * ink[..., None]
    return ink


def _compose(rng: np.random.Generator, scans: np.ndarray, digits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One image (RGB) and its ADE20K-style annotation."""
    width, height = IMAGE_SIZE
    cell_w, cell_h = width // GRID[0], height // GRID[1]
    image = np.abs(rng.normal(0, NOISE, (height, width, 3))).astype(np.float32)
    label = np.ones((height, width), np.uint8)
    for row in range(GRID[1]):
        for col in range(GRID[0]):
            if rng.random() > FILL:
                continue
            size = int(rng.integers(DIGIT_SIZE[0], DIGIT_SIZE[1] + 1))
            top = row * cell_h + int(rng.integers(cell_h - size + 1))
            left = col * cell_w + int(rng.integers(cell_w - size + 1))
            k = rng.integers(len(scans))
            ink = _ink_digit(rng, image, scans[k], top, left, size)
            window = (slice(top, top + size), slice(left, left + size))
            label[window] = np.where(ink >= 0.5, digits[k] + 2, np.where(ink > 0.2, 0, label[window]))
    return image.clip(0, 255).round().astype(np.uint8), label


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
    for index, (split, scan_index) in enumerate(scan_splits(len(scans)).items()):
        rng = np.random.default_rng([seed, index])
        (root / 'images' / split).mkdir(parents=True, exist_ok=True)
        (root / 'annotations' / split).mkdir(parents=True, exist_ok=True)
        for i in range(SPLITS[split]):
            image, label = _compose(rng, scans[scan_index], digits[scan_index])
            stem = f'digits_{split}_{i:05d}'
            cv2.imwrite(str(root / 'images' / split / f'{stem}.jpg'), cv2.cvtColor(image, cv2.COLOR_RGB2BGR),
                        [cv2.IMWRITE_JPEG_QUALITY, 95])
            cv2.imwrite(str(root / 'annotations' / split / f'{stem}.png'), label)
    ready.write_text(VERSION)
    return root
