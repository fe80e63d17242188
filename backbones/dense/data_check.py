"""Segmentation data checked before a run uses it, so that nothing wrong is trained on or scored in silence: every
image decodes completely, has no EXIF orientation and has its annotation, of its size, one channel, only label values
the data set defines (or 255); masks of only 0 and 255 and images of another suffix than the one mmseg lists are
refused. A report names the first bad files and the count; with `skip_unreadable`, images that do not decode are
left out and counted instead."""
from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np
from mmengine.config import ConfigDict
from mmseg.registry import DATASETS
from PIL import Image

from backbones.common.errors import DataError
from backbones.common.images import IMG_EXTENSIONS
from backbones.common.log import logger
from backbones.dense.layouts import layout_of

IGNORE_INDEX = 255
SINGLE_CHANNEL = ('1', 'L', 'P', 'I', 'I;16', 'I;16L', 'I;16B')
DEPTH_MODES = ('I', 'I;16', 'I;16L', 'I;16B')  # 16-bit (Pillow opens a 16-bit PNG as I;16 or I)
SHOWN = 5


ORIENTATION_TAG = 0x0112  # EXIF's Orientation: 1 is as stored; 2-8 mirror and/or turn the picture when shown
TURNS = {2: 'mirrored', 3: 'turned 180 degrees', 4: 'mirrored upside down', 5: 'mirrored and turned 90 degrees',
         6: 'turned 90 degrees', 7: 'mirrored and turned 90 degrees', 8: 'turned 90 degrees'}


class Problem(NamedTuple):
    message: str
    unreadable_image: bool = False  # the image itself does not decode (what --skip-unreadable leaves out)


class PairCheck(NamedTuple):
    """What the check of one image and its annotation found: its problem (or None), and the annotation's values."""

    problem: Problem | None
    values: frozenset[int] = frozenset()


def decoded(path: str) -> Image.Image:
    """The image fully decoded (PIL raises on a truncated or damaged file)."""
    with Image.open(path) as img:
        img.load()
        return img.copy()


def exif_orientation(image: Image.Image) -> int:
    """The EXIF orientation of an opened image: 1 (as stored) when it has none."""
    return int(image.getexif().get(ORIENTATION_TAG, 1) or 1)


def file_orientation(path: str | Path) -> int:
    """The EXIF orientation of an image file (1 without one)."""
    with Image.open(path) as image:
        return exif_orientation(image)


def size_text(image: Image.Image) -> str:
    return f'{image.size[0]}x{image.size[1]}'


def oriented_image_problem(img_path: str, orientation: int, sizes: str = '') -> Problem:
    """An image tagged to be shown turned or mirrored (`sizes`: how its annotation's size differs, if it does)."""
    return Problem(f'{img_path} has EXIF orientation {orientation} (viewers show it {TURNS.get(orientation, "turned")})'
                   f'{sizes}: images and masks are read as stored, and a mask drawn in an EXIF-aware tool fits the '
                   f'turned picture; save the image as shown without the tag (PIL\'s ImageOps.exif_transpose) with a '
                   f'mask drawn on that, or remove the tag if its mask fits the stored pixels')


def colour_mask_message(seg_path: str | Path, label: Image.Image) -> str:
    return (f'annotation {seg_path} is {label.mode} ({len(label.getbands())} channels), a colour mask: masks hold one '
            f'class index per pixel in one channel (0..N-1, {IGNORE_INDEX} ignored); convert each colour to its '
            f'class index')


def binary_masks_message(where: str | Path) -> str:
    """0/255 masks: their foreground is mmseg's ignore index, never learned and never scored."""
    return (f'the masks of {where} hold only the values 0 and {IGNORE_INDEX}: {IGNORE_INDEX} marks ignored pixels (no '
            f'loss or score counts them), not a class, so the foreground would never be learned; write class indices '
            f'instead (0 background, 1 foreground: mask // 255)')


def loaded_value(value: int, reduce_zero_label: bool, label_map: dict[int, int] | None) -> int:
    """What mmseg's LoadAnnotations makes of a stored mask value (`reduce_zero_label`, then the set's `label_map`)."""
    if reduce_zero_label:
        value = IGNORE_INDEX if value in (0, IGNORE_INDEX) else value - 1
    return label_map.get(value, value) if label_map else value


def loads_as_label(value: int, num_classes: int, reduce_zero_label: bool, label_map: dict[int, int] | None) -> bool:
    """Whether a stored mask value loads as one of `num_classes` classes or as ignored."""
    loaded = loaded_value(value, reduce_zero_label, label_map)
    return 0 <= loaded < num_classes or loaded == IGNORE_INDEX


def pair_check(img_path: str, seg_path: str, num_classes: int, reduce_zero_label: bool,
               label_map: dict[int, int] | None = None) -> PairCheck:
    """What is wrong with an image and its annotation, or None; and the annotation's values (through `label_map`)."""
    try:
        image = decoded(img_path)
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, ... for damaged files
        return PairCheck(Problem(f'{img_path} cannot be decoded ({type(e).__name__}: {e})', unreadable_image=True))
    if not Path(seg_path).is_file():
        return PairCheck(Problem(f'{img_path} has no annotation {seg_path}'))
    try:
        label = decoded(seg_path)
    except Exception as e:
        return PairCheck(Problem(f'annotation {seg_path} cannot be decoded ({type(e).__name__}: {e})'))
    if label.mode not in SINGLE_CHANNEL:
        return PairCheck(Problem(colour_mask_message(seg_path, label)))
    orientation = exif_orientation(image)
    if orientation != 1:
        sizes = (f' (its annotation {seg_path} is {size_text(label)}, the stored image {size_text(image)})'
                 if label.size != image.size else '')
        return PairCheck(oriented_image_problem(img_path, orientation, sizes))
    if label.size != image.size:
        return PairCheck(Problem(f'annotation {seg_path} is {size_text(label)}, its image {size_text(image)}'))
    values = frozenset(int(v) for v in np.unique(np.asarray(label)))
    bad = sorted(v for v in values if not loads_as_label(v, num_classes, reduce_zero_label, label_map))
    if bad:
        return PairCheck(Problem(f'annotation {seg_path} has label values {", ".join(map(str, bad[:SHOWN]))} '
                                 f'{valid_values(num_classes, reduce_zero_label, label_map)}'), values)
    return PairCheck(None, values)


def valid_values(num_classes: int, reduce_zero_label: bool, label_map: dict[int, int] | None) -> str:
    """The values a data set's masks may hold, in words (after the values they may not)."""
    if label_map:
        valid = [v for v in sorted(label_map) if loads_as_label(v, num_classes, reduce_zero_label, label_map)]
        return (f'outside the ids its data set maps to its {num_classes} classes (valid: {id_ranges(valid)}; '
                f'{IGNORE_INDEX} ignored)')
    # With reduce_zero_label, file value v is class v - 1 and 0 is ignored: 0..num_classes are valid.
    top = num_classes if reduce_zero_label else num_classes - 1
    return f'beyond the {num_classes} classes (valid: 0..{top}, {IGNORE_INDEX} ignored)'


def id_ranges(ids: list[int]) -> str:
    """Sorted ids in words, runs as ranges: '0..6, 9'."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ', '.join(f'{a}..{b}' if b > a else f'{a}' for a, b in runs)


def check_labels_used(dataset, values: set[int]) -> None:
    """Masks of 0 and 255 alone are refused: with 255 ignored, such a set teaches and scores its first class only."""
    if not dataset.reduce_zero_label and IGNORE_INDEX in values and values <= {0, IGNORE_INDEX}:
        raise DataError(binary_masks_message(dataset.data_prefix['seg_map_path']))


def image_check(img_path: str, size: tuple[int, int], said: str = 'its annotation says') -> Problem | None:
    """What is wrong with an image its annotation (`said`) says is `size` (width, height), or None."""
    if not Path(img_path).is_file():
        return Problem(f'{img_path}: image file not found')
    try:
        image = decoded(img_path)
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, ... for damaged files
        return Problem(f'{img_path} cannot be decoded ({type(e).__name__}: {e})', unreadable_image=True)
    orientation = exif_orientation(image)
    if orientation != 1:
        return oriented_image_problem(img_path, orientation)
    if image.size != size:
        return Problem(f'{img_path} is {size_text(image)}, {said} {size[0]}x{size[1]}')
    return None


def depth_pair_check(img_path: str, depth_path: str) -> Problem | None:
    """What is wrong with an image and its depth map (one channel, the image's size), or None."""
    if not Path(depth_path).is_file():
        return Problem(f'{img_path} has no depth map {depth_path}')
    try:
        depth = decoded(depth_path)
    except Exception as e:
        return Problem(f'depth map {depth_path} cannot be decoded ({type(e).__name__}: {e})')
    if depth.mode not in DEPTH_MODES:
        return Problem(f'depth map {depth_path} is {depth.mode} ({len(depth.getbands())} channel(s) of '
                       f'{"8" if depth.mode in ("L", "P", "1") else "other"} bits); a depth map is one 16-bit channel '
                       f'of depth x the data set\'s scale (NYU-v2: millimetres)')
    return image_check(img_path, depth.size, f'its depth map {depth_path} is')


class EntryChecks(Protocol):
    """How a dense task checks its data set (`tasks.DenseTask`): each entry, then the ground truth's values."""

    def check_entry(self, entry: dict, num_classes: int) -> PairCheck: ...

    def check_values(self, dataset, values: set[int]) -> None: ...


def check_dataset(dataset_cfg: ConfigDict, task: EntryChecks,
                  skip_unreadable: bool = False) -> tuple[list[int], list[str]]:
    """Check the files of a dataset config of `task`; returns the indices to use and the unreadable images left out."""
    if (layout := layout_of(dataset_cfg)) is not None:
        layout.check(dataset_cfg)
    # unserialised: mmengine's serialisation fails on an empty list with a traceback
    dataset = DATASETS.build({**dataset_cfg, 'pipeline': [], 'lazy_init': True, 'serialize_data': False})
    img_dir = Path(dataset.data_prefix['img_path'])
    if not img_dir.is_dir():  # mmengine's listing fails with a traceback (the layout's check says more, where it can)
        raise DataError(f'{img_dir}: no such folder')
    dataset.full_init()
    data_list = [dataset.get_data_info(i) for i in range(len(dataset))]
    suffix = getattr(dataset, 'img_suffix', None)  # a folder-listed set's (a COCO-format set lists its images)
    if not data_list:
        raise DataError(f'no {suffix or ""} images in {img_dir}' if suffix else
                        f'{dataset.ann_file} lists no images')
    # image files mmseg will not list, their suffix not `suffix`
    stray = sorted(p for p in img_dir.rglob('*') if p.suffix.lower() in IMG_EXTENSIONS
                   and not p.name.endswith(suffix)) if suffix else []
    if stray:
        raise DataError(f'{len(stray)} image file(s) in {img_dir} are not {suffix} and would be left '
                        f'out: {", ".join(map(str, stray[:SHOWN]))}; convert them or set img_suffix')
    num_classes = len(dataset.metainfo['classes'] or ())
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:  # PIL decodes without the GIL
        checks = list(pool.map(lambda entry: task.check_entry(entry, num_classes), data_list))
    problems = [check.problem for check in checks]
    fatal = [p.message for p in problems if p and not (skip_unreadable and p.unreadable_image)]
    if fatal:
        hint = ''
        if not skip_unreadable and all(p.unreadable_image for p in problems if p):
            hint = ' (--skip-unreadable leaves out images that do not decode)'
        raise DataError(f'{len(fatal)} of {len(checks)} images in {img_dir} cannot be used: '
                        + '; '.join(fatal[:SHOWN]) + ('; ...' if len(fatal) > SHOWN else '') + hint)
    task.check_values(dataset, set().union(*(check.values for check in checks)))
    keep = [i for i, problem in enumerate(problems) if problem is None]
    return keep, [data_list[i]['img_path'] for i, problem in enumerate(problems) if problem is not None]


def check_data(cfg, keys: Sequence[str], task: EntryChecks, skip_unreadable: bool = False) -> None:
    """Check the datasets of `keys` as `task` checks them; with `skip_unreadable`, leave out undecodable images."""
    for key in keys:
        loader = cfg.get(key)
        if not loader:
            continue
        keep, left_out = check_dataset(loader.dataset, task, skip_unreadable)
        if left_out:
            loader.dataset.indices = keep
            logger.info(f'{key}: left out {len(left_out)} unreadable image(s), e.g. {left_out[0]}')
