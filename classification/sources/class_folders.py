"""A split stored as class folders, `D/SPLIT/CLASS/*.JPEG` (ImageNet's layout): the default source, listed by
`backbones.common.images.scan_split` (every entry read or named), each image read from its file."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from backbones.common.errors import DataError
from backbones.common.images import TAR_SUFFIX, find_classes, scan_split, unread_tar_fix
from classification.sources.source import ImageSource, Listing, register_source


class FilesIn:
    """The images of a listing as files under the data folder."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    def open(self, index: int, name: str) -> Path:
        return self.data_dir / name

    def take(self, positions: Sequence[int] | np.ndarray) -> FilesIn:
        return self


def check_no_split_file(data_dir: Path, split: str) -> None:
    """A file that looks meant for the split (`train.tar.gz`, a file `train`) is named with what to do."""
    if not data_dir.is_dir() or (data_dir / split).is_dir():
        return
    kept_index = f'{split}{TAR_SUFFIX}.index.npz'  # of a tar since removed: nothing of the split
    found = sorted(p for p in data_dir.iterdir()
                   if (p.name == split or p.name.startswith(f'{split}.')) and p.name != kept_index)
    if found:
        what = unread_tar_fix(found[0].name) or 'neither a folder nor a .tar file'
        raise DataError(f'{found[0]}: {what}; the split {split} is read from the folder {data_dir / split} (class '
                        f'folders or tars) or the tar {data_dir / split}{TAR_SUFFIX} (docs/imagenet.md)')


@register_source
class ClassFolders(ImageSource):
    name = 'class folders'
    default = True  # any other folder: what is missing is named by the listing

    def list_split(self, data_dir: Path, split: str, classes: Sequence[str] | None,
                   classes_from: str) -> Listing:
        check_no_split_file(data_dir, split)
        found, samples = scan_split(data_dir, split, classes, classes_from)
        return Listing(found, samples, FilesIn(data_dir), data_dir / split)

    def split_classes(self, data_dir: Path, split: str) -> list[str]:
        check_no_split_file(data_dir, split)
        return find_classes(data_dir / split)
