"""The data of an ImageNet-style run (tools/train_cls.py): the data set and its label store (`ImageData`), how
its images are augmented (`--augment`, `--decode`), the training and validation loaders (`make_loaders`), and the
token-label pictures TensorBoard shows at each validation."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

import torch

from backbones.common.cli import EmbeddedData
from backbones.common.distributed import DistInfo
from backbones.common.errors import UsageError
from backbones.common.images import ImageReadError, read_image
from classification.data.augment import TrainTransform
from classification.data.batch_augment import BatchAugment, RegionTransform
from classification.data.folders import ImageFolderDataset, collate_skipping, eval_transform
from classification.engine.fit import Pictures
from classification.engine.samplers import Batching, sharded_loaders
from classification.engine.trainer import RunOptions
from classification.pictures.token_labels import token_label_figure, token_labels
from classification.recipes import Recipe
from classification.token_labeling.label_store import TokenLabelStore


@dataclass(frozen=True)
class ImageData:
    """An ImageNet-layout folder (`train/CLASS/*`, `val/CLASS/*`) and, for token labeling, its label store."""

    root: Path
    token_labels: Path | None = None
    skip_unreadable: bool = False
    verify_labels: bool = True  # check the store against its digests when opening it
    train_images: int | None = None  # train on at most this many images, spread over the split (a smoke run)


@dataclass(frozen=True)
class Annotation:
    """What a run on an embedded set needs first for an annotator's maps: `model`, then its token labels."""

    model: str
    recipe: Recipe
    run_dir: Path
    labels_dir: Path
    model_kwargs: dict


class EmbeddedImageData(EmbeddedData, Protocol):
    """The data a run takes without --data-dir: options, recipe values, images, labels and their annotation."""

    recipe_values: ClassVar[dict]

    def image_data(self, recipe: Recipe, info: DistInfo) -> ImageData: ...

    def annotation(self, recipe: Recipe) -> Annotation | None: ...


AUGMENT_CHOICES = ('auto', 'pil', 'batched')
DECODE_CHOICES = ('cpu', 'gpu')


def pick_augment(augment: str, device: torch.device) -> str:
    """`--augment` resolved: auto is batched on GPUs, pil on CPUs (where Pillow beats `grid_sample`)."""
    if augment == 'auto':
        return 'batched' if device.type == 'cuda' else 'pil'
    return augment


def check_decode(decode: str, augment: str, device: torch.device) -> None:
    """`--decode gpu` decodes the batched path's JPEGs on the training GPU."""
    if decode == 'gpu' and device.type != 'cuda':  # first: on a CPU no --augment would make it work
        raise UsageError(f'--decode gpu needs a GPU; this run is on {device}')
    if decode == 'gpu' and augment != 'batched':
        raise UsageError('--decode gpu decodes for the batched augmentation: give --augment batched (auto on a GPU)')


def make_loaders(data: ImageData, store: TokenLabelStore | None, recipe: Recipe, data_cfg: dict, info: DistInfo,
                 options: RunOptions, augment: str = 'pil', decode: str = 'cpu', fast_decode: bool = False):
    """Training and validation batches, the class list, and the device half of the augmentation or None."""
    train_tf = TrainTransform(recipe.img_size, scale=(recipe.scale_min, 1.0), hflip=recipe.hflip,
                              auto_augment=recipe.auto_augment, reprob=recipe.reprob,
                              interpolation=recipe.interpolation, mean=data_cfg['mean'], std=data_cfg['std'],
                              fast_decode=fast_decode)
    device_tf = BatchAugment(recipe.img_size, data_cfg['mean'], data_cfg['std']) if augment == 'batched' else None
    worker_tf = RegionTransform(train_tf, 'device' if decode == 'gpu' else 'worker') if device_tf else train_tf
    train_set = ImageFolderDataset(data.root, 'train', worker_tf,
                                   label_store=store, skip_unreadable=data.skip_unreadable,
                                   max_images=data.train_images, info=info)
    val_tf = eval_transform(recipe.img_size, data_cfg['crop_pct'], data_cfg['interpolation'], data_cfg['mean'],
                            data_cfg['std'])
    val_set = ImageFolderDataset(data.root, 'val', val_tf, classes=train_set.classes,
                                 skip_unreadable=data.skip_unreadable, info=info)
    train_loader, val_loader = sharded_loaders(train_set, [val_set], Batching(
        recipe.batch_size, options.workers, options.seed, collate_skipping, recipe.aug_repeats, places=True), info)
    return train_loader, val_loader, train_set.classes, device_tf


def train_tf_reference(transform) -> TrainTransform:
    """The PIL transform behind the training set's transform (itself, or the batched path's worker half)."""
    return transform.reference if isinstance(transform, RegionTransform) else transform


def token_label_pictures(train_set: ImageFolderDataset, transform: TrainTransform, count: int) -> Pictures:
    """`count` training images with their maps and one augmentation's token targets, for TensorBoard."""
    picks = range(0, len(train_set), max(1, len(train_set) // count))[:count]
    store = train_set.label_store

    def draw() -> dict:
        pictures = {}
        for i, index in enumerate(picks):
            path, row = train_set.paths[index], int(train_set.rows[index])
            try:
                image = read_image(train_set.file(index))
            except ImageReadError:
                if train_set.skip_unreadable:
                    continue
                raise
            scores, classes = store.read(row)
            labels = token_labels(image, scores, classes, transform, store.num_classes, extent=store.extent(row))
            pictures[f'token_labels/{i}'] = token_label_figure(labels, train_set.classes, path)
        return pictures

    return draw
