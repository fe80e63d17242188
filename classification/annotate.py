"""Dense label generation: a machine annotator's top-k class scores at every position of every training image.

Which image the map describes: the WHOLE image, resized (not cropped) to the annotator's square input. Training
crops are RandomResizedCrop boxes anywhere in the whole image, so the map must cover all of it, and its [0, 1]
coordinates must be the image's: a centre-cropped map (the reference code's) has no labels for the borders the
crops do see, and puts every label at the wrong place. Squashing the aspect ratio costs the annotator a little
accuracy; it keeps every map the same shape, which the packed store needs.

The store is written in shards of rows; each process of a torchrun job takes every world_size-th shard and
marks it done after flushing, so a second run with the same arguments only does the shards not yet marked.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
import timm
import torch
import torch.nn as nn
import torchvision.transforms as T
from timm.data import resolve_data_config
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from backbones import load_checkpoint
from backbones.token_labeling import has_token_head, patch_tokens

from .checkpointing import write_json_atomic
from .data import read_image, scan_split
from .distributed import DistInfo, barrier
from .label_store import CLASSES, DONE, META, PATHS, SCORES, TokenLabelError, class_index_dtype, shard_ranges


@torch.no_grad()
def dense_scores(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(B, h, w, C) class logits at every feature position, global pooling removed.

    CNNs: the model's own head applied to each position as a 1x1 map (pooling a 1x1 map is the identity, so
    any norm or pre-logits layer of the head is kept). Token models: the token head if the model has one (it
    was trained on patch tokens), else the class head, on every patch token.
    """
    features = model.forward_features(x)
    if features.ndim == 4:
        if getattr(model, 'output_fmt', 'NCHW') == 'NHWC':
            features = features.permute(0, 3, 1, 2)
        B, D, h, w = features.shape
        pixels = features.permute(0, 2, 3, 1).reshape(B * h * w, D, 1, 1)
        return model.forward_head(pixels).view(B, h, w, -1)
    tokens = patch_tokens(model, features)
    B, N, D = tokens.shape
    h = w = math.isqrt(N)
    if h * w != N:
        raise ValueError(f'{type(model).__name__} gives {N} patch tokens for a square input: not a square grid')
    if has_token_head(model):
        return model.aux_head(tokens).view(B, h, w, -1)
    norm = getattr(model, 'fc_norm', None) or nn.Identity()
    return model.get_classifier()(norm(tokens)).view(B, h, w, -1)


class _WholeImages(Dataset):
    def __init__(self, data_dir: Path, paths: Sequence[str], rows: Sequence[int], transform) -> None:
        self.data_dir, self.paths, self.rows, self.transform = data_dir, paths, rows, transform

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        row = self.rows[i]
        return self.transform(read_image(self.data_dir / self.paths[row])), row


def annotator_transform(img_size: int, data_cfg: dict):
    """The whole image, squashed to img_size x img_size, normalised as the annotator expects."""
    return T.Compose([
        T.Resize((img_size, img_size), interpolation=T.InterpolationMode(data_cfg['interpolation']), antialias=True),
        T.ToTensor(),
        T.Normalize(data_cfg['mean'], data_cfg['std']),
    ])


def build_annotator(name: str, checkpoint: Optional[str], num_classes: int, **kwargs) -> nn.Module:
    """A registry model (suite or timm) with the given weights, or timm's pretrained weights without a file."""
    if checkpoint is None:
        model = timm.create_model(name, pretrained=True, **kwargs)
    else:
        model = timm.create_model(name, num_classes=num_classes, **kwargs)
        load_checkpoint(model, checkpoint)
    if model.num_classes != num_classes:
        raise ValueError(f'the annotator {name} predicts {model.num_classes} classes, the data set has {num_classes}')
    return model.eval()


def _list_hash(paths: Sequence[str]) -> str:
    return hashlib.sha256('\n'.join(paths).encode()).hexdigest()


def _open_or_create(output: Path, meta: dict, paths: List[str], grid, topk: int, info: DistInfo):
    """Create the store files (main process) or check that an existing one was made with the same arguments."""
    if info.is_main:
        output.mkdir(parents=True, exist_ok=True)
        (output / DONE).mkdir(exist_ok=True)
        if (output / META).exists():
            old = json.loads((output / META).read_text())
            changed = [k for k in ('annotator', 'checkpoint', 'img_size', 'topk', 'num_classes', 'paths_sha256')
                       if old.get(k) != meta[k]]
            if changed:
                raise TokenLabelError(f'{output} holds labels made with other {", ".join(changed)}; '
                                      f'use another --output or delete it')
        else:
            shape = (len(paths), *grid, topk)
            np.lib.format.open_memmap(output / SCORES, 'w+', np.float16, shape).flush()
            np.lib.format.open_memmap(output / CLASSES, 'w+', class_index_dtype(meta['num_classes']), shape).flush()
            (output / PATHS).write_text('\n'.join(paths) + '\n')
            write_json_atomic(output / META, {**meta, 'complete': False})
    barrier(info)
    return np.load(output / SCORES, mmap_mode='r+'), np.load(output / CLASSES, mmap_mode='r+')


def _shard_marker(output: Path, index: int) -> Path:
    return output / DONE / f'{index:06d}'


def generate_token_labels(
        data_dir: str | Path,
        annotator: str,
        output: str | Path,
        info: DistInfo,
        checkpoint: Optional[str] = None,
        img_size: Optional[int] = None,
        topk: int = 5,
        split: str = 'train',
        batch_size: int = 64,
        workers: int = 4,
        shard_size: int = 4096,
        model_kwargs: Optional[dict] = None,
) -> dict:
    """Write (or finish) the token-label store of `data_dir/split`; returns its meta data."""
    data_dir, output = Path(data_dir), Path(output)
    classes, samples = scan_split(data_dir, split)
    paths = [path for path, _ in samples]
    model = build_annotator(annotator, checkpoint, len(classes), **(model_kwargs or {})).to(info.device)
    data_cfg = resolve_data_config({}, model=model)
    img_size = img_size or data_cfg['input_size'][-1]
    transform = annotator_transform(img_size, data_cfg)
    with torch.no_grad():
        probe = dense_scores(model, torch.zeros(1, 3, img_size, img_size, device=info.device))
    grid, topk = tuple(probe.shape[1:3]), min(topk, len(classes))
    meta = {'annotator': annotator, 'model_kwargs': model_kwargs or {}, 'checkpoint': str(checkpoint) if checkpoint else None, 'img_size': img_size,
            'grid': list(grid), 'topk': topk, 'num_classes': len(classes), 'classes': classes,
            'paths_sha256': _list_hash(paths), 'split': split, 'scores': 'top-k logits, best first',
            'preprocessing': f'whole image resized to {img_size}x{img_size} ({data_cfg["interpolation"]}), '
                             f'normalised with mean {list(data_cfg["mean"])} std {list(data_cfg["std"])}; '
                             f'map position (i, j) covers the same fraction of the whole image'}
    scores, class_ids = _open_or_create(output, meta, paths, grid, topk, info)

    shards = shard_ranges(len(paths), shard_size)
    todo = [i for i in range(info.rank, len(shards), info.world_size) if not _shard_marker(output, i).exists()]
    bar = tqdm(total=sum(shards[i][1] - shards[i][0] for i in todo), desc=f'labels (rank {info.rank})',
               unit='img', disable=not info.is_main, dynamic_ncols=True)
    for i in todo:
        start, stop = shards[i]
        loader = DataLoader(_WholeImages(data_dir, paths, range(start, stop), transform), batch_size,
                            num_workers=workers, pin_memory=info.device.type == 'cuda')
        for images, rows in loader:
            logits = dense_scores(model, images.to(info.device, non_blocking=True)).float()
            top = logits.topk(topk, dim=-1)
            scores[rows.numpy()] = top.values.cpu().numpy().astype(np.float16)
            class_ids[rows.numpy()] = top.indices.cpu().numpy().astype(class_ids.dtype)
            bar.update(len(rows))
        scores.flush()
        class_ids.flush()
        _shard_marker(output, i).touch()
    bar.close()
    barrier(info)

    if info.is_main:
        missing = [i for i in range(len(shards)) if not _shard_marker(output, i).exists()]
        if missing:
            raise TokenLabelError(f'{output}: {len(missing)} shard(s) were not written (first: rows '
                                  f'{shards[missing[0]][0]}-{shards[missing[0]][1] - 1}); run again to finish')
        listed = (output / PATHS).read_text().splitlines()
        if listed != paths:
            raise TokenLabelError(f'{output}: the stored image list does not match {data_dir / split}')
        write_json_atomic(output / META, {**meta, 'complete': True})
    barrier(info)
    return meta
