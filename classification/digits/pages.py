"""The embedded dense-prediction set, "pages": scikit-learn's handwritten digits in a row of cells on a dark page, in
ADE20K's layout, with the same pages' digits as COCO-format instances and a synthetic depth map in NYU-v2's format
(`write_digits_ade`), used by the segmentation tools when no ADE20K is on disk (`seg_data`).

Annotations follow ADE20K: 1 is background, 2..11 are the digits 0..9, and 0 marks the digits' soft edges (ignored,
reduce_zero_label). The validation pages use only the scans the classification run holds out (`scan_splits`); every
digit is one COCO instance of category `digit + 1` (`coco_annotation`); the depth is 16-bit millimetres
(`depth_map`). docs/segmentation.md (ADE20K) and docs/instances_and_depth.md ("The embedded defaults") tell why and
give the sizes."""
from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
from pycocotools import mask as mask_utils

from backbones.common.files import write_folder_once
from classification.digits.scans import VAL_EVERY, render_scan

CLASSES = ('background',) + tuple(str(d) for d in range(10))
SPLITS = {'training': 800, 'validation': 160}
IMAGE_SIZE = (144, 48)  # width, height
GRID = (3, 1)  # cells across, down
DIGIT_SIZE = (40, 48)  # pixels, the side of a digit's 8x8 scan once inked
FILL = 0.85  # chance that a cell holds a digit
INK = (170, 255)  # per-channel range of the ink colour
NOISE = 8.0  # standard deviation of the ground's noise, in grey levels
VERSION = ('digits-seg v5: row of three 48 px cells, 40-48 px light digits on black, held-out scans for validation; '
           'COCO instances, synthetic depth\n')
GROUND_DEPTH = (6.0, 4.0)  # metres at the top and at the bottom of a page
DIGIT_DEPTH = (1.5, 0.25)  # metres: digit d stands at 1.5 + 0.25 d
DEPTH_SCALE = 1000  # depth PNG values per metre (NYU-v2's millimetres)
INSTANCE_CATEGORIES = [dict(id=d + 1, name=str(d)) for d in range(10)]
PALETTE = [[120, 120, 120]] + [[int(c) for c in cv2.cvtColor(np.uint8([[[18 * d, 220, 255]]]), cv2.COLOR_HSV2RGB)[0, 0]]
                               for d in range(10)]  # grey background, digits around the hue circle


def _ink_digit(rng: np.random.Generator, image: np.ndarray, scan: np.ndarray, top: int, left: int, size: int
              ) -> np.ndarray:
    """Ink an 8x8 scan into `image` as a `size` square at (top, left), in place; returns its ink coverage (0..1)."""
    ink = render_scan(scan, size)
    window = (slice(top, top + size), slice(left, left + size))
    colour = rng.uniform(*INK, 3).astype(np.float32)
    image[window] = image[window] * (1 - ink[..., None]) + colour * ink[..., None]
    return ink


def _compose(rng: np.random.Generator, scans: np.ndarray, digits: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, list[tuple[int, np.ndarray]]]:
    """One image (RGB), its ADE20K-style annotation, and its digits with their masks."""
    width, height = IMAGE_SIZE
    cell_w, cell_h = width // GRID[0], height // GRID[1]
    image = np.abs(rng.normal(0, NOISE, (height, width, 3))).astype(np.float32)
    label = np.ones((height, width), np.uint8)
    instances = []
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
            mask = np.zeros_like(label, dtype=bool)
            mask[window] = ink >= 0.5  # the pixels the annotation labels as this digit
            instances.append((int(digits[k]), mask))
    return image.clip(0, 255).round().astype(np.uint8), label, instances


def depth_map(label: np.ndarray) -> np.ndarray:
    """A page's synthetic depth (uint16, DEPTH_SCALE per metre): the ground plane, the digits before it."""
    height = label.shape[0]
    top, bottom = GROUND_DEPTH
    metres = np.repeat(np.linspace(top, bottom, height)[:, None], label.shape[1], axis=1)
    digit = label.astype(np.float64) - 2
    metres = np.where(label >= 2, DIGIT_DEPTH[0] + DIGIT_DEPTH[1] * digit, metres)
    metres = np.where(label == 0, 0.0, metres)
    return np.round(metres * DEPTH_SCALE).astype(np.uint16)


def coco_annotation(mask: np.ndarray, digit: int, image_id: int, annotation_id: int) -> dict:
    """One digit as a COCO instance: its mask as compressed RLE, its box the mask's extent."""
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    box = [float(v) for v in mask_utils.toBbox(rle)]
    return dict(id=annotation_id, image_id=image_id, category_id=digit + 1, iscrowd=0, bbox=box,
                area=float(mask_utils.area(rle)), segmentation=dict(size=list(rle['size']),
                                                                      counts=rle['counts'].decode('ascii')))


def scan_splits(count: int) -> dict:
    """Scan indices per split: validation takes the scans the classification run holds out, training the rest."""
    index = np.arange(count)
    return {'training': index[index % VAL_EVERY != 0], 'validation': index[index % VAL_EVERY == 0]}


def write_digits_ade(root: str | Path, seed: int = 0) -> Path:
    """Write the set under `root` unless it is complete (a set an older version wrote is replaced)."""
    return write_folder_once(root, VERSION, lambda folder: _write_pages(folder, seed))


def _write_pages(root: Path, seed: int) -> None:
    from sklearn.datasets import load_digits
    scans, digits = load_digits(return_X_y=True)
    scans = scans.reshape(-1, 8, 8)
    for index, (split, scan_index) in enumerate(scan_splits(len(scans)).items()):
        rng = np.random.default_rng([seed, index])
        for folder in ('images', 'annotations', 'depth'):
            (root / folder / split).mkdir(parents=True, exist_ok=True)
        coco = dict(images=[], annotations=[], categories=INSTANCE_CATEGORIES)
        for i in range(SPLITS[split]):
            image, label, instances = _compose(rng, scans[scan_index], digits[scan_index])
            stem = f'digits_{split}_{i:05d}'
            cv2.imwrite(str(root / 'images' / split / f'{stem}.jpg'), cv2.cvtColor(image, cv2.COLOR_RGB2BGR),
                        [cv2.IMWRITE_JPEG_QUALITY, 95])
            cv2.imwrite(str(root / 'annotations' / split / f'{stem}.png'), label)
            cv2.imwrite(str(root / 'depth' / split / f'{stem}.png'), depth_map(label))
            coco['images'].append(dict(id=i + 1, file_name=f'{stem}.jpg', width=IMAGE_SIZE[0], height=IMAGE_SIZE[1]))
            coco['annotations'] += [coco_annotation(mask, digit, i + 1, len(coco['annotations']) + n + 1)
                                    for n, (digit, mask) in enumerate(instances) if mask.any()]
        (root / 'annotations' / f'instances_{split}.json').write_text(json.dumps(coco))
