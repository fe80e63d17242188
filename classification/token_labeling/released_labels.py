"""The released dense-label sets, imported into the suite's packed store (`import_released_labels`).

Two releases, one `<wnid>/<image stem>.pt` file per ImageNet training image, each a tensor [2, k, h, w] of top-k
scores and class indices: `tokenlabeling` (the LV-ViT authors' NFNet-F6 maps, covering each image's centre square,
recorded per image in `extent.npy`) and `relabel` (ReLabel's EfficientNet-L2 maps of the whole image). Every file
is checked; the import is written shard by shard and resumes like generation (`write_label_store`).
docs/imagenet.md ("The released label sets") gives where to get them and every check."""
from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from backbones.common.distributed import DistInfo
from backbones.common.errors import CheckpointError, DataError, UsageError
from backbones.common.files import load_weights_only
from backbones.common.images import check_same_classes
from backbones.common.log import logger
from classification.sources.source import ItemReader, open_split
from classification.token_labeling.label_store import WHOLE_IMAGE, StoreRows, list_digest, read_meta, write_label_store


@dataclass(frozen=True)
class Release:
    """What a released label set is: its annotator, the input it saw, and the part of each image its maps cover."""

    name: str
    annotator: str
    img_size: int
    grid: int  # the map side the release has (auto-detection)
    centre_square: bool


RELEASES = {
    'tokenlabeling': Release('tokenlabeling', 'dm_nfnet_f6 (TokenLabeling release, label_top5_train_nfnet)', 576, 18,
                             True),
    'relabel': Release('relabel', 'EfficientNet-L2 (ReLabel release, imagenet_efficientnet_l2_sz475_top5)', 475, 15,
                       False),
}
FORMATS = ('auto', *RELEASES)
# The meta data values that shape an imported store: a rerun must give the same ones.
IMPORT_SHAPING = ('annotator', 'format', 'img_size', 'grid', 'topk', 'shard_size', 'split', 'classes', 'paths_sha256')
SHOWN = 5  # names shown of a list of files
SAMPLED = 8  # files spread over a release tree whose shapes decide its format


def shown(items: Sequence[str]) -> str:
    return ', '.join(items[:SHOWN]) + (f', ... ({len(items)} in all)' if len(items) > SHOWN else '')


def release_files(release_dir: Path) -> tuple[list[str], dict[str, str], list[str]]:
    """The release tree's class folders, `class/stem -> file` of its .pt files, and its other files."""
    if not release_dir.is_dir():
        raise DataError(f'no released label tree at {release_dir} (expected {release_dir}/<wnid>/<image stem>.pt)')
    classes, files, other = [], {}, []
    for folder in sorted(os.scandir(release_dir), key=lambda e: e.name):
        if not folder.is_dir():
            other.append(folder.name)
            continue
        found = False
        for entry in os.scandir(folder.path):
            if entry.name.endswith('.pt') and entry.is_file():
                files[f'{folder.name}/{entry.name[:-3]}'] = f'{folder.name}/{entry.name}'
                found = True
            else:
                other.append(f'{folder.name}/{entry.name}')
        if found:
            classes.append(folder.name)
    if not files:
        raise DataError(f'{release_dir} holds no <wnid>/<image stem>.pt files: not a released label tree')
    return classes, files, other


def check_one_image_per_file(keys: Sequence[str], paths: Sequence[str], files: dict[str, str],
                             release_dir: Path) -> None:
    """Two images of one class with the same stem (x.JPEG, x.png) would both take x.pt: an error."""
    first: dict[str, str] = {}
    for key, path in zip(keys, paths):
        if key not in files:
            continue
        other = first.setdefault(key, path)
        if other != path:
            raise DataError(f'{other} and {path} would both take {release_dir / key}.pt (a release file is matched '
                            f'by class folder and image stem): rename or remove one of them')


def load_map(path: Path) -> torch.Tensor:
    """One release file's tensor (weights-only load: a file that holds anything else is refused, never run)."""
    try:
        value = load_weights_only(path, what='tensor file')
    except CheckpointError as e:  # a damaged release is a data problem here
        raise DataError(str(e)) from None
    if not isinstance(value, torch.Tensor):
        raise DataError(f'{path}: holds a {type(value).__name__}, not the [2, k, h, w] tensor of a released label set')
    return value


def detect_release(release_dir: Path, files: Sequence[str], fmt: str) -> tuple[Release, tuple[int, ...]]:
    """The release a tree is (from the maps of files spread over it, or `fmt`) and the shape all its files must have.
    Files spread over the tree must agree: one damaged file does not decide the shape of the others."""
    picks = sorted({files[i * (len(files) - 1) // max(SAMPLED - 1, 1)] for i in range(SAMPLED)})
    shapes: dict[tuple[int, ...], str] = {}
    for file in picks:
        value = load_map(release_dir / file)
        if value.dim() != 4 or value.shape[0] != 2 or not value.is_floating_point():
            raise DataError(f'{release_dir / file}: a {value.dtype} tensor of shape {list(value.shape)}; a released '
                            f'label file is a float tensor [2, k, h, w] (scores, class indices)')
        shapes.setdefault(tuple(value.shape), file)
    if len(shapes) > 1:
        raise DataError(f'{release_dir}: its files differ in shape ('
                        + '; '.join(f'{file}: {list(shape)}' for shape, file in shapes.items())
                        + '); all files of a release have one shape: replace the damaged one')
    ((shape, file),) = shapes.items()
    h, w = shape[-2:]
    known = next((release for release in RELEASES.values() if (h, w) == (release.grid, release.grid)), None)
    if fmt == 'auto':
        if known is None:
            raise UsageError(f'{release_dir / file}: maps of {h}x{w} are neither release\'s (tokenlabeling 18x18, '
                             f'relabel 15x15); name the release with --format')
        return known, shape
    if known is not None and known.name != fmt:
        raise UsageError(f'--format {fmt}: {release_dir / file} holds {h}x{w} maps, the {known.name} release\'s '
                         f'(the {fmt} release\'s are {RELEASES[fmt].grid}x{RELEASES[fmt].grid}); leave --format out')
    return RELEASES[fmt], shape


def started_release(output: Path, fmt: str) -> tuple[Release, tuple[int, ...]] | None:
    """The release and file shape of an import started in `output` (resuming), or None."""
    old = read_meta(output)
    if old is None or old.get('format') not in RELEASES or fmt not in ('auto', old['format']):
        return None  # a new store, or another one: the store's writer names the difference
    return RELEASES[old['format']], (2, old['topk'], *old['grid'])


def check_map(value: torch.Tensor, path: Path, shape: tuple[int, ...], num_classes: int) -> None:
    """A release file's tensor: the release's shape, finite scores, whole class indices in [0, num_classes)."""
    if tuple(value.shape) != shape or not value.is_floating_point():
        raise DataError(f'{path}: a {value.dtype} tensor of shape {list(value.shape)}; this release\'s files are '
                        f'float tensors {list(shape)}')
    scores, indices = value[0].float(), value[1].float()
    if not scores.isfinite().all():
        raise DataError(f'{path}: scores that are not finite numbers')
    if not (indices == indices.round()).all() or indices.min() < 0 or indices.max() >= num_classes:
        raise DataError(f'{path}: class indices outside 0..{num_classes - 1} or not whole numbers (from '
                        f'{indices.min().item():g} to {indices.max().item():g}); the release and the data folder '
                        f'({num_classes} classes) do not belong together')


def centre_square(size: tuple[int, int]) -> tuple[float, float, float, float]:
    """The centre square of a (width, height) image in whole-image [-1, 1] coordinates."""
    width, height = size
    side = min(width, height)
    return (-side / width, -side / height, side / width, side / height)


class ReleaseRows(Dataset):
    """Rows of the store from release files: (row, scores, classes, extent), Nones without a file, or an error."""

    def __init__(self, data_dir: Path, release_dir: Path, paths: Sequence[str], reader: ItemReader,
                 files: Sequence[str | None], rows: Sequence[int], shape: tuple[int, ...], num_classes: int,
                 release: Release) -> None:
        self.data_dir, self.release_dir, self.paths, self.files, self.rows = data_dir, release_dir, paths, files, rows
        self.reader = reader
        self.shape, self.num_classes, self.release = shape, num_classes, release

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        row = self.rows[i]
        if self.files[row] is None:
            return row, None, None, None
        path = self.release_dir / self.files[row]
        try:
            value = load_map(path)
            check_map(value, path, self.shape, self.num_classes)
            extent = WHOLE_IMAGE
            if self.release.centre_square:
                image_path = self.reader.open(row, self.paths[row])
                with Image.open(image_path) as image:  # the header only
                    extent = centre_square(image.size)
        except (DataError, OSError) as e:
            return row, str(e) if isinstance(e, DataError) else f'{self.data_dir / self.paths[row]}: {e}'
        return row, *store_row(value), np.asarray(extent, np.float32)


def store_row(value: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """A checked release tensor [2, k, h, w] as the store's row: scores and class indices, each (h, w, k)."""
    return (value[0].permute(1, 2, 0).numpy().astype(np.float16),
            value[1].permute(1, 2, 0).round().numpy().astype(np.int64))


def release_meta(release: Release, shape: tuple[int, ...], release_dir: Path, classes: list[str], paths: list[str],
                 split: str, shard_size: int, extra_files: int = 0) -> dict:
    """The meta data of the store of a release whose files are `shape` [2, k, h, w], for the images `paths`."""
    k, h, w = shape[1:]
    return {'annotator': release.annotator, 'format': release.name, 'source': str(release_dir),
            'img_size': release.img_size, 'grid': [h, w], 'topk': k, 'shard_size': shard_size,
            'num_classes': len(classes), 'classes': classes, 'paths_sha256': list_digest(paths), 'split': split,
            'scores': 'top-k logits, best first',
            'coverage': 'the centre square of each image (extent.npy)' if release.centre_square else 'the whole image',
            'extra_files': extra_files}


def import_released_labels(data_dir: str | Path, release_dir: str | Path, output: str | Path, info: DistInfo,
                           fmt: str = 'auto', split: str = 'train', workers: int = 8, shard_size: int = 4096,
                           skip_missing: bool = False) -> dict:
    """Write (or finish) the store of `data_dir/split` from a released label tree; returns its meta data."""
    data_dir, release_dir, output = Path(data_dir), Path(release_dir), Path(output)
    listing = open_split(data_dir, split)
    classes, paths = listing.classes, [path for path, _ in listing.samples]
    release_classes, files, other = release_files(release_dir)
    check_same_classes(release_classes, classes, f'the released labels {release_dir}', str(data_dir / split))
    keys = [str(Path(path).relative_to(split).with_suffix('').as_posix()) for path in paths]
    check_one_image_per_file(keys, paths, files, release_dir)
    row_files = [files.get(key) for key in keys]
    missing = [path for path, file in zip(paths, row_files) if file is None]
    if missing and not skip_missing:
        raise DataError(f'{len(missing)} image(s) of {data_dir / split} have no file in {release_dir}: '
                        f'{shown(missing)}; --skip-missing gives them an empty row (they train on their image label)')
    extra = sorted(set(files) - set(keys))
    if extra:
        logger.warning(f'{len(extra)} file(s) of {release_dir} are for images not in {data_dir / split}, not '
                       f'imported: {shown([files[key] for key in extra])}')
    if other:
        logger.warning(f'{len(other)} other file(s) in {release_dir} are not label files, ignored: {shown(other)}')
    matched = [file for file in row_files if file is not None]
    if not matched:
        raise DataError(f'no file of {release_dir} is for an image of {data_dir / split} (files are matched by '
                        f'class folder and image stem)')
    release, shape = started_release(output, fmt) or detect_release(release_dir, matched, fmt)
    meta = release_meta(release, shape, release_dir, classes, paths, split, shard_size, len(extra))

    def shard_rows(start: int, stop: int) -> Iterator[StoreRows]:
        rows = ReleaseRows(data_dir, release_dir, paths, listing.reader, row_files, range(start, stop), shape,
                           len(classes), release)
        for items in DataLoader(rows, batch_size=256, num_workers=workers, collate_fn=list):
            failed = next((item[1] for item in items if len(item) == 2), None)
            if failed is not None:
                raise DataError(failed)
            kept = [item for item in items if item[1] is not None]
            row_ids, values = np.empty(0, dtype=np.int64), ()
            if kept:
                row_ids, scores, class_ids, extents = (np.stack(values) for values in zip(*kept))
                values = (scores, class_ids, *([extents] if release.centre_square else []))
            yield StoreRows(row_ids, values, [item[0] for item in items if item[1] is None])

    return write_label_store(output, meta, paths, IMPORT_SHAPING, info, shard_rows,
                             with_extent=release.centre_square, skipped_key='missing', progress='import')
