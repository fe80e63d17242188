"""A frozen model's features of one split kept on disk (`--feature-cache DIR`: DIR/SPLIT.pt), so that probes train
at the cost of their heads. The file records what made it: the weights' digest, the eval pipeline and the images (each
path, label, size and modification time); a file made by other weights, another pipeline or other images is refused
in one line naming what differs, never read. Features are the same only on the same kind of device: it is recorded.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn as nn

from backbones.common.errors import UsageError
from backbones.common.files import load_weights_only, save_atomic
from backbones.common.log import logger

VERSION = 1  # of the features' definitions; a change here makes every cache stale
PIPELINE_KEYS = ('input_size', 'crop_pct', 'interpolation', 'mean', 'std')  # what config_eval_transform reads


def weights_digest(model: nn.Module) -> str:
    """SHA-256 of every parameter and buffer: name, dtype, shape and bytes, in the state dict's order."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(f'{name} {tensor.dtype} {tuple(tensor.shape)}\n'.encode())
        digest.update(tensor.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())  # 0-d too (BN's count)
    return digest.hexdigest()


def file_stat(path: str | Path) -> str:
    stat = os.stat(path)
    return f'{stat.st_size} {stat.st_mtime_ns}'


def images_digest(root: Path, paths: Sequence[str], labels: Sequence[int]) -> str:
    """SHA-256 of each image's path (under `root`) and label, with the size and modification time of the file
    holding it (the image file, or the archive a `ARCHIVE.tar/MEMBER` name is in); where an image is no file (a
    saved Hugging Face data set's rows), of every Arrow and Parquet file under `root`."""
    digest = hashlib.sha256()
    stats: dict[str, str] = {}
    for path, label in zip(paths, labels):
        holder = os.path.join(root, path.split('.tar/')[0] + '.tar' if '.tar/' in path else path)
        if holder not in stats:
            stats[holder] = file_stat(holder) if os.path.isfile(holder) else '-'
        digest.update(f'{path}\t{label}\t{stats[holder]}\n'.encode())
    if '-' in stats.values():
        for table in sorted(p for p in Path(root).rglob('*') if p.suffix in ('.arrow', '.parquet')):
            digest.update(f'{table.relative_to(root)}\t{file_stat(table)}\n'.encode())
    return digest.hexdigest()


def feature_identity(model: dict, weights: str, data_cfg: dict, root: Path, paths: Sequence[str],
                     labels: Sequence[int]) -> dict[str, str]:
    """What a split's features depend on, as the cache records it: `model`, the model's name, arguments and
    device; `weights`, `weights_digest` of it."""
    return {'version': str(VERSION), 'model': repr(model), 'weights': weights,
            'pipeline': repr({key: data_cfg.get(key) for key in PIPELINE_KEYS}),
            'images': images_digest(root, paths, labels)}


def cached_features(path: Path, identity: dict[str, str],
                    compute: Callable[[], dict[str, torch.Tensor | None]]) -> dict[str, torch.Tensor | None]:
    """The features `path` holds where it was made with `identity`, else computed and written there (atomically);
    a file made otherwise is a UsageError naming what differs."""
    if path.is_file():
        saved = load_weights_only(path, 'feature cache')
        if not (isinstance(saved, dict) and isinstance(saved.get('identity'), dict) and 'features' in saved):
            raise UsageError(f'{path}: not a feature cache (no record of what made it); remove it, or give '
                             f'--feature-cache another folder')
        differ = [key for key in identity if saved['identity'].get(key) != identity[key]]
        if differ:
            raise UsageError(f'{path}: a feature cache whose {", ".join(differ)} differ from this run\'s; remove it, '
                             f'or give --feature-cache another folder')
        logger.info(f'features read from {path}')
        return saved['features']
    features = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_atomic({'identity': identity, 'features': features}, path)
    logger.info(f'features written to {path}')
    return features
