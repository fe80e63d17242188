"""The embedded default data: scikit-learn's handwritten digits (1,797 real 8x8 scans shipped in the package),
written as an ImageNet-layout folder, with a small CNN annotator and its token labels, all on the CPU.

Every step is skipped when its result is already on disk, and the annotator's training resumes if it was cut off.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Tuple

import numpy as np
from PIL import Image

from .distributed import DistInfo, barrier
from .label_store import META
from .recipes import Recipe

IMAGE_SIZE = 32  # the 8x8 scans are stored upsampled; training resizes them again
VAL_EVERY = 5  # every fifth image (in the data set's order) is held out for validation
ANNOTATOR = 'resnet10t'  # a timm CNN: its head applied per position gives meaningful dense scores
ANNOTATOR_ARGS = ['--epochs', '6', '--warmup-epochs', '1', '--lr-base', '2e-3', '--lr-base-batch', '32', '--ema-decay', '0',
                  '--drop-path', '0', '--mixup', '0', '--cutmix', '0', '--auto-augment', 'none', '--reprob', '0',
                  '--scale-min', '0.5']
ANNOTATOR_KWARGS = {'output_stride': 16}  # score maps on the same stride-16 grid as the trained models' tokens


def write_digits_folder(root: Path) -> Path:
    """train/<digit>/<n>.png and val/<digit>/<n>.png from sklearn's digits; returns `root`."""
    if (root / 'READY').exists():
        return root
    from sklearn.datasets import load_digits
    digits = load_digits()
    tmp = root.with_name(root.name + '.tmp')
    shutil.rmtree(tmp, ignore_errors=True)
    for n, (pixels, label) in enumerate(zip(digits.images, digits.target)):
        split = 'val' if n % VAL_EVERY == 0 else 'train'
        folder = tmp / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        gray = Image.fromarray(np.uint8(np.round(pixels * 255 / 16)), 'L')
        gray.resize((IMAGE_SIZE, IMAGE_SIZE), Image.BILINEAR).convert('RGB').save(folder / f'{n:04d}.png')
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)
    (root / 'READY').write_text('sklearn.datasets.load_digits\n')
    return root


def prepare_digits_run(digits_dir: Path, recipe: Recipe, info: DistInfo, workers: int) -> Tuple[Path, Path | None]:
    """Data folder and (if the recipe uses token labeling) token-label store of the embedded digits run."""
    from .annotate import generate_token_labels
    from .train import build_parser, run

    data_dir = digits_dir / 'images'
    if info.is_main:
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
