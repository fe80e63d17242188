"""A segmentation data set of the user's own: its folder layout, its classes, and a config pointed at it.
docs/segmentation.md ("Your own data") gives the layout: images/ and masks/ (or annotations/) per split, an
optional classes.txt. A mask holds 0 .. N-1 for the N classes and 255 for pixels no loss or score counts; without
classes.txt the classes are counted from the masks. An own-data config (`own_data` in it) takes its classes, heads
and schedule from the data."""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mmengine.config import Config
from mmseg.datasets import ADE20KDataset
from mmseg.registry import DATASETS

from backbones.common.errors import CheckpointError, DataError
from backbones.common.images import IMG_EXTENSIONS
from backbones.common.log import logger
from backbones.dense.config import datasets
from backbones.dense.data_check import (
    IGNORE_INDEX,
    SHOWN,
    SINGLE_CHANNEL,
    binary_masks_message,
    colour_mask_message,
    decoded,
)
from backbones.dense.runner import checkpoint_meta

CLASSES_FILE = 'classes.txt'
IMAGE_DIR = 'images'
MASK_DIRS = ('masks', 'annotations')
SPLITS = {'train': ('train', 'training'), 'val': ('val', 'validation'), 'test': ('test', 'testing')}
MASK_SUFFIX = '.png'
HEADS = ('decode_head', 'auxiliary_head')
NUMBER = re.compile(r'[+-]?\d+')
# a colour written otherwise than R G B: #ff0000, 0xff0000, ff0000, 128,64,128
COLOUR_LIKE = re.compile(r'^(#|0x)[0-9a-f]+$|^(?=.*\d)[0-9a-f]{6}$|\d,\d', re.IGNORECASE)


@dataclass(frozen=True)
class OwnData:
    """A data set in the own-data layout: each split's images and masks (under `root`), their suffix, the classes."""

    root: Path
    splits: dict[str, tuple[str, str]]  # 'train', 'val' (and 'test') -> (image folder, mask folder)
    img_suffix: str
    classes: tuple[str, ...]
    palette: list[list[int]]
    classes_from: str  # where the classes came from, in words


def is_own_data_config(cfg: Config) -> bool:
    return cfg.get('own_data') is not None


def split_folders(root: Path, split: str) -> tuple[str, str] | None:
    """The (image folder, mask folder) of a split, relative to `root`, or None when the data set has no such split."""
    for name in SPLITS[split]:
        if (root / IMAGE_DIR / name).is_dir():
            masks = [f'{d}/{name}' for d in MASK_DIRS if (root / d / name).is_dir()]
            if not masks:
                raise DataError(f'{root / IMAGE_DIR / name} has no masks folder beside it: '
                                f'{" or ".join(str(root / d / name) for d in MASK_DIRS)}')
            return f'{IMAGE_DIR}/{name}', masks[0]
    return None


def image_suffix(folders: list[Path]) -> str:
    """The one suffix of the images in `folders` (mmseg lists a split by one suffix)."""
    suffixes: dict[str, Path] = {}
    for folder in folders:
        for path in sorted(folder.rglob('*')):
            if path.is_file() and path.suffix.lower() in IMG_EXTENSIONS:
                suffixes.setdefault(path.suffix, path)
    if not suffixes:
        raise DataError(f'no images in {", ".join(map(str, folders))} (read: {", ".join(IMG_EXTENSIONS)})')
    if len(suffixes) > 1:
        raise DataError(f'images of {len(suffixes)} suffixes ({", ".join(f"{p}" for p in suffixes.values())}): '
                        'one suffix per data set, convert the others')
    return next(iter(suffixes))


def class_line(line: str, where: str) -> tuple[str, list[int] | None]:
    """A classes-file line's name and colour (None without one): "name" or "name R G B", else an error at `where`."""
    words = line.split()
    numbers = 0
    while numbers < len(words) and NUMBER.fullmatch(words[-1 - numbers]):
        numbers += 1
    odd = next((w for w in words if COLOUR_LIKE.search(w)), None)
    if odd is not None:
        raise DataError(f'{where}: {odd!r} is no colour of this format: write a colour as three whole numbers 0-255 '
                        f'after the name ("road 128 64 128")')
    if numbers not in (0, 3) or numbers == len(words):
        raise DataError(f'{where}: {line!r} is not "name" or "name R G B": a colour is three whole numbers 0-255 after '
                        f'the name, and a name may not end in a number (it would read as part of a colour)')
    if numbers == 0:
        return line, None
    colour = [int(w) for w in words[-3:]]
    if not all(0 <= c <= 255 for c in colour):
        raise DataError(f'{where}: colour {" ".join(words[-3:])} is not three values 0-255')
    return ' '.join(words[:-3]), colour


def read_classes_file(path: Path) -> tuple[list[str], list[list[int] | None]]:
    """A classes file's names and colours (None where not given), skipping empty lines, # comments and a BOM."""
    names, colours = [], []
    try:
        lines = path.read_text(encoding='utf-8-sig').splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f'{path}: not a readable classes file ({type(e).__name__}: {e})') from e
    for number, line in enumerate(lines, 1):
        line = ' '.join(line.split())
        if not line or line.startswith('#'):
            continue
        name, colour = class_line(line, f'{path}, line {number}')
        names.append(name)
        colours.append(colour)
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise DataError(f'{path}: classes named twice: {", ".join(duplicates[:SHOWN])}')
    if len(names) < 2:
        raise DataError(f'{path}: {len(names)} class(es); a segmentation data set needs at least 2 (one per line, '
                        'in label order)')
    if len(names) > IGNORE_INDEX:
        raise DataError(f'{path}: {len(names)} classes; at most {IGNORE_INDEX} (mask value {IGNORE_INDEX} is ignored)')
    return names, colours


def mask_values(mask_dirs: list[Path]) -> set[int]:
    """Every label value the masks under `mask_dirs` use, 255 (ignored) included; masks that cannot be read are
    passed over here (the data check names what is wrong with them), colour masks are an error."""
    values: set[int] = set()
    for folder in mask_dirs:
        for path in sorted(folder.rglob(f'*{MASK_SUFFIX}')):
            try:
                mask = decoded(str(path))
            except Exception:  # a damaged mask
                continue
            if mask.mode not in SINGLE_CHANNEL:
                raise DataError(colour_mask_message(path, mask))
            values.update(int(v) for v in np.unique(np.asarray(mask)))
    return values


def counted_classes(root: Path, mask_dirs: list[Path]) -> list[str]:
    """Classes 0 .. the largest mask value, named 'class N'; masks using few of them (grey levels) are refused."""
    found = mask_values(mask_dirs)
    values = found - {IGNORE_INDEX}
    if not values:
        raise DataError(f'the masks of {root} hold no class value (only {IGNORE_INDEX}, ignored)' if found else
                        f'no readable mask in {", ".join(map(str, mask_dirs))}')
    if values == {0}:
        raise DataError(binary_masks_message(root) if IGNORE_INDEX in found else
                        f'the masks of {root} hold one class (value 0); a data set needs at least 2')
    count = max(values) + 1
    if len(values) * 2 < count:
        raise DataError(f'the masks of {root} use {len(values)} of the values 0..{count - 1} '
                        f'({", ".join(map(str, sorted(values)[:8]))}): grey levels or colours, not class indices '
                        f'0, 1, 2, ... ({IGNORE_INDEX} ignored); write each class as its index, or declare all '
                        f'{count} classes in {root / CLASSES_FILE} if the values are indices')
    return [f'class {v}' for v in range(count)]


def default_palette(count: int) -> list[list[int]]:
    """ADE20K's colours for the first 150 classes, seeded random ones beyond."""
    palette = [list(c) for c in ADE20KDataset.METAINFO['palette'][:count]]
    rng = np.random.default_rng(0)
    palette += [[int(v) for v in rng.integers(0, 256, 3)] for _ in range(count - len(palette))]
    return palette


def read_own_data(root: str | Path) -> OwnData:
    """The data set at `root`, checked for its layout; its classes from classes.txt, or counted from the masks."""
    root = Path(root)
    splits = {split: folders for split in SPLITS if (folders := split_folders(root, split))}
    for split in ('train', 'val'):
        if split not in splits:
            raise DataError(f'{root}: no {" or ".join(f"{IMAGE_DIR}/{n}" for n in SPLITS[split])} folder; the '
                            f'layout is {IMAGE_DIR}/{{train,val}}/ and masks/{{train,val}}/ (docs/segmentation.md, '
                            f'"Your own data")')
    suffix = image_suffix([root / images for images, _ in splits.values()])
    classes_file = root / CLASSES_FILE
    if classes_file.is_file():
        names, colours = read_classes_file(classes_file)
        fill = default_palette(len(names))
        palette = [colour or fill[i] for i, colour in enumerate(colours)]
        classes_from = str(classes_file)
    else:
        names = counted_classes(root, [root / masks for _, masks in splits.values()])
        palette = default_palette(len(names))
        classes_from = f'counted from the masks (values 0..{len(names) - 1}; {CLASSES_FILE} would name them)'
    return OwnData(root, splits, suffix, tuple(names), palette, classes_from)


def set_classes(cfg: Config, classes: tuple[str, ...], palette: list[list[int]],
                reduce_zero_label: bool = False) -> None:
    """The config's data sets and heads for `classes` (mask value v is class v, or v - 1 with `reduce_zero_label`)."""
    for dataset in datasets(cfg):
        dataset.update(metainfo=dict(classes=tuple(classes), palette=palette), reduce_zero_label=reduce_zero_label)
    for head in HEADS:
        if cfg.model.get(head):
            cfg.model[head]['num_classes'] = len(classes)


def use_own_data(cfg: Config, data: OwnData) -> None:
    """Point an own-data config at `data`: folders, suffix and classes; testing on the test split where there is one."""
    loaders = {'train_dataloader': 'train', 'val_dataloader': 'val',
               'test_dataloader': 'test' if 'test' in data.splits else 'val'}
    for loader, split in loaders.items():
        if cfg.get(loader):
            images, masks = data.splits[split]
            cfg[loader].dataset.update(data_root=str(data.root), img_suffix=data.img_suffix, seg_map_suffix=MASK_SUFFIX,
                                       data_prefix=dict(img_path=images, seg_map_path=masks))
    set_classes(cfg, data.classes, data.palette)
    shown = ', '.join(data.classes[:8]) + (', ...' if len(data.classes) > 8 else '')
    logger.info(f'data: {data.root}, {len(data.classes)} classes ({shown}), {data.classes_from}')


def trained_classes(checkpoint: str) -> tuple[tuple[str, ...], list[list[int]], bool] | None:
    """The classes, colours and reduce_zero_label a checkpoint records of its training set, or None."""
    meta = checkpoint_meta(checkpoint).get('dataset_meta') or {}
    if not meta.get('classes'):
        return None
    classes = tuple(meta['classes'])
    palette = meta.get('palette') or default_palette(len(classes))
    return classes, [list(map(int, colour)) for colour in palette], bool(meta.get('reduce_zero_label', False))


def use_trained_classes(cfg: Config, checkpoint: str) -> None:
    """A config with no data set at hand takes the classes its checkpoint was trained on."""
    trained = trained_classes(checkpoint)
    if trained is None:
        raise CheckpointError(f'{checkpoint} records no classes (mmengine\'s meta.dataset_meta): give --data-root, the '
                              'data set it was trained on')
    set_classes(cfg, *trained)


def check_trained_classes(cfg: Config, checkpoint: str) -> None:
    """The data set's classes are the ones the checkpoint was trained on, where it records them (by name)."""
    trained = trained_classes(checkpoint)
    data = tuple(DATASETS.build({**cfg.test_dataloader.dataset, 'pipeline': [], 'lazy_init': True}).metainfo['classes'])
    if trained is not None and trained[0] != data:
        raise CheckpointError(f'{checkpoint} was trained on {len(trained[0])} classes ({", ".join(trained[0][:5])}'
                              f'{", ..." if len(trained[0]) > 5 else ""}), the data set holds {len(data)} '
                              f'({", ".join(data[:5])}{", ..." if len(data) > 5 else ""})')


def training_images(cfg: Config) -> int:
    """How many images the config's training split holds."""
    dataset = cfg.train_dataloader.dataset
    if dataset.get('ann_file'):
        return len(json.loads(annotation_file(dataset).read_text())['images'])
    folder = Path(dataset['data_root']) / dataset['data_prefix']['img_path']
    return sum(1 for p in folder.rglob(f'*{dataset["img_suffix"]}') if p.is_file())


def sized_iterations(cfg: Config, processes: int, grad_accum_steps: int) -> int:
    """The updates of `own_data.epochs` passes at the global batch, within `own_data.min_iters` and the config's."""
    rule, images = cfg.own_data, training_images(cfg)
    batch = cfg.train_dataloader['batch_size'] * processes * grad_accum_steps
    iters = min(cfg.train_cfg['max_iters'], max(rule['min_iters'], math.ceil(rule['epochs'] * images / batch)))
    logger.info(f'schedule sized to the data: {rule["epochs"]} epochs of {images} images in batches of {batch} -> '
                f'{iters} updates (at least {rule["min_iters"]})')
    return iters


def annotation_file(dataset: dict) -> Path:
    return Path(dataset.get('data_root') or '') / dataset['ann_file']
