"""The token-label store: every image's top-k dense scores in one packed, memory-mapped file pair (`TokenLabelStore`,
`open_store`; written shard by shard by `StoreWriter`, `write_label_store`).

A store folder holds `meta.json`, `paths.txt` (line i names row i), `scores.npy` (float16 (N, h, w, k) top-k logits,
best first), `classes.npy` (their class indices), `extent.npy` where a map does not cover its whole image, `done/`
(one marker per finished shard, with its digests: generation resumes and an opened store is verified) and
`verified.json`. The arrays are opened lazily in each process that reads them: no process holds the whole store in
memory, and nothing large is pickled. docs/imagenet.md tells how a store is generated, verified and read."""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from backbones.common.distributed import DistInfo, barrier
from backbones.common.errors import DataError
from backbones.common.files import write_json_atomic
from backbones.common.log import logger
from classification.sources.path_list import PathList

META, PATHS, SCORES, CLASSES, EXTENT, DONE = 'meta.json', 'paths.txt', 'scores.npy', 'classes.npy', 'extent.npy', 'done'
VERIFIED = 'verified.json'
RACY_SECONDS = 2.0  # a file changed this recently may change again within its time stamp's resolution: no record
WHOLE_IMAGE = (-1.0, -1.0, 1.0, 1.0)  # the extent of a map that covers its whole image
DEFAULT_SHARD_SIZE = 4096  # rows a shard holds: the unit of resuming and of verification


class TokenLabelError(DataError, RuntimeError):
    """A token-label store that is missing, incomplete, or has no row for an image."""


def check_array(path: Path, shape: tuple[int, ...]) -> None:
    """A store array must open (whole, not truncated) with the shape its meta data gives."""
    try:
        array = np.load(path, mmap_mode='r')
    except (ValueError, OSError, EOFError) as e:
        raise TokenLabelError(f'{path}: not a readable array ({e}); the store is damaged, generate it again') from e
    if array.shape != shape:
        raise TokenLabelError(f'{path}: shape {array.shape}, the store\'s meta data and image list say {shape}; '
                              f'the store is damaged, generate it again')


def shard_ranges(num_rows: int, shard_size: int) -> list[tuple[int, int]]:
    return [(start, min(start + shard_size, num_rows)) for start in range(0, num_rows, shard_size)]


def list_digest(paths: Sequence[str]) -> str:
    """SHA-256 of an image list as `paths.txt` holds it (one path a line)."""
    return hashlib.sha256('\n'.join(paths).encode('utf-8', 'surrogateescape')).hexdigest()


def read_paths(root: Path) -> list[str]:
    """The store's image list: only the line feed ends a line (`splitlines` would break at U+2028); names are the
    file system's bytes (surrogate escapes), so a Latin-1 name is found again."""
    return (root / PATHS).read_text(encoding='utf-8', errors='surrogateescape').split('\n')[:-1]


def rows_digest(arrays: Sequence[np.ndarray], start: int, stop: int) -> str:
    """SHA-256 of rows start..stop-1 of the store's arrays (scores, classes, and extent where there is one)."""
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.ascontiguousarray(array[start:stop]).tobytes())
    return digest.hexdigest()


def shard_marker(root: Path, index: int) -> Path:
    return root / DONE / f'{index:06d}'


def read_marker(path: Path) -> dict | None:
    """A shard's marker, or None when it is absent or unreadable (a shard killed while marking is redone)."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def store_arrays(root: Path, mode: str = 'r') -> list[np.ndarray]:
    """The store's row arrays, memory-mapped: scores, classes, and extent where the store has one."""
    names = [SCORES, CLASSES] + ([EXTENT] if (root / EXTENT).exists() else [])
    return [np.load(root / name, mmap_mode=mode) for name in names]


def verify_rows(root: Path, paths: Sequence[str], shard_size: int, arrays: Sequence[np.ndarray], fix: str,
                unwritten_fix: str | None = None) -> list[str]:
    """Every shard marked done, with the digests its rows (and its lines of `paths.txt`) have now; returns the paths
    the markers list as skipped. `fix` (`unwritten_fix` for a shard not marked) ends each error message."""
    shards = shard_ranges(len(paths), shard_size)

    def check(i: int) -> list[str]:
        start, stop = shards[i]
        marker = read_marker(shard_marker(root, i))
        if marker is None:
            raise TokenLabelError(f'{root}: rows {start}-{stop - 1} were not written (shard {i}); '
                                  f'{unwritten_fix or fix}')
        if 'paths_sha256' in marker and marker['paths_sha256'] != list_digest(paths[start:stop]):
            raise TokenLabelError(f'{root / PATHS}: lines {start + 1}-{stop} are not the image list the rows were '
                                  f'written for (shard {i}); {fix}')
        if marker['rows'] != [start, stop] or marker['sha256'] != rows_digest(arrays, start, stop):
            raise TokenLabelError(f'{root}: rows {start}-{stop - 1} do not match what was written (shard {i}); {fix}')
        return list(marker.get('unreadable', []))

    with ThreadPoolExecutor(max_workers=4) as pool:
        return [path for skipped in pool.map(check, range(len(shards))) for path in skipped]


DAMAGED = 'the store changed after it was made (copied incompletely, or edited): copy or generate it again'


def file_stamps(root: Path) -> dict[str, list[int]]:
    """Size, modification time (ns) and inode of each file the verification reads."""
    names = [name for name in (META, PATHS, SCORES, CLASSES, EXTENT) if (root / name).exists()]
    names += sorted(f'{DONE}/{f.name}' for f in (root / DONE).iterdir() if not f.name.startswith('.')) \
        if (root / DONE).is_dir() else []
    return {name: [(st := (root / name).stat()).st_size, st.st_mtime_ns, st.st_ino] for name in names}


def record_verification(root: Path, stamps: dict[str, list[int]]) -> None:
    """Remember that the store verified with these files, unless one changed within RACY_SECONDS or it is read-only."""
    newest = max(mtime for _, mtime, _ in stamps.values())
    if time.time_ns() - newest < RACY_SECONDS * 1e9:
        return
    try:
        write_json_atomic(root / VERIFIED, {'files': stamps})
    except OSError as e:
        logger.info(f'{root}: cannot record its verification ({e.strerror}): the next start reads it again')


class TokenLabelStore:
    """Reads a store by image path (`row_of`, `rows_of`, `read`, `extent`, `has_map`); opening it verifies it against
    its own record unless `verified.json` shows these files verified, or `verify=False`."""

    def __init__(self, root: str | Path, verify: bool = True) -> None:
        self.root = Path(root)
        for name in (META, PATHS, SCORES, CLASSES):
            if not (self.root / name).is_file():
                raise TokenLabelError(f'token-label store {self.root}: {name} is missing '
                                      f'(generate it with tools/generate_token_labels.py)')
        try:
            self.meta = json.loads((self.root / META).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise TokenLabelError(f'{self.root / META}: not readable JSON ({e}); generate the store again') from e
        if not self.meta.get('complete', False):
            raise TokenLabelError(f'token-label store {self.root} is incomplete: run tools/generate_token_labels.py '
                                  f'again with the same arguments to finish it')
        if 'classes' not in self.meta:
            raise TokenLabelError(f'{self.root / META} has no class list (an older store): generate it again')
        paths = read_paths(self.root)
        expected = (len(paths), *self.meta['grid'], self.meta['topk'])
        for name in (SCORES, CLASSES):
            check_array(self.root / name, expected)
        if (self.root / EXTENT).exists():
            check_array(self.root / EXTENT, (len(paths), 4))
        self.verified_now = False  # whether opening it read every row (not a recorded verification)
        if verify:
            self.verify(paths)
        self.paths = PathList(paths)
        del paths
        self.mapped = np.ones(len(self.paths), dtype=bool)  # False: an empty row (unreadable, or missing at import)
        empty = self.meta.get('unreadable', []) + self.meta.get('missing', [])
        if empty:
            rows = self.paths.find(empty)
            self.mapped[rows[rows >= 0]] = False
        self._arrays: list[np.ndarray] | None = None

    def verify(self, paths: list[str]) -> None:
        """The image list and every row as written (`verify_rows`), unless `verified.json` records these files."""
        stamps = file_stamps(self.root)
        if (read_marker(self.root / VERIFIED) or {}).get('files') == stamps:
            logger.info(f'{self.root}: token-label store verified earlier ({VERIFIED} matches its files)')
            return
        fix = f'{DAMAGED}, or pass --no-verify to train on it as it is'
        start = time.perf_counter()
        verify_rows(self.root, paths, self.meta['shard_size'], store_arrays(self.root), fix)  # names the shard
        if 'paths_sha256' in self.meta and list_digest(paths) != self.meta['paths_sha256']:  # an older store's markers
            raise TokenLabelError(f'{self.root / PATHS} is not the image list the store was made for; {fix}')
        self.verified_now = True
        logger.info(f'{self.root}: token-label store verified ({len(paths)} rows, {time.perf_counter() - start:.1f} s)')
        record_verification(self.root, stamps)

    @property
    def classes(self) -> list[str]:
        return list(self.meta['classes'])

    @property
    def num_classes(self) -> int:
        return self.meta['num_classes']

    @property
    def grid(self) -> tuple[int, int]:
        return tuple(self.meta['grid'])

    def __len__(self) -> int:
        return len(self.paths)

    def __getstate__(self) -> dict:
        return {**self.__dict__, '_arrays': None}  # workers open their own memory maps

    def row_of(self, path: str) -> int:
        row = self.paths.position(path)
        if row < 0:
            raise TokenLabelError(f'no token labels for image {path} in {self.root}: the store was generated for '
                                  f'other images; generate it for this data folder')
        return row

    def rows_of(self, paths: Sequence[str]) -> np.ndarray:
        """The row of each image; fails with the images (the first few and the count) that have none."""
        rows = self.paths.find(paths)
        missing = np.flatnonzero(rows < 0)
        if len(missing):
            shown = ', '.join(paths[i] for i in missing[:5])
            raise TokenLabelError(f'{len(missing)} image(s) have no token labels in {self.root}, e.g. {shown}; '
                                  f'generate the labels for this data folder')
        return rows

    def arrays(self) -> list[np.ndarray]:
        """The row arrays, memory-mapped on first use in each process."""
        if self._arrays is None:
            self._arrays = store_arrays(self.root)
        return self._arrays

    def read(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        scores, classes = self.arrays()[:2]
        return np.array(scores[row]), np.array(classes[row])

    def extent(self, row: int) -> np.ndarray:
        """The box row's map covers in whole-image [-1, 1] coordinates (x1, y1, x2, y2)."""
        arrays = self.arrays()
        return np.array(arrays[2][row] if len(arrays) > 2 else WHOLE_IMAGE, dtype=np.float32)

    def has_map(self, row: int) -> bool:
        """False for the rows the store holds empty (images unreadable at generation, missing at import)."""
        return bool(self.mapped[row])


def open_store(root: str | Path, verify: bool, info: DistInfo) -> TokenLabelStore:
    """The store for a training process: with `verify`, the first process of each node checks it (or finds its
    record) while the others wait, then they open it unchecked; 64 processes read 8 GB once per node, not 64 times."""
    if not info.distributed:
        return TokenLabelStore(root, verify)
    store = TokenLabelStore(root, verify) if verify and info.local_rank == 0 else None
    barrier(info)
    return store or TokenLabelStore(root, verify=False)


def read_meta(root: Path) -> dict | None:
    if not (root / META).exists():
        return None
    try:
        return json.loads((root / META).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TokenLabelError(f'{root / META}: not readable JSON ({e}); delete {root} and make the store again') from e


# Shaping values older stores do not record, and what they were made with: such a store is finished only with it.
UNRECORDED = {'amp': 'none'}


def _describe(key: str, value) -> str:
    if key == 'classes':
        return f'{len(value)} classes'
    return 'another image list' if key == 'paths_sha256' else f'{key}={value!r}'


def create_arrays(root: Path, arrays: Sequence[tuple[str, np.dtype, tuple[int, ...]]]) -> None:
    """Zeroed .npy files of (name, dtype, shape), taken on the disk now: a full disk is an OSError, not a SIGBUS."""
    made: list[Path] = []
    try:
        for name, dtype, shape in arrays:
            made.append(root / name)
            np.lib.format.open_memmap(root / name, 'w+', dtype, shape).flush()
            if hasattr(os, 'posix_fallocate'):
                with open(root / name, 'r+b') as f:
                    os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
    except OSError as e:
        for path in made:
            path.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(made[-1])) from e


class StoreWriter:
    """Writes a store shard by shard, resumably (each process every world_size-th shard not yet done); an existing
    store must have the same `shaping` values; `finish` marks it complete once every shard verifies."""

    def __init__(self, root: Path, meta: dict, paths: list[str], shaping: Sequence[str], info: DistInfo,
                 with_extent: bool = False, skipped_key: str = 'unreadable') -> None:
        self.root, self.meta, self.paths, self.info, self.skipped_key = root, meta, paths, info, skipped_key
        odd = next((path for path in paths if '\n' in path or '\r' in path), None)
        if odd is not None:
            raise DataError(f'{odd!r}: a file name with a line break cannot be listed in {PATHS}; rename it')
        shape = (len(paths), *meta['grid'], meta['topk'])
        if info.is_main:
            old = read_meta(root)
            root.mkdir(parents=True, exist_ok=True)
            (root / DONE).mkdir(exist_ok=True)
            if old is not None:
                self._check_same_store(old, shaping)
                for name in (SCORES, CLASSES):
                    check_array(root / name, shape)
            else:
                classes = np.int16 if meta['num_classes'] <= np.iinfo(np.int16).max + 1 else np.int32
                arrays = [(SCORES, np.float16, shape), (CLASSES, classes, shape)]
                create_arrays(root, arrays + ([(EXTENT, np.float32, (len(paths), 4))] if with_extent else []))
                (root / PATHS).write_text('\n'.join(paths) + '\n', encoding='utf-8', errors='surrogateescape')
                write_json_atomic(root / META, {**meta, 'complete': False})
        barrier(info)
        self.arrays = store_arrays(root, 'r+')
        self.shards = shard_ranges(len(paths), meta['shard_size'])

    def _check_same_store(self, old: dict, shaping: Sequence[str]) -> None:
        old = {**UNRECORDED, **old}
        changed = [k for k in shaping if old.get(k) != self.meta[k]]
        if changed:
            was = ', '.join(_describe(k, old.get(k)) for k in changed)
            now = ', '.join(_describe(k, self.meta[k]) for k in changed)
            raise TokenLabelError(f'{self.root} holds labels made with {was}; this run gives {now}: rerun with the '
                                  f'store\'s values to finish it, or use another --output')

    def todo(self) -> list[tuple[int, int, int]]:
        """(shard, first row, end row) of this process's shards not yet done."""
        info = self.info
        return [(i, *self.shards[i]) for i in range(info.rank, len(self.shards), info.world_size)
                if read_marker(shard_marker(self.root, i)) is None]

    def write(self, rows: np.ndarray, *values: np.ndarray) -> None:
        """Rows' scores, classes (and extents, in a store that has them)."""
        if len(values) != len(self.arrays):
            raise ValueError(f'{len(values)} arrays of values for a store of {len(self.arrays)} arrays')
        for array, value in zip(self.arrays, values):
            array[rows] = value

    def write_empty(self, rows: np.ndarray) -> None:
        """Rows without a map: zero scores and classes, and the whole image as their extent."""
        self.write(rows, 0, 0, *([WHOLE_IMAGE] if len(self.arrays) > 2 else []))

    def mark(self, shard: int, skipped: list[str]) -> None:
        """Shard `shard` is written: flush its rows, record their digests and the paths it `skipped`."""
        for array in self.arrays:
            array.flush()
        start, stop = self.shards[shard]
        marker = {'rows': [start, stop], 'sha256': rows_digest(self.arrays, start, stop),
                  'paths_sha256': list_digest(self.paths[start:stop]), 'unreadable': skipped}
        write_json_atomic(shard_marker(self.root, shard), marker)

    def finish(self) -> dict:
        """Verify every shard and mark the store complete (main process); the meta data, on every process."""
        barrier(self.info)
        if self.info.is_main:
            if read_paths(self.root) != self.paths:
                raise TokenLabelError(f'{self.root / PATHS}: the stored image list does not match this data folder')
            self.meta[self.skipped_key] = verify_rows(
                self.root, self.paths, self.meta['shard_size'], self.arrays,
                'the store is damaged, delete it and make it again', unwritten_fix='run again to finish')
            write_json_atomic(self.root / META, {**self.meta, 'complete': True})
        barrier(self.info)
        return read_meta(self.root)


@dataclass(frozen=True)
class StoreRows:
    """Rows of a store to write: `rows` with their `values`, and the rows left `empty`."""

    rows: np.ndarray
    values: tuple[np.ndarray, ...] = ()
    empty: Sequence[int] = ()


def write_label_store(root: Path, meta: dict, paths: list[str], shaping: Sequence[str], info: DistInfo,
                      shard_rows: Callable[[int, int], Iterable[StoreRows]], with_extent: bool = False,
                      skipped_key: str = 'unreadable', progress: str | None = None) -> dict:
    """Write (or finish) the store of `paths` in `root` from `shard_rows`, the one way every store is written; then
    verify it and mark it complete."""
    writer = StoreWriter(root, meta, paths, shaping, info, with_extent, skipped_key)
    todo = writer.todo()
    bar = tqdm(total=sum(stop - start for _, start, stop in todo), desc=f'{progress} (rank {info.rank})', unit='row',
               disable=progress is None or not info.is_main, dynamic_ncols=True)
    for shard, start, stop in todo:
        skipped: list[str] = []
        for part in shard_rows(start, stop):
            if len(part.empty):
                writer.write_empty(np.asarray(part.empty, dtype=np.int64))
                skipped += [paths[row] for row in part.empty]
            if len(part.rows):
                writer.write(part.rows, *part.values)
            bar.update(len(part.rows) + len(part.empty))
        writer.mark(shard, skipped)
    bar.close()
    return writer.finish()


def label_store_complete(labels_dir: Path) -> bool:
    return (labels_dir / META).is_file() and json.loads((labels_dir / META).read_text()).get('complete', False)
