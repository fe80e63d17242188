"""Training checkpoints: written atomically, read with `weights_only=True`, carrying every RNG state."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import List, Optional

import numpy as np
import torch

from backbones import CheckpointError


def atomic_save(obj: object, path: str | Path) -> None:
    """torch.save to a temporary file in the same folder, fsync, then rename over `path`: never a torn file."""
    path = Path(path)
    tmp = path.with_name(f'.{path.name}.tmp{os.getpid()}')
    with open(tmp, 'wb') as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write a text file through a temporary file and a rename: readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(f'.{path.name}.tmp{os.getpid()}')
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json_atomic(path: str | Path, obj: object) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2) + '\n')


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """Python, NumPy, torch (and CUDA) generator states, as tensors and plain values (safe to load)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        'python': random.getstate(),
        'numpy': {'kind': kind, 'keys': torch.from_numpy(keys.astype(np.int64)), 'pos': int(pos),
                  'has_gauss': int(has_gauss), 'gauss': float(gauss)},
        'torch': torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state['python'])
    n = state['numpy']
    np.random.set_state((n['kind'], n['keys'].numpy().astype(np.uint32), n['pos'], n['has_gauss'], n['gauss']))
    torch.set_rng_state(state['torch'])
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])


def read_training_checkpoint(path: str | Path, mmap: bool = False) -> dict:
    """A checkpoint of ours, weights-only; with `mmap`, tensors are read only when used (for a look at its fields)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f'no checkpoint at {path}')
    try:
        return torch.load(path, map_location='cpu', weights_only=True, mmap=mmap)
    except Exception as e:
        raise CheckpointError(f'cannot read checkpoint {path}: {type(e).__name__}: {e}') from e


def checkpoint_classes(path: str | Path) -> Optional[List[str]]:
    """The class list a checkpoint of ours records (`args.classes`); None for other files (official releases)."""
    try:
        ckpt = read_training_checkpoint(path, mmap=True)
    except CheckpointError:  # not ours, or not readable: the weight loader reports a damaged file with its own error
        return None
    args = ckpt.get('args') if isinstance(ckpt, dict) else None
    classes = args.get('classes') if isinstance(args, dict) else None
    return list(classes) if isinstance(classes, (list, tuple)) else None
