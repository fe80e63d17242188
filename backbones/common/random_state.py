"""The random streams of a run: seeding, capturing and restoring every generator (Python, NumPy, torch, CUDA) or
torch's alone, and blocks that leave them as they were. Classification checkpoints hold `rng_state()`, segmentation
checkpoints `torch_rng_state()` (mmengine seeds the others itself)."""
from __future__ import annotations

import contextlib
import hashlib
import random
from collections.abc import Iterator

import numpy as np
import torch


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def hash_seed(*values: int) -> int:
    """A seed for Python, NumPy and torch (below 2**32) drawn from integers: each tuple its own stream."""
    digest = hashlib.sha256(','.join(map(str, values)).encode()).digest()
    return int.from_bytes(digest[:4], 'little')


def batch_generator(seed: int | None, device: torch.device | str) -> torch.Generator | None:
    """A generator on `device` seeded with `seed` (a batch's own draws, wherever and whenever made), or None."""
    return None if seed is None else torch.Generator(device).manual_seed(seed)


def seed_sample(*key: int) -> None:
    """Python's, NumPy's and torch's CPU streams seeded from a sample's `key` (seed, epoch, index)."""
    seed = hash_seed(*key)
    random.seed(seed)
    np.random.seed(seed)
    torch.default_generator.manual_seed(seed)


@contextlib.contextmanager
def cpu_streams_kept() -> Iterator[None]:
    """Python's, NumPy's and torch's CPU streams put back after the block (0.25 ms: once a batch, not a sample)."""
    state = random.getstate(), np.random.get_state(), torch.default_generator.get_state()
    try:
        yield
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])
        torch.default_generator.set_state(state[2])


@contextlib.contextmanager
def sample_streams(*key: int) -> Iterator[None]:
    """A block drawing from `seed_sample(*key)`'s streams; the process's own are put back after it."""
    with cpu_streams_kept():
        seed_sample(*key)
        yield


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


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Run a block without changing the random streams a run continues with (Python, NumPy, torch, CUDA)."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


def torch_rng_state() -> dict:
    """torch's generator states alone (CPU, and CUDA's where there is a GPU)."""
    state = {'cpu': torch.get_rng_state()}
    if torch.cuda.is_available():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_torch_rng_state(state: dict) -> None:
    torch.set_rng_state(state['cpu'])
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])
