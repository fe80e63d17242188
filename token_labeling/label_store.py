"""The token-label store: every image's top-k dense scores in one packed, memory-mapped file pair.

Layout of a store folder:
- `meta.json`: every value that shapes the store (annotator, its checkpoint and arguments, input size, the map
  grid (h, w), k, shard size, the class list, a hash of the image list) and the preprocessing;
- `paths.txt`: one image path per line, relative to the data folder; line i is row i;
- `scores.npy`: float16 (N, h, w, k), the annotator's top-k logits at every map position, best first;
- `classes.npy`: int16 (int32 past 32767 classes) (N, h, w, k), their class indices;
- `done/`: one marker per finished shard of rows, holding its row range and the SHA-256 of its rows, so an
  interrupted generation resumes where it stopped and the finished store is verified row by row.

The arrays are opened lazily with `np.load(mmap_mode='r')` in each process that reads them (data-loader
workers included), so no process holds the whole store in memory and nothing large is pickled.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

from backbones.errors import DataError

META, PATHS, SCORES, CLASSES, DONE = 'meta.json', 'paths.txt', 'scores.npy', 'classes.npy', 'done'


class TokenLabelError(DataError, RuntimeError):
    """A token-label store that is missing, incomplete, or has no row for an image."""


def class_index_dtype(num_classes: int) -> np.dtype:
    return np.dtype(np.int16 if num_classes <= np.iinfo(np.int16).max + 1 else np.int32)


def check_array(path: Path, shape: Tuple[int, ...]) -> None:
    """A store array must open (whole, not truncated) with the shape its meta data gives."""
    try:
        array = np.load(path, mmap_mode='r')
    except (ValueError, OSError, EOFError) as e:
        raise TokenLabelError(f'{path}: not a readable array ({e}); the store is damaged, generate it again') from e
    if array.shape != shape:
        raise TokenLabelError(f'{path}: shape {array.shape}, the store\'s meta data and image list say {shape}; '
                              f'the store is damaged, generate it again')


def shard_ranges(num_rows: int, shard_size: int) -> List[Tuple[int, int]]:
    return [(start, min(start + shard_size, num_rows)) for start in range(0, num_rows, shard_size)]


class TokenLabelStore:
    """Reads a store: `row_of(path)` and `read(row) -> (scores (h, w, k) float16, classes (h, w, k))`."""

    def __init__(self, root: str | Path) -> None:
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
        paths = (self.root / PATHS).read_text().splitlines()
        self.rows: Dict[str, int] = {path: row for row, path in enumerate(paths)}
        expected = (len(paths), *self.meta['grid'], self.meta['topk'])
        for name in (SCORES, CLASSES):
            check_array(self.root / name, expected)
        self._arrays: Tuple[np.ndarray, np.ndarray] | None = None

    @property
    def classes(self) -> List[str]:
        return list(self.meta['classes'])

    @property
    def num_classes(self) -> int:
        return self.meta['num_classes']

    @property
    def grid(self) -> Tuple[int, int]:
        return tuple(self.meta['grid'])

    def __len__(self) -> int:
        return len(self.rows)

    def __getstate__(self) -> dict:
        return {**self.__dict__, '_arrays': None}  # workers open their own memory maps

    def row_of(self, path: str) -> int:
        try:
            return self.rows[path]
        except KeyError:
            raise TokenLabelError(f'no token labels for image {path} in {self.root}: the store was generated for '
                                  f'other images; generate it for this data folder') from None

    def check_covers(self, paths: Sequence[str]) -> None:
        """Fail with the images (the first few and the count) that have no row."""
        missing = [path for path in paths if path not in self.rows]
        if missing:
            shown = ', '.join(missing[:5])
            raise TokenLabelError(f'{len(missing)} image(s) have no token labels in {self.root}, e.g. {shown}; '
                                  f'generate the labels for this data folder')

    def read(self, row: int) -> Tuple[np.ndarray, np.ndarray]:
        if self._arrays is None:
            self._arrays = (np.load(self.root / SCORES, mmap_mode='r'), np.load(self.root / CLASSES, mmap_mode='r'))
        scores, classes = self._arrays
        return np.array(scores[row]), np.array(classes[row])
