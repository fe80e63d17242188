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
import torch
import torch.nn as nn
from timm.data import create_transform, resolve_data_config
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from backbones.errors import DataError, UsageError
from backbones.token_head import feature_grid, has_token_head, patch_tokens
from backbones.weights import pretrained_model
from engine.distributed import DistInfo, barrier
from engine.files import write_json_atomic
from engine.images import ImageReadError, read_image, scan_split

from .label_store import (CLASSES, DONE, META, PATHS, SCORES, TokenLabelError, check_array, class_index_dtype,
                          shard_ranges)


@torch.no_grad()
def dense_scores(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(B, h, w, C) class logits at every feature position, global pooling removed.

    CNNs: the model's own head applied to each position as a 1x1 map (pooling a 1x1 map is the identity, so
    any norm or pre-logits layer of the head is kept). Token models: the token head if the model has one (it
    was trained on patch tokens), else the class head (both heads averaged for a distilled model), on every patch
    token.
    """
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

    def __init__(self, data_dir: Path, paths: Sequence[str], rows: Sequence[int], transform,
                 skip_unreadable: bool) -> None:
        self.data_dir, self.paths, self.rows, self.transform = data_dir, paths, rows, transform
        self.skip_unreadable = skip_unreadable

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        row = self.rows[i]
        try:
            return self.transform(read_image(self.data_dir / self.paths[row])), row
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


def annotator_transform(img_size: int, data_cfg: dict):
    """The whole image, squashed to img_size x img_size, normalised as the annotator expects (timm's eval transform
    in its 'squash' mode: no crop)."""
    return create_transform(img_size, is_training=False, crop_mode='squash', crop_pct=1.0,
                            interpolation=data_cfg['interpolation'], mean=data_cfg['mean'], std=data_cfg['std'])


def _list_hash(paths: Sequence[str]) -> str:
    return hashlib.sha256('\n'.join(paths).encode()).hexdigest()


DEFAULT_SHARD_SIZE = 4096
# The meta data values that shape the store: a rerun must give the same ones (or leave them out).
SHAPING = ('annotator', 'model_kwargs', 'checkpoint', 'img_size', 'topk', 'shard_size', 'split', 'classes',
           'paths_sha256')


def _describe(key: str, value) -> str:
    if key == 'classes':
        return f'{len(value)} classes'
    return 'another image list' if key == 'paths_sha256' else f'{key}={value!r}'


def _check_same_store(output: Path, old: dict, meta: dict) -> None:
    changed = [k for k in SHAPING if old.get(k) != meta[k]]
    if changed:
        was = ', '.join(_describe(k, old.get(k)) for k in changed)
        now = ', '.join(_describe(k, meta[k]) for k in changed)
        raise TokenLabelError(f'{output} holds labels made with {was}; this run gives {now}: rerun with the '
                              f'store\'s values to finish it, or use another --output')


def _read_meta(output: Path) -> dict | None:
    if not (output / META).exists():
        return None
    try:
        return json.loads((output / META).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TokenLabelError(f'{output / META}: not readable JSON ({e}); delete {output} and generate again') from e


def _open_or_create(output: Path, meta: dict, old: Optional[dict], paths: List[str], grid, topk: int,
                    info: DistInfo):
    """Create the store files (main process), or check that the existing one (meta data `old`) was made with the
    same values."""
    if info.is_main:
        output.mkdir(parents=True, exist_ok=True)
        (output / DONE).mkdir(exist_ok=True)
        shape = (len(paths), *grid, topk)
        if old is not None:
            _check_same_store(output, old, meta)
            for name in (SCORES, CLASSES):
                check_array(output / name, shape)
        else:
            np.lib.format.open_memmap(output / SCORES, 'w+', np.float16, shape).flush()
            np.lib.format.open_memmap(output / CLASSES, 'w+', class_index_dtype(meta['num_classes']), shape).flush()
            (output / PATHS).write_text('\n'.join(paths) + '\n')
            write_json_atomic(output / META, {**meta, 'complete': False})
    barrier(info)
    return np.load(output / SCORES, mmap_mode='r+'), np.load(output / CLASSES, mmap_mode='r+')


def _shard_marker(output: Path, index: int) -> Path:
    return output / DONE / f'{index:06d}'


def _rows_digest(scores: np.ndarray, class_ids: np.ndarray, start: int, stop: int) -> str:
    digest = hashlib.sha256(np.ascontiguousarray(scores[start:stop]).tobytes())
    digest.update(np.ascontiguousarray(class_ids[start:stop]).tobytes())
    return digest.hexdigest()


def _read_marker(path: Path) -> dict | None:
    """A shard's marker, or None when it is absent or unreadable (a shard killed while marking is redone)."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def _verify(output: Path, shards, scores: np.ndarray, class_ids: np.ndarray) -> List[str]:
    """Every shard marked, for its own rows, with the digest its rows have now; the unreadable images' paths."""
    unreadable: List[str] = []
    for i, (start, stop) in enumerate(shards):
        marker = _read_marker(_shard_marker(output, i))
        if marker is None:
            raise TokenLabelError(f'{output}: rows {start}-{stop - 1} were not written (shard {i}); run again to '
                                  f'finish')
        if marker['rows'] != [start, stop] or marker['sha256'] != _rows_digest(scores, class_ids, start, stop):
            raise TokenLabelError(f'{output}: rows {start}-{stop - 1} do not match what was written (shard {i}); '
                                  f'the store is damaged, delete it and generate again')
        unreadable += marker['unreadable']
    return unreadable


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
        shard_size: Optional[int] = None,
        model_kwargs: Optional[dict] = None,
        skip_unreadable: bool = False,
) -> dict:
    """Write (or finish) the token-label store of `data_dir/split`; returns its meta data (`meta.json`).

    `shard_size` defaults to the existing store's (resuming), else DEFAULT_SHARD_SIZE images. With
    `skip_unreadable`, images that cannot be decoded keep an empty row and are listed in the meta data."""
    data_dir, output = Path(data_dir), Path(output)
    if topk < 1:
        raise UsageError(f'--topk must be at least 1, got {topk}')
    old = _read_meta(output)
    shard_size = shard_size or (old or {}).get('shard_size') or DEFAULT_SHARD_SIZE
    if shard_size < 1:
        raise UsageError(f'--shard-size must be at least 1, got {shard_size}')
    classes, samples = scan_split(data_dir, split)
    paths = [path for path, _ in samples]
    odd = next((path for path in paths if '\n' in path or '\r' in path), None)
    if odd is not None:
        raise DataError(f'{data_dir / odd!r}: a file name with a line break cannot be listed in {PATHS}; rename it')
    model = pretrained_model(annotator, checkpoint, len(classes), **(model_kwargs or {})).to(info.device)
    data_cfg = resolve_data_config({}, model=model)
    img_size = img_size or data_cfg['input_size'][-1]
    transform = annotator_transform(img_size, data_cfg)
    with torch.no_grad():
        probe = dense_scores(model, torch.zeros(1, 3, img_size, img_size, device=info.device))
    grid, topk = tuple(probe.shape[1:3]), min(topk, len(classes))
    meta = {'annotator': annotator, 'model_kwargs': model_kwargs or {},
            'checkpoint': str(checkpoint) if checkpoint else None, 'img_size': img_size, 'grid': list(grid),
            'topk': topk, 'shard_size': shard_size, 'num_classes': len(classes), 'classes': classes,
            'paths_sha256': _list_hash(paths), 'split': split, 'scores': 'top-k logits, best first',
            'preprocessing': f'whole image resized to {img_size}x{img_size} ({data_cfg["interpolation"]}), '
                             f'normalised with mean {list(data_cfg["mean"])} std {list(data_cfg["std"])}; '
                             f'map position (i, j) covers the same fraction of the whole image'}
    scores, class_ids = _open_or_create(output, meta, old, paths, grid, topk, info)

    shards = shard_ranges(len(paths), shard_size)
    todo = [i for i in range(info.rank, len(shards), info.world_size)
            if _read_marker(_shard_marker(output, i)) is None]
    bar = tqdm(total=sum(shards[i][1] - shards[i][0] for i in todo), desc=f'labels (rank {info.rank})',
               unit='img', disable=not info.is_main, dynamic_ncols=True)
    for i in todo:
        start, stop = shards[i]
        rows_of = _WholeImages(data_dir, paths, range(start, stop), transform, skip_unreadable)
        loader = DataLoader(rows_of, batch_size, num_workers=workers, collate_fn=_collate_rows,
                            pin_memory=info.device.type == 'cuda')
        unreadable = []
        for images, rows, skipped in loader:
            unreadable += [paths[row] for row in skipped]
            scores[skipped], class_ids[skipped] = 0, 0
            if images is None:
                continue
            logits = dense_scores(model, images.to(info.device, non_blocking=True)).float()
            top = logits.topk(topk, dim=-1)
            scores[rows.numpy()] = top.values.cpu().numpy().astype(np.float16)
            class_ids[rows.numpy()] = top.indices.cpu().numpy().astype(class_ids.dtype)
            bar.update(len(rows) + len(skipped))
        scores.flush()
        class_ids.flush()
        marker = {'rows': [start, stop], 'sha256': _rows_digest(scores, class_ids, start, stop),
                  'unreadable': unreadable}
        write_json_atomic(_shard_marker(output, i), marker)
    bar.close()
    barrier(info)

    if info.is_main:
        listed = (output / PATHS).read_text().splitlines()
        if listed != paths:
            raise TokenLabelError(f'{output}: the stored image list does not match {data_dir / split}')
        meta['unreadable'] = _verify(output, shards, scores, class_ids)
        write_json_atomic(output / META, {**meta, 'complete': True})
    barrier(info)
    return _read_meta(output)  # the verified store's, the same on every process
