"""The embedded default data: scikit-learn's handwritten digits (1,797 real 8x8 scans shipped in the package),
written as an ImageNet-layout folder, with a small CNN annotator and its token labels, all on the CPU.

Each image is a small scene, not a bare scan: a dimmed crop of one of scikit-learn's two sample photographs with
the digit inked in a light colour at a random size and place. A model must find the digit, so its patch tokens
learn what a digit looks like wherever it stands; the annotator's score maps then differ between the digit's
tokens and the background's, which is what token labeling is about. The embedded segmentation set is drawn the
same way (`segmentation/digits.py`), so a backbone pretrained here transfers to it. Bare centred scans taught
the tokens nothing that survived in a scene: a token-labeled LV-ViT-S read 13% of the digit tokens right in
segmentation images (10% is chance) while it classified 83% of the scans.

Every step is skipped when its result is already on disk, and the annotator's training resumes if it was cut off.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import List, Tuple

import numpy as np
from PIL import Image

from .distributed import DistInfo, barrier
from .label_store import META
from .recipes import Recipe

IMAGE_SIZE = 48  # the scenes' side, the digits run's input size
DIGIT_SIZE = (20, 40)  # pixels, the side of a digit's 8x8 scan once inked into a scene
BACKGROUND_GAIN = (0.2, 0.45)  # the photographs are dimmed so that the light ink stands out
INK = (170, 255)  # per-channel range of the ink colour
VAL_EVERY = 5  # every fifth image (in the data set's order) is held out for validation
VERSION = 'digits v2: scans inked on dimmed photographs, 48 px scenes\n'
ANNOTATOR = 'resnet10t'  # a timm CNN: its head applied per position gives meaningful dense scores
ANNOTATOR_ARGS = ['--epochs', '6', '--warmup-epochs', '1', '--lr-base', '2e-3', '--lr-base-batch', '32', '--ema-decay', '0',
                  '--drop-path', '0', '--mixup', '0', '--cutmix', '0', '--auto-augment', 'none', '--reprob', '0',
                  '--scale-min', '0.5']
ANNOTATOR_KWARGS = {'output_stride': 16}  # score maps on the same stride-16 grid as the trained models' tokens
DERIVED = ('annotator', 'token_labels', 'backbones')  # what is made from the images, beside them


def load_photos() -> List[np.ndarray]:
    """scikit-learn's two sample photographs (RGB, uint8)."""
    from sklearn.datasets import load_sample_images
    return list(load_sample_images().images)


def photo_background(rng: np.random.Generator, photos: List[np.ndarray], size: Tuple[int, int]) -> np.ndarray:
    """A random crop of a random photograph, resized to `size` (width, height) and dimmed; float32 RGB."""
    import cv2
    width, height = size
    photo = photos[rng.integers(len(photos))]
    crop_w = int(min(photo.shape[1], photo.shape[0] * width / height) * rng.uniform(0.35, 1.0))
    crop_h = crop_w * height // width
    y, x = rng.integers(photo.shape[0] - crop_h + 1), rng.integers(photo.shape[1] - crop_w + 1)
    image = cv2.resize(photo[y:y + crop_h, x:x + crop_w], size, interpolation=cv2.INTER_AREA).astype(np.float32)
    return image * rng.uniform(*BACKGROUND_GAIN)


def ink_digit(rng: np.random.Generator, image: np.ndarray, scan: np.ndarray, top: int, left: int, size: int
              ) -> np.ndarray:
    """Ink an 8x8 scan (values 0..16) into `image` as a `size` square at (top, left), in a random light colour, in
    place; returns the ink coverage (0..1) of that square."""
    import cv2
    ink = cv2.resize(scan / 16.0, (size, size), interpolation=cv2.INTER_LINEAR).clip(0, 1)
    window = (slice(top, top + size), slice(left, left + size))
    colour = rng.uniform(*INK, 3).astype(np.float32)
    image[window] = image[window] * (1 - ink[..., None]) + colour * ink[..., None]
    return ink


def digit_scene(n: int, scan: np.ndarray, photos: List[np.ndarray]) -> Tuple[np.ndarray, Tuple[int, int, int]]:
    """Scene `n` of the classification set (uint8 RGB) and where its digit is: (top, left, size)."""
    rng = np.random.default_rng([7, n])
    image = photo_background(rng, photos, (IMAGE_SIZE, IMAGE_SIZE))
    size = int(rng.integers(DIGIT_SIZE[0], DIGIT_SIZE[1] + 1))
    top, left = (int(v) for v in rng.integers(IMAGE_SIZE - size + 1, size=2))
    ink_digit(rng, image, scan, top, left, size)
    return image.round().astype(np.uint8), (top, left, size)


def write_digits_folder(root: Path) -> bool:
    """train/<digit>/<n>.png and val/<digit>/<n>.png, one scene per scan; True if it wrote them (they were
    missing or of an older version), False if they were on disk."""
    ready = root / 'READY'
    if ready.is_file() and ready.read_text() == VERSION:
        return False
    from sklearn.datasets import load_digits
    digits = load_digits()
    photos = load_photos()
    tmp = root.with_name(root.name + '.tmp')
    shutil.rmtree(tmp, ignore_errors=True)
    for n, (scan, label) in enumerate(zip(digits.images, digits.target)):
        split = 'val' if n % VAL_EVERY == 0 else 'train'
        folder = tmp / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(digit_scene(n, scan, photos)[0]).save(folder / f'{n:04d}.png')
    (tmp / 'READY').write_text(VERSION)
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)
    return True


def prepare_digits_run(digits_dir: Path, recipe: Recipe, info: DistInfo, workers: int) -> Tuple[Path, Path | None]:
    """Data folder and (if the recipe uses token labeling) token-label store of the embedded digits run."""
    from .annotate import generate_token_labels
    from .train import build_parser, run

    data_dir = digits_dir / 'images'
    if info.is_main and write_digits_folder(data_dir):
        for name in DERIVED:  # made from images that are gone
            shutil.rmtree(digits_dir / name, ignore_errors=True)
    barrier(info)
    if not recipe.uses_score_maps:
        return data_dir, None
    annotator_dir = digits_dir / 'annotator'
    if not (annotator_dir / 'metrics.json').exists():
        args = [ANNOTATOR, '--data-dir', str(data_dir), '--output', str(annotator_dir), '--workers', str(workers),
                '--img-size', str(recipe.img_size), '--batch-size', str(recipe.batch_size), *ANNOTATOR_ARGS,
                '--model-kwargs', *(f'{k}={v}' for k, v in ANNOTATOR_KWARGS.items())]
        if (annotator_dir / 'last.pth').exists():
            args.append('--resume')
        if info.is_main:
            print(f'digits: training the annotator {ANNOTATOR} ...', flush=True)
        run(build_parser().parse_args(args), info)
    labels_dir = digits_dir / 'token_labels'
    done = (labels_dir / META).exists() and json.loads((labels_dir / META).read_text()).get('complete')
    if not done:
        if info.is_main:
            print('digits: generating token labels ...', flush=True)
        generate_token_labels(data_dir, ANNOTATOR, labels_dir, info, checkpoint=str(annotator_dir / 'last.pth'),
                              img_size=recipe.img_size, workers=workers, model_kwargs=ANNOTATOR_KWARGS)
    return data_dir, labels_dir
