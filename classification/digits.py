"""The embedded default data: scikit-learn's handwritten digits (1,797 real 8x8 scans shipped in the package),
written as an ImageNet-layout folder, with a small CNN annotator and its token labels, all on the CPU.

Every step is skipped when its result is already on disk, and the annotator's training resumes if it was cut off.

Each image is one scan filling the frame. (Scans drawn small at random places on larger black pages would teach
the tokens to localise, but a ViT learns them far too slowly for a few CPU minutes: LV-ViT-S reached 34% top-1
after 6 epochs there, against 93% after 8 on full-frame scans.)
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Tuple

import cv2
import numpy as np
from PIL import Image

from .distributed import DistInfo, barrier
from .label_store import META
from .recipes import Recipe

IMAGE_SIZE = 32  # the 8x8 scans are stored upsampled; training resizes them again
VERSION = 'sklearn.datasets.load_digits: full-frame scans, 32 px, bilinear\n'
VAL_EVERY = 5  # every fifth image (in the data set's order) is held out for validation
ANNOTATOR = 'resnet10t'  # a timm CNN: its head applied per position gives meaningful dense scores
ANNOTATOR_ARGS = ['--epochs', '6', '--warmup-epochs', '1', '--lr-base', '2e-3', '--lr-base-batch', '32', '--ema-decay', '0',
                  '--drop-path', '0', '--mixup', '0', '--cutmix', '0', '--auto-augment', 'none', '--reprob', '0',
                  '--scale-min', '0.5']
ANNOTATOR_KWARGS = {'output_stride': 16}  # score maps on the same stride-16 grid as the trained models' tokens


def render_scan(scan: np.ndarray, size: int) -> np.ndarray:
    """An 8x8 scan (values 0..16) as a `size` x `size` ink coverage map (0..1), bilinear."""
    return cv2.resize(scan / 16.0, (size, size), interpolation=cv2.INTER_LINEAR).clip(0, 1)


def write_digits_folder(root: Path) -> Path:
    """train/<digit>/<n>.png and val/<digit>/<n>.png from sklearn's digits; returns `root`.

    A folder written by an older version of this function is replaced."""
    if (root / 'READY').is_file() and (root / 'READY').read_text() == VERSION:
        return root
    from sklearn.datasets import load_digits
    digits = load_digits()
    tmp = root.with_name(root.name + '.tmp')
    shutil.rmtree(tmp, ignore_errors=True)
    for n, (scan, label) in enumerate(zip(digits.images, digits.target)):
        split = 'val' if n % VAL_EVERY == 0 else 'train'
        folder = tmp / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        grey = np.uint8(np.round(render_scan(scan, IMAGE_SIZE) * 255))
        Image.fromarray(grey, 'L').convert('RGB').save(folder / f'{n:04d}.png')
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)
    (root / 'READY').write_text(VERSION)
    return root


def discard_outdated(digits_dir: Path) -> None:
    """Remove a digits folder whose images an older version wrote: its annotator, labels and models go too."""
    ready = digits_dir / 'images' / 'READY'
    if ready.is_file() and ready.read_text() != VERSION:
        shutil.rmtree(digits_dir)


def prepare_digits_run(digits_dir: Path, recipe: Recipe, info: DistInfo, workers: int) -> Tuple[Path, Path | None]:
    """Data folder and (if the recipe uses token labeling) token-label store of the embedded digits run."""
    from .annotate import generate_token_labels
    from .train import build_parser, run

    data_dir = digits_dir / 'images'
    if info.is_main:
        discard_outdated(digits_dir)
        write_digits_folder(data_dir)
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
