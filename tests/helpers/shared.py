"""What several test files build the same way (written data, a trained tiny checkpoint), built once per test session
and shared by every pytest-xdist worker: the first worker to ask builds it under a lock, the others wait for it and
read it. A shared folder is read, never changed: a test that changes one works on its own copy."""
from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

DONE = '.built'


def shared_root(factory: pytest.TempPathFactory) -> Path:
    """The folder every worker of this session sees: the session's base temporary folder (its workers' folders lie
    in it under pytest-xdist)."""
    base = factory.getbasetemp()
    return (base.parent if os.environ.get('PYTEST_XDIST_WORKER') else base) / 'shared'


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """The folder `name`, filled by `build(folder)` once per session (again where a build failed part-way)."""
    root = shared_root(factory)
    root.mkdir(exist_ok=True)
    folder = root / name
    with open(root / f'{name}.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (folder / DONE).exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / DONE).touch()
    return folder
