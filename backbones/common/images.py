"""Image files and ImageNet-layout folders (`train/CLASS/*.JPEG`): listing, class lists, complete decoding.

Image paths are kept relative to the data folder (`train/n01440764/x.JPEG`): that is also the key of each image
in the token-label store, so a store generated on one machine works for a copy of the data set elsewhere.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image

from backbones.common.errors import DataError, UsageError

IMG_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif', '.tiff', '.webp')


class ImageReadError(DataError, RuntimeError):
    """An image file that cannot be opened or decoded."""


def to_rgb(img: Image.Image) -> Image.Image:
    """8-bit RGB. PIL's own conversion clips 16-bit and 32-bit grey to 255 (an almost white image): scale those."""
    if img.mode.startswith('I') or img.mode == 'F':
        values = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith('I;16') or values.max() <= 65535 else float(values.max())
        img = Image.fromarray(np.clip(np.round(values * (255.0 / top)), 0, 255).astype(np.uint8))
    if img.mode == 'RGB':
        img.load()  # decoded now, in place: converting would copy it
        return img
    return img.convert('RGB')


def read_image(path: Path | BinaryIO,
               before_decode: Callable[[Image.Image], bool | None] | None = None) -> Image.Image | None:
    """Decode an image file (or its bytes read from a tar, `MemberFile`) completely to RGB (a truncated file is an
    error, not grey pixels); failures name it.

    `before_decode` sees the opened, not yet decoded image (its size is known): it may ask for a reduced decode
    (`Image.draft`, JPEG's scaled decoding), or return False to leave the file undecoded (then None is returned).
    """
    try:
        with Image.open(path) as img:
            if before_decode is not None and before_decode(img) is False:
                return None
            return to_rgb(img)
    except Exception as e:  # PIL raises OSError, ValueError, SyntaxError, ... for broken files
        raise ImageReadError(f'cannot read image {path}: {type(e).__name__}: {e}') from e


def is_class_folder(path: Path) -> bool:
    """A class is a visible folder holding at least one image (not `.ipynb_checkpoints`, not an empty folder). A
    visible folder whose files are none of them images the suite reads (GIFs, say) is an error, never a class
    silently lost."""
    if not path.is_dir() or path.name.startswith('.'):
        return False
    if any(f.suffix.lower() in IMG_EXTENSIONS for f in path.iterdir()):
        return True
    others = sorted({f.suffix.lower() or f.name for f in path.iterdir() if f.is_file() and not f.name.startswith('.')})
    if others:
        raise DataError(f'{path} holds no image the suite reads (its files: {", ".join(others[:5])}; read: '
                        f'{", ".join(IMG_EXTENSIONS)}): convert them, or move the folder out of the split')
    return False


def find_classes(split_dir: Path) -> list[str]:
    if not split_dir.is_dir():
        raise DataError(f'no image folder at {split_dir} (expected the ImageNet layout {split_dir}/CLASS/*.JPEG)')
    classes = sorted(p.name for p in split_dir.iterdir() if is_class_folder(p))
    if not classes:
        raise DataError(f'{split_dir} has no class folders with images (expected {split_dir}/CLASS/*.JPEG, '
                        f'extensions {", ".join(IMG_EXTENSIONS)})')
    return classes


def check_same_classes(expected: Sequence[str], found: Sequence[str], expected_from: str, found_from: str) -> None:
    """Two class lists must be equal, names and order; otherwise an error naming what differs."""
    if list(expected) == list(found):
        return
    expected_set, found_set = set(expected), set(found)
    only_expected = [c for c in expected if c not in found_set]
    only_found = [c for c in found if c not in expected_set]
    detail = (f'only in {expected_from}: {", ".join(only_expected[:5]) or "none"}; '
              f'only in {found_from}: {", ".join(only_found[:5]) or "none"}')
    if not only_expected and not only_found:
        detail = 'the same names in another order'
    raise DataError(f'{found_from} has {len(found)} classes, {expected_from} {len(expected)}, and they differ '
                    f'({detail})')


def scan_split(data_dir: Path, split: str, classes: Sequence[str] | None = None,
               classes_from: str = 'the training split') -> tuple[list[str], list[tuple[str, int]]]:
    """Classes (sorted class folders, or those given, which come from `classes_from`) and (path relative to
    `data_dir`, label) of one split. Given classes may lack a folder; a folder outside them is an error."""
    split_dir = Path(data_dir) / split

    def files_of(name: str) -> list[str]:
        folder = split_dir / name
        return [f.name for f in sorted(folder.iterdir()) if f.suffix.lower() in IMG_EXTENSIONS] \
            if folder.is_dir() else []

    return label_samples(split, str(split_dir), find_classes(split_dir), files_of, classes, classes_from)


def label_samples(split: str, where: str, found: Sequence[str], files_of: Callable[[str], list[str]],
                  classes: Sequence[str] | None, classes_from: str) -> tuple[list[str], list[tuple[str, int]]]:
    """The classes (`found`, or those given, from `classes_from`) and (`split/CLASS/FILE`, label) of the images of
    a split (`where`, for messages), the file names of each class from `files_of` (sorted)."""
    classes = list(classes) if classes is not None else list(found)
    unknown = sorted(set(found) - set(classes))
    if unknown:
        raise DataError(f'{where} has {len(unknown)} class folder(s) that {classes_from} does not: '
                        f'{", ".join(unknown[:5])}')
    samples = [(f'{split}/{name}/{file}', label) for label, name in enumerate(classes) for file in files_of(name)]
    if not samples:
        raise DataError(f'no images under {where} (extensions {", ".join(IMG_EXTENSIONS)})')
    return classes, samples


def image_files(items: Sequence[str]) -> list[Path]:
    """The images named: files as given, folders as the image files in them (sorted); nothing else."""
    files = []
    for item in map(Path, items):
        if item.is_dir():
            found = sorted(f for f in item.iterdir() if f.is_file() and f.suffix.lower() in IMG_EXTENSIONS)
            if not found:
                raise UsageError(f'{item}: a folder without images ({", ".join(IMG_EXTENSIONS)})')
            files += found
        elif item.is_file():
            files.append(item)
        else:
            raise UsageError(f'{item}: no such image file or folder')
    return files
