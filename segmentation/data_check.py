"""Segmentation data checked before a run uses it, so that nothing wrong is trained on or scored in silence.

Every image must decode completely (a truncated JPEG is not grey pixels), have its annotation, of the same size, with
one channel and only label values the data set defines (or 255, ignored). mmseg lists the images of a folder by
one suffix: image files with another suffix would be left out without a word, so they are an error too. A report
names the first bad files and the count; with `skip_unreadable`, images that do not decode are left out and
counted instead.
"""
from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple
from collections.abc import Sequence

import numpy as np
from mmengine.config import ConfigDict
from PIL import Image

from common.errors import DataError
from common.images import IMG_EXTENSIONS
from common.log import logger
from mmseg.datasets import ADE20KDataset
from mmseg.registry import DATASETS

IGNORE_INDEX = 255
SINGLE_CHANNEL = ('1', 'L', 'P', 'I', 'I;16', 'I;16L', 'I;16B')
SHOWN = 5
ADE20K_NAME = re.compile(r'ADE_(train|val|test)_\d+$')  # ADE_train_00000001.jpg: every ADE20K image's name


class Problem(NamedTuple):
    message: str
    unreadable_image: bool = False  # the image itself does not decode (what --skip-unreadable leaves out)


def decoded(path: str) -> Image.Image:
    """The image fully decoded (PIL raises on a truncated or damaged file)."""
    with Image.open(path) as img:
        img.load()
        return img.copy()


def pair_problem(img_path: str, seg_path: str, num_classes: int, reduce_zero_label: bool) -> Problem | None:
    """What is wrong with one image and its annotation, or None."""
    try:
        image = decoded(img_path)
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, ... for damaged files
        return Problem(f'{img_path} cannot be decoded ({type(e).__name__}: {e})', unreadable_image=True)
    if not Path(seg_path).is_file():
        return Problem(f'{img_path} has no annotation {seg_path}')
    try:
        label = decoded(seg_path)
    except Exception as e:
        return Problem(f'annotation {seg_path} cannot be decoded ({type(e).__name__}: {e})')
    if label.mode not in SINGLE_CHANNEL:
        return Problem(f'annotation {seg_path} is {label.mode} ({len(label.getbands())} channels); labels are one '
                       f'channel')
    if label.size != image.size:
        return Problem(f'annotation {seg_path} is {label.size[0]}x{label.size[1]}, its image '
                       f'{image.size[0]}x{image.size[1]}')
    values = np.unique(np.asarray(label))
    # With reduce_zero_label, file value v is class v - 1 and 0 is ignored: 0..num_classes are valid.
    top = num_classes if reduce_zero_label else num_classes - 1
    bad = [int(v) for v in values if v > top and v != IGNORE_INDEX]
    if bad:
        return Problem(f'annotation {seg_path} has label values {", ".join(map(str, bad[:SHOWN]))} beyond the '
                       f'{num_classes} classes (valid: 0..{top}, {IGNORE_INDEX} ignored)')
    return None


def stray_images(img_dir: Path, suffix: str) -> list[Path]:
    """Image files in `img_dir` that mmseg will not list because their suffix is not `suffix`."""
    if not img_dir.is_dir():
        return []
    return sorted(p for p in img_dir.rglob('*') if p.suffix.lower() in IMG_EXTENSIONS and not p.name.endswith(suffix))


def check_ade20k_names(dataset, data_list: list[dict], img_dir: Path) -> None:
    """An ADE20K config takes ADE20K's images only: a folder of other images (a data set of its own classes) would
    be trained as ADE20K's 150 classes, its value 0 ignored and 1, 2, ... read as wall, building, ..."""
    if not isinstance(dataset, ADE20KDataset):
        return
    foreign = [d['img_path'] for d in data_list if not ADE20K_NAME.match(Path(d['img_path']).stem)]
    if foreign:
        raise DataError(f'{img_dir} holds images that are not ADE20K\'s (e.g. {Path(foreign[0]).name}; ADE20K\'s are '
                        f'ADE_train_*, ADE_val_*), and this config trains ADE20K\'s 150 classes (mask value 0 '
                        f'ignored): for a data set of your own classes take an own-data config, e.g. '
                        f'seg_configs/upernet_lvvit_s_own_data.py --data-root {dataset.data_root} '
                        f'(docs/segmentation.md, "Your own data")')


def check_dataset(dataset_cfg: ConfigDict, skip_unreadable: bool = False) -> tuple[list[int], list[str]]:
    """Check a dataset config's files; returns the indices to use and the images left out as unreadable."""
    dataset = DATASETS.build({**dataset_cfg, 'pipeline': [], 'lazy_init': False})
    data_list = [dataset.get_data_info(i) for i in range(len(dataset))]
    img_dir = Path(dataset.data_prefix['img_path'])
    if not data_list:
        raise DataError(f'no {dataset.img_suffix} images in {img_dir}')
    check_ade20k_names(dataset, data_list, img_dir)
    stray = stray_images(img_dir, dataset.img_suffix)
    if stray:
        raise DataError(f'{len(stray)} image file(s) in {img_dir} are not {dataset.img_suffix} and would be left '
                        f'out: {", ".join(map(str, stray[:SHOWN]))}; convert them or set img_suffix')
    num_classes = len(dataset.metainfo['classes'])
    items = [(d['img_path'], d['seg_map_path'], num_classes, d.get('reduce_zero_label', False))
             for d in data_list]
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:  # PIL decodes without the GIL
        problems = list(pool.map(lambda item: pair_problem(*item), items))
    fatal = [p.message for p in problems if p and not (skip_unreadable and p.unreadable_image)]
    if fatal:
        hint = ''
        if not skip_unreadable and all(p.unreadable_image for p in problems if p):
            hint = ' (--skip-unreadable leaves out images that do not decode)'
        raise DataError(f'{len(fatal)} of {len(items)} images in {img_dir} cannot be used: '
                        + '; '.join(fatal[:SHOWN]) + ('; ...' if len(fatal) > SHOWN else '') + hint)
    keep = [i for i, problem in enumerate(problems) if problem is None]
    return keep, [items[i][0] for i, problem in enumerate(problems) if problem is not None]


def check_data(cfg, keys: Sequence[str], skip_unreadable: bool = False) -> None:
    """Check the datasets of `keys` (e.g. train_dataloader); with `skip_unreadable`, leave out undecodable images
    (the dataset's `indices`) and say how many."""
    for key in keys:
        loader = cfg.get(key)
        if not loader:
            continue
        keep, left_out = check_dataset(loader.dataset, skip_unreadable)
        if left_out:
            loader.dataset.indices = keep
            logger.info(f'{key}: left out {len(left_out)} unreadable image(s), e.g. {left_out[0]}')
