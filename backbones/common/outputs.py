"""What a command will write, checked before any work: a file's folder there and writable, a folder not a file nor
under one; as argparse types (`output_file`, `png_file`, `output_folder`) and as checks."""
from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from backbones.common.errors import UsageError


def check_writable(path: str | Path) -> None:
    """A file a command will write: its folder exists and is writable, and the path is no folder."""
    if str(path).endswith(os.sep):
        raise UsageError(f'{path} names a folder (its trailing {os.sep}); give a file name to write')
    path = Path(path)
    if path.is_dir():
        raise UsageError(f'{path} is a folder; give a file name to write')
    if not path.parent.is_dir():
        raise UsageError(f'cannot write {path}: the folder {path.parent} does not exist')
    check_folder_writable(path.parent, path)


def _checked_argument(check: Callable[[str], None], value: str) -> None:
    """Run an output check on a command-line value: its UsageError becomes argparse's error for the option."""
    try:
        check(value)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def output_file(value: str) -> str:
    """argparse type of a file a command will write: checked (`check_writable`) before any work."""
    _checked_argument(check_writable, value)
    return value


def png_file(value: str) -> str:
    """argparse type of a PNG picture a command will write: named .png and checked as `output_file`, before any work."""
    if Path(value).suffix.lower() != '.png':
        raise argparse.ArgumentTypeError(f'{value}: give a .png file (the picture is written as PNG)')
    return output_file(value)


def output_folder(value: str) -> Path:
    """argparse type of a folder a command will create or fill: checked (`check_output_folder`) before any work."""
    _checked_argument(check_output_folder, value)
    return Path(value)


def check_output_folder(path: str | Path) -> None:
    """A folder a command will create or fill: no file, nor under one, and writable (or the nearest existing parent)."""
    path = Path(path)
    for part in (path, *path.parents):
        if part.exists() and not part.is_dir():
            raise UsageError(f'cannot use {path} as output folder: {part} is a file')
    check_folder_writable(next(part for part in (path, *path.parents) if part.exists()), path)


def check_folder_writable(folder: Path, target: Path) -> None:
    """Files can be made in `folder` (to write `target`), checked before the work: by access(2), then by a file made
    and removed (root may write anywhere by access(2), yet /proc takes no new file)."""
    if os.access(folder, os.W_OK | os.X_OK):
        try:
            with tempfile.NamedTemporaryFile(dir=folder, prefix='.write-check-'):
                return
        except OSError as e:
            raise UsageError(f'cannot write {target}: no file can be made in {folder} ({e.strerror}); give an output '
                             f'path elsewhere') from None
    read_only_fs = hasattr(os, 'statvfs') and os.statvfs(folder).f_flag & os.ST_RDONLY
    why = 'is on a read-only file system' if read_only_fs else 'is not writable by this user'
    raise UsageError(f'cannot write {target}: {folder} {why}; give an output path elsewhere')
