"""scikit-learn's handwritten digits (1,797 real 8x8 scans shipped in the package) as an ImageNet-layout folder, each
image one scan filling the frame (a ViT learns small scans at random places far too slowly for a few CPU minutes)."""
from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from backbones.common.files import write_folder_once

IMAGE_SIZE = 32  # the 8x8 scans are stored upsampled; training resizes them again
VERSION = 'sklearn.datasets.load_digits: full-frame scans, 32 px, bilinear\n'
VAL_EVERY = 5  # every fifth image (in the data set's order) is held out for validation


def render_scan(scan: np.ndarray, size: int) -> np.ndarray:
    """An 8x8 scan (values 0..16) as a `size` x `size` ink coverage map (0..1), bilinear."""
    return cv2.resize(scan / 16.0, (size, size), interpolation=cv2.INTER_LINEAR).clip(0, 1)


def write_digits_folder(root: Path) -> Path:
    """train/<digit>/<n>.png and val/<digit>/<n>.png from sklearn's digits (an older version's replaced)."""
    def write(folder: Path) -> None:
        from sklearn.datasets import load_digits
        digits = load_digits()
        for n, (scan, label) in enumerate(zip(digits.images, digits.target)):
            class_folder = folder / ('val' if n % VAL_EVERY == 0 else 'train') / str(label)
            class_folder.mkdir(parents=True, exist_ok=True)
            grey = np.uint8(np.round(render_scan(scan, IMAGE_SIZE) * 255))
            Image.fromarray(grey, 'L').convert('RGB').save(class_folder / f'{n:04d}.png')

    return write_folder_once(root, VERSION, write)


def discard_outdated(digits_dir: Path) -> None:
    """Remove a digits folder whose images an older version wrote: its annotator, labels and models go too."""
    ready = digits_dir / 'images' / 'READY'
    if ready.is_file() and ready.read_text() != VERSION:
        shutil.rmtree(digits_dir)
