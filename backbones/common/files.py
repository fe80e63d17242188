"""Files written atomically: a reader, or a kill at any moment, finds the old file or the new one, never half of one."""
from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import pickle
import re
import shutil
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import torch
from safetensors import SafetensorError

from backbones.common.errors import CheckpointError, CheckpointReadError

TMP_MARK = '.tmp'  # a file being written is `.NAME.tmpPID` beside NAME until it is renamed over NAME


def write_atomic(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """`write(file)` on a temporary file beside `path`, synced and renamed over it (a failed write leaves `path`)."""
    path = Path(path)
    tmp = path.with_name(f'.{path.name}{TMP_MARK}{os.getpid()}')
    try:
        with open(tmp, 'wb') as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno is not None:
            raise OSError(e.errno, e.strerror, str(path)) from e  # the file that could not be written, not its temp
        raise


class _KeepsWriteErrors:
    """A file whose failed write is kept: torch.save reports it as a RuntimeError that no longer says why."""

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.error = file, None

    def write(self, data: bytes) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.file.flush()


def save_atomic(obj: object, path: str | Path) -> None:
    """torch.save, atomically; a write that fails raises its own OSError (ENOSPC: the disk is full)."""

    def save(f: BinaryIO) -> None:
        file = _KeepsWriteErrors(f)
        try:
            torch.save(obj, file)
        except RuntimeError:
            if file.error is not None:
                raise file.error from None
            raise

    write_atomic(path, save)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    write_atomic(path, lambda f: f.write(data))


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def write_json_atomic(path: str | Path, obj: object) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2) + '\n')


class FolderAdditions:
    """What is added to `folder` from now on (with the folder itself where new), for `remove` to take back."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.made = next((part for part in reversed((self.folder, *self.folder.parents)) if not part.exists()), None)
        self.before = set() if self.made is not None else set(self.folder.iterdir())

    def remove(self) -> None:
        for entry in [self.made] if self.made is not None else set(self.folder.iterdir()) - self.before:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def remove_partial_writes(folder: str | Path) -> None:
    """Delete the temporary files that writes interrupted by a kill left in `folder` (`.last.pth.tmp123`, ...)."""
    for leftover in Path(folder).glob(f'.*{TMP_MARK}*'):
        if leftover.is_file() and leftover.name.rsplit(TMP_MARK, 1)[1].isdigit():
            leftover.unlink(missing_ok=True)


READY = 'READY'  # the mark of a folder written whole: the version of what wrote it


def ready_mark(root: str | Path) -> str:
    """What the READY mark of a folder written whole says (its version), '' without one."""
    mark = Path(root) / READY
    return mark.read_text() if mark.is_file() else ''


def write_folder_once(root: str | Path, version: str, write: Callable[[Path], object]) -> Path:
    """`root` filled by `write(folder)` unless its READY mark says `version`: built beside it, renamed (never half)."""
    root = Path(root)
    if ready_mark(root) == version:
        return root
    staging = root.with_name(f'.{root.name}{TMP_MARK}{os.getpid()}')
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    write(staging)
    (staging / READY).write_text(version)
    if ready_mark(root) == version:  # another writer finished first
        shutil.rmtree(staging, ignore_errors=True)
    else:
        shutil.rmtree(root, ignore_errors=True)
        os.replace(staging, root)
    return root


# timm's training checkpoints (the LV-ViT and T2T-ViT releases) store the command line as an argparse.Namespace:
# plain data, safe to rebuild.
RELEASE_GLOBALS = (argparse.Namespace,)


@contextlib.contextmanager
def release_globals_allowed(extra: Sequence[object] = ()) -> Iterator[None]:
    """Weights-only loads inside also accept `RELEASE_GLOBALS` and `extra`. torch's safe_globals context removes on
    exit every global it was given, so only those not yet allowed are given to it."""
    allowed = torch.serialization.get_safe_globals()
    with torch.serialization.safe_globals([g for g in (*RELEASE_GLOBALS, *extra) if g not in allowed]):
        yield


def load_weights_only(path: str | Path, what: str = 'PyTorch checkpoint', allowed: Sequence[object] = (),
                      mmap: bool = False, map_location: str | None = 'cpu') -> object:
    """`torch.load(weights_only=True)` with the `allowed` globals, every failure naming the file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointReadError(f'{path}: {what} not found')
    check_torch_format(path, what)
    check_zip_checksums(path, what, file_version(path))
    try:
        with release_globals_allowed(allowed):
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        if MMENGINE_GLOBAL.search(str(exc)):
            raise CheckpointError(f'{path}: an mmengine checkpoint (a segmentor\'s, as tools/train_seg.py writes '
                                  f'them), not a {what}: tools/test_seg.py, predict_seg.py and export.py segmentor '
                                  f'take it') from exc
        raise CheckpointError(f'{path}: holds Python objects a weights-only load refuses, and loading them would run '
                              f'code from the file ({first_line(exc)}); if you trust it, re-save its tensors with '
                              f'torch.save()') from exc
    except KeyError as exc:  # torch's legacy reader on a file that only starts like a pickle
        raise CheckpointReadError(f'{path}: not a readable {what}, truncated or damaged (KeyError: {exc})') from exc
    except SafetensorError as exc:  # torch.load reads a file named .safetensors as one
        raise CheckpointReadError(f'{path}: not a readable safetensors file ({first_line(exc)}); a PyTorch '
                                  f'checkpoint under this name: rename it .pth') from exc
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError) as exc:
        raise CheckpointReadError(f'{path}: not a readable {what}, truncated or damaged ({type(exc).__name__}: '
                                  f'{first_line(exc)})') from exc


ZIP_MAGIC = b'PK\x03\x04'
PICKLE_PROTOCOL = b'\x80'  # torch's legacy format opens with a pickle's protocol marker
MMENGINE_GLOBAL = re.compile(r'\b(mmengine|mmseg|mmcv)\.')  # an unpickling error naming one of their classes
# What a file that is no checkpoint at all usually is, by its first bytes
NOT_CHECKPOINTS = ((b'version https://git-lfs', 'a git-lfs pointer, not the file itself: fetch it with `git lfs pull`'),
                   (b'<!doctype html', 'an HTML page (a download that fetched an error or login page?)'),
                   (b'<html', 'an HTML page (a download that fetched an error or login page?)'))


def check_torch_format(path: Path, what: str) -> None:
    """A file in neither of torch's formats is named for what it looks like, not as holding unsafe objects."""
    with open(path, 'rb') as f:
        head = f.read(64)
    if (head.startswith(ZIP_MAGIC) or head.startswith(PICKLE_PROTOCOL) or path.suffix == '.safetensors'
            or zipfile.is_zipfile(path)):
        return
    if not head:
        raise CheckpointReadError(f'{path}: an empty file, not a {what}')
    looks = next((kind for start, kind in NOT_CHECKPOINTS if head.lstrip().lower().startswith(start)), None)
    if looks is None:
        try:
            head.decode('utf-8')
            looks = 'a text file'
        except UnicodeDecodeError:
            looks = 'no format torch writes'
    raise CheckpointReadError(f'{path}: not a {what}: {looks}')


def file_version(path: Path) -> tuple[int, ...]:
    """A file's device, inode, size and modification time: another after a rename over it or a rewrite."""
    stat = path.stat()
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


# The tools read a checkpoint several times (its settings, classes, weights): each version of a file is read whole
# for its checksums once.
@functools.lru_cache(maxsize=64)
def check_zip_checksums(path: Path, what: str, version: tuple[int, ...]) -> None:
    """A file in torch's zip format (`version`: `file_version`'s) matches the CRC-32 its zip records for every member
    (torch.load does not check them), else a CheckpointReadError naming it; legacy files record none and pass."""
    with open(path, 'rb') as f:
        head = f.read(len(ZIP_MAGIC))
    if head != ZIP_MAGIC and not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()  # reads every member, 1 MiB at a time, and compares its CRC-32
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise CheckpointReadError(f'{path}: not a readable {what}, truncated or damaged ({type(exc).__name__}: '
                                  f'{first_line(exc)})') from exc
    if damaged is not None:
        raise CheckpointReadError(f'{path}: damaged: {damaged} does not match the checksum (CRC-32) written with it; '
                                  f'the file changed after it was saved (a disk or copy error): use another copy')


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes (hex), read once for each version of the file."""
    return _file_sha256(path, file_version(path))


@functools.lru_cache(maxsize=64)
def _file_sha256(path: Path, version: tuple[int, ...]) -> str:
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [''])[0]
