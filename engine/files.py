"""Files written atomically: a reader, or a kill at any moment, finds the old file or the new one, never half of one."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import BinaryIO, Callable

import torch

TMP_MARK = '.tmp'  # a file being written is `.NAME.tmpPID` beside NAME until it is renamed over NAME


def write_atomic(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """Call `write(file)` on a temporary file beside `path`, sync it to disk, then rename it over `path`."""
    path = Path(path)
    tmp = path.with_name(f'.{path.name}{TMP_MARK}{os.getpid()}')
    with open(tmp, 'wb') as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_atomic(obj: object, path: str | Path) -> None:
    """torch.save, atomically."""
    write_atomic(path, lambda f: torch.save(obj, f))


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    write_atomic(path, lambda f: f.write(data))


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode())


def write_json_atomic(path: str | Path, obj: object) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2) + '\n')


def remove_partial_writes(folder: str | Path) -> None:
    """Delete the temporary files that writes interrupted by a kill left in `folder` (`.last.pth.tmp123`, ...)."""
    for leftover in Path(folder).glob(f'.*{TMP_MARK}*'):
        if leftover.is_file() and leftover.name.rsplit(TMP_MARK, 1)[1].isdigit():
            leftover.unlink(missing_ok=True)
