"""Millions of file paths held in three NumPy arrays instead of millions of Python objects.

A forked DataLoader worker that reads a Python object writes its reference count (and the garbage collector writes
every container's header), so a list of path strings becomes each worker's own copy (about 230 MB per worker at
ImageNet's size). A `PathList` is a byte buffer, its strings' offsets and a sorted table of their 64-bit hashes:
pages that workers only read, so they stay shared with the process that forked them."""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

ENCODING = ('utf-8', 'surrogateescape')  # file names are the file system's bytes, undecodable ones included


def path_hash(encoded: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(encoded, digest_size=8).digest(), 'little')


class PathList(Sequence[str]):
    """An immutable list of strings, packed; `find` gives the positions of many strings at once."""

    def __init__(self, paths: Iterable[str] = ()) -> None:
        encoded = [path.encode(*ENCODING) for path in paths]
        self.offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=self.offsets[1:])
        self.buffer = np.frombuffer(b''.join(encoded), dtype=np.uint8)
        self._hashes: np.ndarray | None = None  # sorted hashes of the strings, and their positions
        self._order: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def encoded(self, i: int) -> bytes:
        return self.buffer[self.offsets[i]:self.offsets[i + 1]].tobytes()

    def __getitem__(self, i):
        if isinstance(i, slice):
            return PathList(self[j] for j in range(len(self))[i])
        if not -len(self) <= i < len(self):
            raise IndexError(f'PathList index {i} out of range ({len(self)} paths)')
        return self.encoded(i % len(self)).decode(*ENCODING)

    def __iter__(self) -> Iterator[str]:
        data = self.buffer.tobytes()
        for start, stop in zip(self.offsets[:-1].tolist(), self.offsets[1:].tolist()):
            yield data[start:stop].decode(*ENCODING)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PathList):
            return np.array_equal(self.offsets, other.offsets) and np.array_equal(self.buffer, other.buffer)
        return isinstance(other, Sequence) and not isinstance(other, str) and list(self) == list(other)

    __hash__ = None  # mutable-looking equality: not a dict key

    def __repr__(self) -> str:
        return f'PathList({len(self)} paths)'

    def _table(self) -> tuple[np.ndarray, np.ndarray]:
        if self._hashes is None:
            hashes = np.fromiter((path_hash(self.encoded(i)) for i in range(len(self))), dtype=np.uint64,
                                 count=len(self))
            self._order = np.argsort(hashes, kind='stable')
            self._hashes = hashes[self._order]
        return self._hashes, self._order

    def position(self, path: str) -> int:
        hashes, order = self._table()
        encoded = path.encode(*ENCODING)
        key = np.uint64(path_hash(encoded))
        for j in range(np.searchsorted(hashes, key, 'left'), np.searchsorted(hashes, key, 'right')):
            if self.encoded(int(order[j])) == encoded:  # equal hashes of different paths are told apart here
                return int(order[j])
        return -1

    def find(self, paths: Sequence[str]) -> np.ndarray:
        """The position of each of `paths` here (-1 for those absent), at once where `paths` is this very list."""
        if isinstance(paths, PathList) and paths == self:
            return np.arange(len(self), dtype=np.int64)
        return np.fromiter((self.position(path) for path in paths), dtype=np.int64, count=len(paths))

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and self.position(path) >= 0

    def __getstate__(self) -> dict:
        return {'offsets': self.offsets, 'buffer': self.buffer, '_hashes': None, '_order': None}  # rebuilt on use
