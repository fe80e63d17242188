"""A process's memory as Linux accounts it: private (USS) and proportional (PSS) set sizes, and its children.

USS counts only the pages the process has to itself; of those, the dirty ones (`dirty`: copy-on-write copies, its
own heap) are what a forked loader worker adds to a machine's memory (the clean ones include file pages that the
page cache holds once and can drop)."""
from __future__ import annotations

import contextlib
import ctypes
import gc
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Memory:
    """Bytes: resident (RSS), private (USS: private clean + private dirty), proportional (PSS) and private dirty."""

    rss: int
    uss: int
    pss: int
    dirty: int


def process_memory(pid: int | None = None) -> Memory:
    """The memory of process `pid` (default: this one) from /proc/PID/smaps_rollup (Linux 4.14+)."""
    fields = {}
    for line in Path(f'/proc/{pid or os.getpid()}/smaps_rollup').read_text().splitlines()[1:]:
        name, _, value = line.partition(':')
        parts = value.split()
        if len(parts) == 2 and parts[1] == 'kB':
            fields[name] = int(parts[0]) * 1024
    return Memory(fields['Rss'], fields['Private_Clean'] + fields['Private_Dirty'], fields['Pss'],
                  fields['Private_Dirty'])


def child_pids(pid: int | None = None) -> list[int]:
    pid = pid or os.getpid()
    children: list[int] = []
    for task in Path(f'/proc/{pid}/task').iterdir():
        try:
            children += [int(child) for child in (task / 'children').read_text().split()]
        except OSError:  # a thread that ended meanwhile
            continue
    return children


class ChildMemory:
    """The memory of this process's children started after it was made, at the first and the last `sample` of each."""

    def __init__(self) -> None:
        self.first: dict[int, Memory] = {}
        self.last: dict[int, Memory] = {}
        self.earlier = set(child_pids())  # children of other work (a server, an earlier loader's)

    def sample(self) -> None:
        for pid in set(child_pids()) - self.earlier:
            try:
                memory = process_memory(pid)
            except OSError:  # a child that has just ended
                continue
            self.first.setdefault(pid, memory)
            self.last[pid] = memory

    def growth(self) -> dict[int, int]:
        """Private dirty bytes each child gained between its first and last sample."""
        return {pid: self.last[pid].dirty - self.first[pid].dirty for pid in self.first}


def release_free_memory() -> None:
    """Give the heap's free pages back to the system (glibc's `malloc_trim`) before loader workers fork: a worker
    allocating into its parent's free pages copies each (115 MB a worker after the tar listing)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL(None).malloc_trim(0)
