"""The runs that prepare the embedded digits for the tools, each skipped when its result is on disk and resumed
when it was cut off:

- `embedded_image_data`: the classification folder, a small CNN annotator (timm's `resnet10t`, trained on the
  folder) and its token labels: what `tools/train_cls.py` trains on without --data-dir;
- `pretrained_backbone`: a model pretrained with token labeling on that data, which a segmentation config on the
  embedded set starts from when its ImageNet weights are not on disk (the *same* model: same name, same model
  arguments; on 2 CPU cores about 6 minutes for LV-ViT-S, 12 for LV-ViT-M).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from classification.recipes import Recipe, recipe_for
from classification.train import ImageData, train
from common.distributed import DistInfo, barrier, run_distributed
from common.log import logger
from engine.fit import BEST, LAST, METRICS
from engine.trainer import RunOptions
from token_labeling.annotate import generate_token_labels
from token_labeling.label_store import META

from .scans import discard_outdated, write_digits_folder

DIGITS_DIR = Path('data/digits')  # tools/train_cls.py's default --digits-dir
ANNOTATOR = 'resnet10t'  # a timm CNN: its head applied per position gives meaningful dense scores
ANNOTATOR_KWARGS = {'output_stride': 16}  # score maps on the same stride-16 grid as the trained models' tokens
# The annotator's recipe over timm's defaults for a CNN: a few epochs, no EMA, mixup, cutmix, RandAugment or erasing.
ANNOTATOR_RECIPE = dict(epochs=6, warmup_epochs=1, lr_base=2e-3, lr_base_batch=32, ema_decay=0.0, drop_path=0.0,
                        mixup=0.0, cutmix=0.0, auto_augment=None, reprob=0.0, scale_min=0.5)


def annotator_recipe(recipe: Recipe) -> Recipe:
    """The annotator's recipe, at the input size and batch of the run it labels for."""
    values = {**vars(recipe_for(ANNOTATOR)), **ANNOTATOR_RECIPE, 'img_size': recipe.img_size,
              'batch_size': recipe.batch_size}
    return Recipe(**values)


def label_store_complete(labels_dir: Path) -> bool:
    return (labels_dir / META).is_file() and json.loads((labels_dir / META).read_text()).get('complete', False)


def embedded_image_data(digits_dir: Path, recipe: Recipe, info: DistInfo, workers: int) -> ImageData:
    """The digits folder and, if `recipe` trains on score maps, its token labels (annotator trained first)."""
    data = ImageData(digits_dir / 'images')
    if info.is_main:
        discard_outdated(digits_dir)
        write_digits_folder(data.root)
    barrier(info)
    if not recipe.uses_score_maps:
        return data
    annotator_dir, labels_dir = digits_dir / 'annotator', digits_dir / 'token_labels'
    if not (annotator_dir / METRICS).is_file():
        logger.info(f'digits: training the annotator {ANNOTATOR} ...')
        options = RunOptions(annotator_dir, resume='auto' if (annotator_dir / LAST).is_file() else None,
                             model_kwargs=ANNOTATOR_KWARGS, workers=workers)
        train(ANNOTATOR, annotator_recipe(recipe), data, options, info)
    if not label_store_complete(labels_dir):
        logger.info('digits: generating token labels ...')
        generate_token_labels(data.root, ANNOTATOR, labels_dir, info, checkpoint=str(annotator_dir / LAST),
                              img_size=recipe.img_size, workers=workers, model_kwargs=ANNOTATOR_KWARGS)
    return ImageData(data.root, labels_dir)


def pretrained_backbone(model_name: str, model_kwargs: dict | None = None) -> Path:
    """`best.pth` of `model_name` pretrained with token labeling on the embedded digits; trained if not on disk."""
    output = DIGITS_DIR / 'backbones' / model_name
    discard_outdated(DIGITS_DIR)
    if not (output / METRICS).is_file():
        logger.info(f'pretraining {model_name} with token labeling on the embedded digits for the segmentation '
                    f'backbone -> {output}')
        preset = 'token-labeling'
        recipe = recipe_for(model_name, digits=True, preset=preset)
        options = RunOptions(output, resume='auto' if (output / LAST).is_file() else None,
                             model_kwargs=dict(model_kwargs or {}), workers=min(4, os.cpu_count() or 1))
        run_distributed(lambda info: train(model_name, recipe,
                                           embedded_image_data(DIGITS_DIR, recipe, info, options.workers), options,
                                           info, preset))
    return output / BEST


def describe_backbone(checkpoint: Path) -> str:
    """One line saying where a digits-pretrained backbone came from, with its classification result."""
    metrics = json.loads((checkpoint.parent / METRICS).read_text())
    return (f'{metrics["model"]} pretrained on the embedded digits ({metrics.get("preset", "token-labeling")}, '
            f'best val top-1 {metrics["best_top1"]:.1f}% at epoch {metrics["best_epoch"]}) from {checkpoint}')
