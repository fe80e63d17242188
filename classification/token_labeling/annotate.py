"""Dense label generation: a machine annotator's top-k class scores at every position of every training image.

The map describes the WHOLE image, resized (not cropped) to the annotator's square input, so that training crops
anywhere in it find their labels (docs/imagenet.md tells why). The store is written in shards of rows; each process
of a torchrun job takes every world_size-th shard and marks it done after flushing, so a second run with the same
arguments only does the shards not yet marked."""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from timm.data import create_transform, resolve_data_config
from torch.utils.data import DataLoader, Dataset

from backbones.common.distributed import DistInfo
from backbones.common.errors import DataError, UsageError
from backbones.common.images import ImageReadError, read_image
from backbones.token_head import feature_grid, has_token_head, patch_tokens
from backbones.weights import pretrained_model
from classification.engine.checkpoints import check_checkpoint_classes, checkpoint_data_config
from classification.engine.steps import autocast
from classification.sources.source import Listing, open_split
from classification.token_labeling.label_store import (
    DEFAULT_SHARD_SIZE,
    StoreRows,
    list_digest,
    read_meta,
    write_label_store,
)


@torch.no_grad()
def dense_scores(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(B, h, w, C) class logits at every feature position: a CNN's own head on each position as a 1x1 map; a token
    model's token head if it has one, else its class head, on every patch token."""
    features = model.forward_features(x)
    if features.ndim == 4:
        grid = feature_grid(model, features)
        B, h, w, D = grid.shape
        pixels = grid.reshape(B * h * w, 1, 1, D)  # each position a 1x1 map, in the model's own layout
        if getattr(model, 'output_fmt', 'NCHW') != 'NHWC':
            pixels = pixels.permute(0, 3, 1, 2)
        return model.forward_head(pixels).view(B, h, w, -1)
    tokens = patch_tokens(model, features)
    B, N, D = tokens.shape
    h = w = math.isqrt(N)
    if h * w != N:
        raise DataError(f'{type(model).__name__} gives {N} patch tokens for a square input: not a square grid')
    if has_token_head(model):
        return model.aux_head(tokens).view(B, h, w, -1)
    tokens = (getattr(model, 'fc_norm', None) or nn.Identity())(tokens)
    heads = model.get_classifier()
    heads = heads if isinstance(heads, tuple) else (heads,)
    return (sum(head(tokens) for head in heads) / len(heads)).view(B, h, w, -1)


class _WholeImages(Dataset):
    """Rows of the store as (image, row); an unreadable image gives None with `skip_unreadable`."""

    def __init__(self, listing: Listing, rows: Sequence[int], transform, skip_unreadable: bool) -> None:
        self.listing, self.rows, self.transform, self.skip_unreadable = listing, rows, transform, skip_unreadable

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        row = self.rows[i]
        try:
            name = self.listing.samples[row][0]
            return self.transform(read_image(self.listing.reader.open(row, name))), row
        except ImageReadError:
            if self.skip_unreadable:
                return None, row
            raise


def _collate_rows(items):
    """Readable images stacked with their rows, and the rows of the unreadable ones."""
    kept = [(image, row) for image, row in items if image is not None]
    images = torch.stack([image for image, _ in kept]) if kept else None
    return images, torch.tensor([row for _, row in kept], dtype=torch.long), [row for image, row in items
                                                                               if image is None]


# The meta data values that shape a generated store: a rerun must give the same ones (or leave them out).
GENERATION_SHAPING = ('annotator', 'model_kwargs', 'checkpoint', 'img_size', 'amp', 'topk', 'shard_size', 'split',
                      'classes', 'paths_sha256')
ANNOTATOR_AMP = ('none', 'bf16')  # the annotator's --amp choices


def generate_token_labels(
        data_dir: str | Path,
        annotator: str,
        output: str | Path,
        info: DistInfo,
        checkpoint: str | None = None,
        img_size: int | None = None,
        topk: int = 5,
        split: str = 'train',
        batch_size: int = 64,
        workers: int = 4,
        shard_size: int | None = None,
        model_kwargs: dict | None = None,
        skip_unreadable: bool = False,
        amp: str = 'none',
) -> dict:
    """Write (or finish) the token-label store of `data_dir/split`; its meta data. `amp`: the annotator's autocast."""
    data_dir, output = Path(data_dir), Path(output)
    if topk < 1:
        raise UsageError(f'--topk must be at least 1, got {topk}')
    if amp not in ANNOTATOR_AMP:
        raise UsageError(f'--amp must be one of {", ".join(ANNOTATOR_AMP)}, got {amp!r}')
    old = read_meta(output)
    shard_size = shard_size or (old or {}).get('shard_size') or DEFAULT_SHARD_SIZE
    if shard_size < 1:
        raise UsageError(f'--shard-size must be at least 1, got {shard_size}')
    listing = open_split(data_dir, split)
    classes, paths = listing.classes, [path for path, _ in listing.samples]
    if checkpoint:
        check_checkpoint_classes(checkpoint, classes, str(Path(data_dir) / split))  # its scores by class name
    model = pretrained_model(annotator, checkpoint, len(classes), **(model_kwargs or {})).to(info.device)
    data_cfg = checkpoint_data_config(checkpoint, resolve_data_config({}, model=model), img_size)
    img_size = data_cfg['input_size'][-1]
    # the whole image squashed to img_size, normalised as the annotator expects
    transform = create_transform(img_size, is_training=False, crop_mode='squash', crop_pct=1.0,
                                 interpolation=data_cfg['interpolation'], mean=data_cfg['mean'], std=data_cfg['std'])
    with torch.no_grad():
        probe = dense_scores(model, torch.zeros(1, 3, img_size, img_size, device=info.device))
    grid, topk = tuple(probe.shape[1:3]), min(topk, len(classes))
    meta = {'annotator': annotator, 'model_kwargs': model_kwargs or {},
            'checkpoint': str(checkpoint) if checkpoint else None, 'img_size': img_size, 'amp': amp, 'grid': list(grid),
            'topk': topk, 'shard_size': shard_size, 'num_classes': len(classes), 'classes': classes,
            'paths_sha256': list_digest(paths), 'split': split, 'scores': 'top-k logits, best first',
            'preprocessing': f'whole image resized to {img_size}x{img_size} ({data_cfg["interpolation"]}), '
                             f'normalised with mean {list(data_cfg["mean"])} std {list(data_cfg["std"])}; '
                             f'map position (i, j) covers the same fraction of the whole image'}

    def shard_rows(start: int, stop: int) -> Iterator[StoreRows]:
        images_of = _WholeImages(listing, range(start, stop), transform, skip_unreadable)
        loader = DataLoader(images_of, batch_size, num_workers=workers, collate_fn=_collate_rows,
                            pin_memory=info.device.type == 'cuda')
        for images, rows, skipped in loader:
            values = ()
            if images is not None:  # else a batch of unreadable images only
                with autocast(info.device, amp):
                    scores = dense_scores(model, images.to(info.device, non_blocking=True))
                top = scores.float().topk(topk, dim=-1)
                values = (top.values.cpu().numpy().astype(np.float16), top.indices.cpu().numpy())
            yield StoreRows(rows.numpy(), values, skipped)

    return write_label_store(output, meta, paths, GENERATION_SHAPING, info, shard_rows, progress='labels')
