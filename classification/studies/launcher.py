"""Training commands run by the studies and read as they log: tools/train_cls.py (alone, or torchrun's workers) and
timm's train.py, their update lines read with one parser each, their pace timed in a steady-state window, and the
whole run stopped at the end (every process under it, in whatever session or group it started)."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from backbones.common.errors import DataError, UsageError
from classification.engine.fit import update_of_step_line
from classification.engine.memory import child_pids
from classification.studies.timing import SteadyWindow

ROOT = Path(__file__).resolve().parents[2]  # the repository: its tools are what is run
TRAIN_CLS = ROOT / 'tools' / 'train_cls.py'
TIMM_STEP_LINE = re.compile(r'Train: (\d+) \[\s*(\d+)/(\d+)')  # timm's: epoch, update in the epoch (from 0), updates


def update_of_timm_line(line: str) -> int | None:
    """The run's update count (from 1) a timm train.py log line reports, or None."""
    found = TIMM_STEP_LINE.search(line)
    return None if found is None else int(found[1]) * int(found[3]) + int(found[2]) + 1


def train_cls_command(args: Sequence[str], processes: int | None = None) -> list[str]:
    """tools/train_cls.py with `args`, alone (`processes` None) or as `processes` workers under torchrun, whose
    rendezvous takes a port the operating system gives (`--standalone`: no fixed port another job could hold)."""
    launcher = ['-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', str(processes)]
    return [sys.executable, *(launcher if processes is not None else []), str(TRAIN_CLS), *map(str, args)]


def process_tree(pid: int) -> list[int]:
    """Process `pid` and every process below it: its children, theirs, and so on (none once it has gone)."""
    try:
        children = child_pids(pid)
    except OSError:
        return []
    return [pid, *(p for child in children for p in process_tree(child))]


def running(pid: int) -> bool:
    """Whether process `pid` exists and has not ended (a zombie, whose status its parent has not read, has)."""
    try:
        return Path(f'/proc/{pid}/stat').read_text().rpartition(')')[2].split()[0] != 'Z'
    except OSError:
        return False


def kill_process_tree(pid: int, timeout: float = 30.0) -> None:
    """SIGKILL to process `pid` and everything below it, in whatever group each started (torchrun starts every worker
    in a session of its own; loader workers are in their trainer's group), and wait (up to `timeout` seconds) until
    none runs: the next measurement shares the machine with none of them. The tree is frozen first, each process
    stopped (SIGSTOP) until no process in it is left unstopped (a stopped process forks no more, and a killed one's
    children would be lost to init), then each process and its group is killed."""
    stopped: set[int] = set()
    while new := [p for p in process_tree(pid) if p not in stopped]:
        for p in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGSTOP)
            stopped.add(p)
    own = os.getpgrp()
    groups = set()
    for p in stopped:
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(p))
    for group in groups - {own}:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    for p in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(running(p) for p in stopped) and time.monotonic() < deadline:
        time.sleep(0.01)


class TrainingRun:
    """A training command in a session of its own, its output (stdout and stderr) read line by line as it comes and
    kept in `log`, stopped with every process under it when the block ends:

        with TrainingRun(train_cls_command(args, processes=2), 'tools/train_cls.py') as run:
            for update in run.updates():
                ...
            raise run.ended_before('its first update')
    """

    def __init__(self, command: Sequence[str], name: str,
                 update_of: Callable[[str], int | None] = update_of_step_line, env: dict | None = None) -> None:
        self.command, self.name, self.update_of = [str(part) for part in command], name, update_of
        self.env = {**os.environ, **(env or {}), 'PYTHONUNBUFFERED': '1'}  # each line as it is written
        self.log: list[str] = []
        self.process: subprocess.Popen | None = None
        self.launched = 0.0

    def __enter__(self) -> TrainingRun:
        self.launched = time.perf_counter()
        self.process = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, start_new_session=True)
        return self

    def __exit__(self, *_) -> None:
        kill_process_tree(self.process.pid)
        self.process.wait()
        self.process.stdout.close()

    def seconds_since_launch(self) -> float:
        return time.perf_counter() - self.launched

    def updates(self) -> Iterator[int]:
        """The update counts the run's log lines report, as they arrive; ends when the run's output does."""
        for line in self.process.stdout:
            self.log.append(line.rstrip())
            update = self.update_of(line)
            if update is not None:
                yield update

    def ended_before(self, what: str) -> DataError:
        """The error of a run whose output ended before `what`: its exit status and its last lines."""
        return DataError(f'{self.name} stopped (exit {self.process.wait()}) before {what}: '
                         + ' | '.join(self.log[-3:]))

    def steady_rate(self, window: SteadyWindow, images_per_update: int, epoch_updates: int | None = None,
                    fix: str = '') -> tuple[float, int]:
        """Images/s of the run's updates (`images_per_update` each) over `window`, read from its update lines as they
        arrive, and the updates timed. The window must close within the first epoch's `epoch_updates` (an epoch's
        end, its validation and checkpoint, is not the training pace): else a UsageError ending with `fix`."""
        previous = 0
        for update in self.updates():
            if epoch_updates is not None and update > epoch_updates:
                raise UsageError(f'{self.name}: the timing window reached the end of the first epoch ({epoch_updates} '
                                 f'updates); {fix}')
            complete = window.done(update, images_per_update * (update - previous))
            previous = update
            if complete:
                return window.images_per_second(), window.timed
        raise self.ended_before(f'{window.warmup} updates and the timing window')
