"""Image files and ImageNet-layout folders (`train/CLASS/*.JPEG`): listing, class lists, complete decoding (colour
JPEGs through `backbones.common.jpeg`, with Pillow's pixels; every other file through Pillow).

Image paths are kept relative to the data folder (`train/n01440764/x.JPEG`), the key of each image in the
token-label store. Every entry of a split folder is accounted for (`split_entries`): a class folder or a tar is
read, hidden entries, `lost+found`, `tars.index.npz` and empty folders are ignored, anything else is an error."""
from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO, NamedTuple

import numpy as np
from PIL import Image

from backbones.common.errors import DataError, UsageError
from backbones.common.jpeg import colour_jpeg_size, decode_colour_jpeg

IMG_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif', '.tiff', '.webp')
TAR_SUFFIX = '.tar'  # the one spelling of a tar the readers take (uncompressed: each image is one read in place)
FOLDER_INDEX = 'tars.index.npz'  # the index the tar reader keeps beside a split folder's tars
IGNORED_ENTRIES = ('lost+found', FOLDER_INDEX)  # besides hidden entries: a file system's own folder, the index
COMPRESSED_TARS = {'.tar.gz': 'gunzip', '.tgz': 'gunzip', '.tar.bz2': 'bunzip2', '.tar.xz': 'unxz',
                   '.tar.zst': 'unzstd'}


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


class DecodedImage(NamedTuple):
    """A file's RGB pixels (h, w, 3) uint8, decoded at `full_size` (w, h) or reduced by a JPEG scale."""

    pixels: np.ndarray
    full_size: tuple[int, int]


def file_bytes(file: Path | BinaryIO) -> bytes:
    """The whole content of an image file, on disk or read from a tar."""
    return file.getvalue() if isinstance(file, io.BytesIO) else Path(file).read_bytes()


def image_bytes(path: Path | BinaryIO) -> bytes:
    """`file_bytes`, a file that cannot be read named as an image that cannot be."""
    try:
        return file_bytes(path)
    except OSError as e:
        raise ImageReadError(f'cannot read image {path}: {type(e).__name__}: {e}') from e


def read_rgb(path: Path | BinaryIO, requested: Callable[[tuple[int, int]], tuple[int, int] | None] | None = None,
             fast: bool = False) -> DecodedImage:
    """A file's pixels as `read_image` decodes them, JPEGs drafted to what `requested` returns for the full size."""
    drawn = {}

    def wanted(size: tuple[int, int]) -> tuple[int, int] | None:
        if 'full_size' not in drawn:
            drawn['full_size'], drawn['wanted'] = size, requested(size) if requested is not None else None
        return drawn['wanted']

    data = image_bytes(path)
    size = colour_jpeg_size(data)
    pixels = decode_colour_jpeg(data, size, wanted(size), fast) if size is not None else None
    if pixels is None:
        pixels = np.asarray(read_image(path, lambda img: img.draft('RGB', wanted(img.size)), data))
    return DecodedImage(pixels, drawn['full_size'])


def read_image(path: Path | BinaryIO, before_decode: Callable[[Image.Image], bool | None] | None = None,
               data: bytes | None = None) -> Image.Image | None:
    """Decode an image file (or a tar's `MemberFile`; `data`: its bytes) completely to RGB, failures naming it; colour
    JPEGs by `read_rgb`'s decoder unless `before_decode`, which may draft it or return False (None returned)."""
    if before_decode is None and data is None:
        data = image_bytes(path)
        size = colour_jpeg_size(data)
        pixels = decode_colour_jpeg(data, size) if size is not None else None
        if pixels is not None:
            return Image.fromarray(pixels)
    try:
        with Image.open(path if data is None else io.BytesIO(data)) as img:
            if before_decode is not None and before_decode(img) is False:
                return None
            return to_rgb(img)
    except Exception as e:  # PIL raises OSError, ValueError, SyntaxError, ... for broken files
        raise ImageReadError(f'cannot read image {path}: {type(e).__name__}: {e}') from e


def is_image_name(name: str) -> bool:
    """A name with a suffix of IMG_EXTENSIONS, not hidden (macOS's `._NAME.JPEG` resource files do not decode)."""
    path = Path(name)
    return path.suffix.lower() in IMG_EXTENSIONS and not path.name.startswith('.')


def is_class_folder(path: Path) -> bool:
    """A class is a visible folder holding an image; a visible folder of no image read is an error."""
    if not path.is_dir() or path.name.startswith('.'):
        return False
    entries = list(path.iterdir())
    if any(is_image_name(f.name) for f in entries):
        return True
    others = sorted({f'{f.name}/' if f.is_dir() else f.suffix.lower() or f.name
                     for f in entries if not f.name.startswith('.')})
    if others:
        raise DataError(f'{path} holds no image the suite reads (its files: {", ".join(others[:5])}; read: '
                        f'{", ".join(IMG_EXTENSIONS)}): convert them, or move the folder out of the split')
    return False


def decompress(tool: str) -> str:
    """What to do with a compressed tar (whose images could not be read in place)."""
    return f'{tool} it (the reader reads uncompressed tars in place)'


def unread_tar_fix(name: str) -> str | None:
    """What to do with a file named as a tar the readers do not take; None for any other name."""
    lower = name.lower()
    tool = next((tool for suffix, tool in COMPRESSED_TARS.items() if lower.endswith(suffix)), None)
    if tool is not None:
        return f'a compressed tar: {decompress(tool)}'
    if lower.endswith(TAR_SUFFIX) and not name.endswith(TAR_SUFFIX):
        return f'a tar not named .tar: rename it {name[:-len(TAR_SUFFIX)]}{TAR_SUFFIX}'
    return None


def is_split_tar(entry: Path) -> bool:
    """A tar a split folder's reader takes: a visible `*.tar` file."""
    return entry.suffix == TAR_SUFFIX and not entry.name.startswith('.') and entry.is_file()


def split_entries(split_dir: Path) -> tuple[list[str], list[Path]]:
    """A split folder's class folders and tars (sorted); entries to ignore as the module says, any other an error."""
    classes, tars = [], []
    for entry in sorted(split_dir.iterdir()):
        if entry.name.startswith('.') or entry.name in IGNORED_ENTRIES:
            continue
        if is_split_tar(entry):
            tars.append(entry)
        elif entry.is_dir():
            if is_class_folder(entry):
                classes.append(entry.name)
        elif is_image_name(entry.name):
            raise DataError(f'{split_dir}: image {entry.name} is directly in the split folder, in no class folder: '
                            f'sort the images into class folders first (docs/imagenet.md)')
        else:
            what = ('a link to nothing: mend or remove it' if entry.is_symlink() and not entry.exists() else
                    unread_tar_fix(entry.name) or 'neither a class folder nor a .tar file: move it out of the split')
            raise DataError(f'{entry}: {what} (a split folder holds class folders CLASS/ and tars; hidden entries, '
                            f'{", ".join(IGNORED_ENTRIES)} and empty folders are ignored)')
    return classes, tars


def find_classes(split_dir: Path) -> list[str]:
    """The class folders of a split folder of class folders alone (`split_entries`)."""
    if not split_dir.is_dir():
        raise DataError(f'no image folder at {split_dir} (expected the ImageNet layout {split_dir}/CLASS/*.JPEG)')
    classes, tars = split_entries(split_dir)
    if tars:
        raise DataError(f'{split_dir} holds tars ({tars[0].name}), which this command does not read: give it the '
                        f'split as class folders')
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
    """Classes (sorted folders, or those given) and (path under `data_dir`, label) of one split's images."""
    split_dir = Path(data_dir) / split
    return label_samples(split, str(split_dir), find_classes(split_dir), lambda name: class_files(split_dir / name),
                         classes, classes_from)


def class_files(folder: Path) -> list[str]:
    """The image files of a class folder (names, sorted); none where there is no such folder."""
    return [f.name for f in sorted(folder.iterdir()) if is_image_name(f.name)] if folder.is_dir() else []


def label_samples(split: str, where: str, found: Sequence[str], files_of: Callable[[str], list[str]],
                  classes: Sequence[str] | None, classes_from: str) -> tuple[list[str], list[tuple[str, int]]]:
    """The classes (`found`, or those given) and (`split/CLASS/FILE`, label) of a split's images."""
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
            found = sorted(f for f in item.iterdir() if f.is_file() and is_image_name(f.name))
            if not found:
                raise UsageError(f'{item}: a folder without images ({", ".join(IMG_EXTENSIONS)})')
            files += found
        elif item.is_file():
            files.append(item)
        else:
            raise UsageError(f'{item}: no such image file or folder')
    return files
