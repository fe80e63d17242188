"""The embedded digits as a classification run's data, prepared on first use, each step skipped when its result is
on disk and resumed when it was cut off: `EmbeddedScans.image_data` and `annotation` (the scans folder, and a small
CNN annotator with its token labels: what `tools/train_cls.py` trains on without --data-dir), and
`EmbeddedScans.pretrained_backbone` (a model pretrained with token labeling on that data, which a segmentation config
on the embedded pages starts from when its ImageNet weights are not on disk)."""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from backbones.common.cli import DEFAULT_WORKERS
from backbones.common.distributed import DistInfo, barrier, computed_once, run_distributed
from backbones.common.errors import CheckpointError, Interrupted
from backbones.common.log import logger
from backbones.common.outputs import output_folder
from classification.digits.scans import VERSION, discard_outdated, write_digits_folder
from classification.engine.checkpoints import BEST, LAST, METRICS, read_training_checkpoint
from classification.engine.trainer import RunOptions
from classification.loaders import Annotation, ImageData
from classification.models import whole_patches
from classification.recipes import Recipe, recipe_for
from classification.run_plan import RunStart
from classification.train import prepare_embedded_data, train

SCANS_DIR = Path('data/digits')  # the default --digits-dir
# The recipe on the digits (about 7 minutes for LV-ViT-S on 2 CPU cores): 48x48 images (a 3x3 token grid), 8 epochs
# of 44 updates, milder crops and RandAugment than ImageNet's for 1,437 training images, no EMA for so few updates,
# and no flips (a mirrored digit is not a digit).
RECIPE = dict(epochs=8, warmup_epochs=1, batch_size=32, img_size=48, lr_base=1e-3, lr_base_batch=32,
              min_lr=1e-5, ema_decay=0.0, scale_min=0.5, auto_augment='rand-m5-mstd0.5-inc1', reprob=0.0,
              drop_path=0.0, hflip=0.0, aug_repeats=0)
ANNOTATOR = 'resnet10t'  # a timm CNN: its head applied per position gives meaningful dense scores
# The annotators a run may choose (--digits-annotator), smallest first: timm ResNets of growing size (4.9M, 11.2M,
# 21.3M parameters), for the paper's Figure 4 right (token labeling is robust to the annotator)
ANNOTATORS = (ANNOTATOR, 'resnet18', 'resnet34')
ANNOTATOR_KWARGS = {'output_stride': 16}  # score maps on the same stride-16 grid as the trained models' tokens
# The annotator's recipe over timm's defaults for a CNN: a few epochs, no EMA, mixup, cutmix, RandAugment or erasing.
ANNOTATOR_RECIPE = dict(epochs=6, warmup_epochs=1, lr_base=2e-3, lr_base_batch=32, ema_decay=0.0, drop_path=0.0,
                        mixup=0.0, cutmix=0.0, auto_augment=None, reprob=0.0, scale_min=0.5)


def annotator_recipe(recipe: Recipe) -> Recipe:
    """The annotator's recipe, at the input size and batch of the run it labels for, the same for every annotator."""
    values = {**vars(recipe_for(ANNOTATOR)), **ANNOTATOR_RECIPE, 'img_size': recipe.img_size,
              'batch_size': recipe.batch_size}
    return Recipe(**values)


@dataclass(frozen=True)
class EmbeddedScans:
    """scikit-learn's digit scans under `root`: the tools' classification data without ImageNet."""

    root: Path = SCANS_DIR
    annotator: str = ANNOTATOR
    description: ClassVar[str] = 'the embedded scikit-learn digits (1,797 real 8x8 scans, written on first use)'
    recipe_values: ClassVar[dict] = RECIPE

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument('--digits-dir', type=output_folder, default=SCANS_DIR,
                            help=f'where the embedded digits and what is trained on them live (default {SCANS_DIR})')
        parser.add_argument('--digits-annotator', choices=ANNOTATORS, default=ANNOTATOR,
                            help=f'the CNN whose score maps are the digits\' token labels (default {ANNOTATOR}); '
                                 f'trained and its store written on first use')

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EmbeddedScans:
        return cls(args.digits_dir, args.digits_annotator)

    def annotator_dir(self) -> Path:
        """The annotator's run folder: `annotator/` for the default one, `annotator_NAME/` for another."""
        return self.root / self._own('annotator')

    def labels_dir(self) -> Path:
        """The annotator's token-label store: `token_labels/`, or `token_labels_NAME/`."""
        return self.root / self._own('token_labels')

    def _own(self, folder: str) -> str:
        """`folder` for the default annotator; for another, suffixed with its name (what it made is its own)."""
        return folder if self.annotator == ANNOTATOR else f'{folder}_{self.annotator}'

    def image_data(self, recipe: Recipe, info: DistInfo) -> ImageData:
        """The scans folder (written on first use) and, if `recipe` trains on score maps, its token labels' folder."""
        images = self.root / 'images'
        if info.is_main:
            discard_outdated(self.root)
            write_digits_folder(images)
        barrier(info)
        return ImageData(images, self.labels_dir() if recipe.uses_score_maps else None)

    def annotation(self, recipe: Recipe) -> Annotation | None:
        """The annotator trained on the scans and its token labels, for a `recipe` that trains on score maps."""
        if not recipe.uses_score_maps:
            return None
        return Annotation(self.annotator, annotator_recipe(recipe), self.annotator_dir(), self.labels_dir(),
                          ANNOTATOR_KWARGS)

    def pretrained_backbone(self, model_name: str, model_kwargs: dict | None = None) -> Path:
        """`best.pth` of `model_name` pretrained with token labeling on the scans, for a segmentation config on the
        pages: kept when finished, a stopped run continued (a stop here exits 75), an unreadable one redone."""
        model_kwargs = dict(model_kwargs or {})
        output = self.pretraining_dir(model_name, model_kwargs)
        run_distributed(lambda info: self._pretrain(model_name, model_kwargs, output, info))
        return output / BEST

    def pretraining_dir(self, model_name: str, model_kwargs: dict) -> Path:
        """`backbones/MODEL-KEY`: KEY a digest of everything that shapes the pretraining."""
        shaping = dict(model=model_name, model_kwargs=model_kwargs, annotator=self.annotator, scans=VERSION,
                       recipe=vars(pretraining_recipe(model_name, model_kwargs)))
        key = hashlib.sha256(json.dumps(shaping, sort_keys=True, default=repr).encode()).hexdigest()[:10]
        return self.root / 'backbones' / f'{self._own(model_name)}-{key}'

    def _pretrain(self, model_name: str, model_kwargs: dict, output: Path, info: DistInfo) -> None:
        state = computed_once(lambda: pretraining_state(self.root, output), info)
        if state == FINISHED:
            logger.info(f'stage 1 of 2: {model_name} pretrained on the embedded digits, kept from an earlier run in '
                        f'{output}')
            return
        if state == STOPPED:
            logger.info(f'stage 1 of 2: continuing the stopped pretraining of {model_name} on the embedded digits '
                        f'in {output}')
        else:
            logger.info(f'stage 1 of 2: pretraining {model_name} with token labeling on the embedded digits for the '
                        f'segmentation backbone -> {output}')
        recipe = pretraining_recipe(model_name, model_kwargs)
        options = RunOptions(output, resume='auto' if state == STOPPED else None, model_kwargs=model_kwargs,
                             workers=DEFAULT_WORKERS)
        try:
            train(model_name, recipe, prepare_embedded_data(self, recipe, info, options.workers), options, info,
                  RunStart(PRETRAINING_PRESET))
        except Interrupted as stop:  # train_cls's advice (--resume) is not this command's: it continues by itself
            where = str(stop).split('; the same command', 1)[0]
            raise Interrupted(f'stage 1 of 2 (the backbone\'s pretraining): {where}; the same command again '
                              'continues it') from None


PRETRAINING_PRESET = 'token-labeling'


def pretraining_recipe(model_name: str, model_kwargs: dict) -> Recipe:
    """The recipe a segmentation backbone is pretrained with on the scans (at the same tokens per scan)."""
    recipe = recipe_for(model_name, PRETRAINING_PRESET, RECIPE)
    return replace(recipe, img_size=whole_patches(model_name, recipe.img_size, model_kwargs))


# Where a backbone's pretraining stands (`pretraining_state`)
FINISHED, STOPPED, NEW = 'finished', 'stopped', 'new'


def pretraining_state(digits_dir: Path, output: Path) -> str:
    """Where the pretraining in `output` stands: FINISHED (metrics.json and a readable best.pth), STOPPED (a readable
    last.pth) or NEW; a run from outdated scans or with an unreadable file is removed."""
    discard_outdated(digits_dir)
    finished = (output / METRICS).is_file()
    checked = output / (BEST if finished else LAST)
    if finished or checked.is_file():
        try:
            read_training_checkpoint(checked, mmap=True)
            return FINISHED if finished else STOPPED
        except CheckpointError as exc:
            logger.warning(f'warning: {exc}: the pretraining in {output} starts again')
    shutil.rmtree(output, ignore_errors=True)  # what a run left before its first checkpoint, or a damaged one
    return NEW


def describe_backbone(checkpoint: Path) -> str:
    """One line saying where a digits-pretrained backbone came from, with its classification result."""
    metrics = json.loads((checkpoint.parent / METRICS).read_text())
    return (f'{metrics["model"]} pretrained on the embedded digits ({metrics.get("preset", "token-labeling")}, '
            f'best val top-1 {metrics["best_top1"]:.1f}% at epoch {metrics["best_epoch"]}) from {checkpoint}')
