"""mmengine's checkpoints: written atomically (a temporary file, synced and renamed), read under torch >= 2.6 with a
weights-only load that also accepts exactly the types mmengine writes (any other global fails naming the file), and
the LV-ViT segmentation releases (mmseg 0.x layout) converted on reading (`released_segmentors`), so `load_from`,
`init_cfg` and tools/test_seg.py take them. Remote URLs keep mmengine's own loaders."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
from mmengine.fileio import LocalBackend, register_backend
from mmengine.fileio import io as fileio
from mmengine.logging.history_buffer import HistoryBuffer
from mmengine.runner import CheckpointLoader

from backbones.common.files import load_weights_only, write_bytes_atomic
from backbones.dense.released_segmentors import convert_mmseg0_release, is_mmseg0_release


def _history_buffer_method(owner: object, name: str) -> object:
    """The one use of `getattr` in mmengine's checkpoints: a HistoryBuffer's statistics methods, and nothing else."""
    if owner is not HistoryBuffer or name not in ('min', 'max', 'mean', 'current'):
        raise pickle.UnpicklingError(f'getattr({owner!r}, {name!r}) is not part of an mmengine checkpoint')
    return getattr(HistoryBuffer, name)


def mmengine_checkpoint_globals() -> list[object]:
    """The non-tensor globals of mmengine's checkpoints: its log buffers (and their methods), NumPy arrays."""
    dtypes = {type(np.dtype(t)) for t in (np.float64, np.float32, np.int64, np.int32, np.bool_)}
    # NumPy's array and scalar rebuilders, taken from the public pickling protocol rather than its private modules
    _reconstruct, scalar = np.empty(0).__reduce__()[0], np.float64(0).__reduce__()[0]
    return [HistoryBuffer, (_history_buffer_method, 'builtins.getattr'), np.ndarray, np.dtype, _reconstruct, scalar,
            *dtypes]


def plain_values(value: object) -> object:
    """A config's value as plain dicts, lists, tuples (mmcv's sizes must stay tuples), strings and numbers, which a
    checkpoint read weights-only may hold: a ConfigDict becomes a dict, anything else its text."""
    if isinstance(value, dict):
        return {key: plain_values(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return (tuple if isinstance(value, tuple) else list)(plain_values(item) for item in value)
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


def load_local_checkpoint(filename: str, map_location: str | None = None) -> dict:
    """mmengine's local-file loader, weights-only with mmengine's types allowed; a reference release converted."""
    checkpoint = load_weights_only(Path(filename).expanduser(), 'checkpoint', mmengine_checkpoint_globals(),
                                   map_location=map_location)
    weights = checkpoint.get('state_dict') if isinstance(checkpoint, dict) else None
    if isinstance(weights, dict) and is_mmseg0_release(weights):
        checkpoint = {**checkpoint, 'state_dict': convert_mmseg0_release(weights)}
    return checkpoint


class AtomicLocalBackend(LocalBackend):
    """mmengine's local file backend whose writes are atomic (temporary file, fsync, rename)."""

    def put(self, obj: bytes, filepath: str | Path) -> None:
        Path(filepath).parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(filepath, obj)


CheckpointLoader.register_scheme(prefixes='', loader=load_local_checkpoint, force=True)
register_backend('local', AtomicLocalBackend, force=True, prefixes='')
# get_file_backend caches one instance per prefix: drop local ones made before the registration.
for _key in [k for k, v in fileio.backend_instances.items() if type(v) is LocalBackend]:
    del fileio.backend_instances[_key]
