"""A training process's life on a cluster: the stop signals schedulers send before they kill a job (noted by the
training process, ignored by its loader workers), and whether torchrun restarted the run."""
from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.util  # its exit hook waits for daemonic children: one registered after it runs before it
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from backbones.common.errors import Interrupted

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)  # what cluster schedulers send before they kill a job


def restarted_by_torchrun() -> bool:
    """Whether torchrun restarted this run's processes after a failure (`--max-restarts`)."""
    return int(os.environ.get('TORCHELASTIC_RESTART_COUNT', '0') or 0) > 0


class StopRequests:
    """SIGTERM and SIGUSR1 (or `signals`) noted while a run trains, the former handlers put back after."""

    def __init__(self, signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
        self.signals = signals
        self.received: str | None = None
        self.previous: dict = {}

    def __enter__(self) -> 'StopRequests':
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            for sig in self.signals:
                self.previous[sig] = signal.signal(sig, self.note)
        return self

    def note(self, signum: int, _frame) -> None:
        self.received = signal.Signals(signum).name

    def __exit__(self, *_) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


@contextmanager
def signals_held() -> Iterator[None]:
    """Stop signals and Ctrl-C held back while the block runs (mmengine's config formatting), then delivered."""
    with StopRequests((*STOP_SIGNALS, signal.SIGINT)) as held:
        yield
    if held.received:
        signal.raise_signal(signal.Signals[held.received])


@contextmanager
def resumable_on_ctrl_c(last_checkpoint: Callable[[], Path | None]) -> Iterator[None]:
    """Ctrl-C after a training run's first checkpoint: the line says that `--resume` continues it."""
    try:
        yield
    except KeyboardInterrupt:
        checkpoint = last_checkpoint()
        if checkpoint is None:
            raise
        raise Interrupted(f'SIGINT (Ctrl-C): {checkpoint} holds the run up to its last checkpoint (nothing '
                          f'half-written is left); the same command with --resume continues it',
                          exit_code=130) from None


def ignore_stop_signals(_: int) -> None:
    """Loader workers leave SIGTERM and SIGUSR1 to the training process, which stops them after its checkpoint."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def kill_workers_left_at_exit() -> None:
    """Loader workers still alive at exit are killed: Python's exit would end them with SIGTERM, which they ignore
    (`ignore_stop_signals`), and wait for them forever (a worker's error ends a run with them held)."""
    children = [child for child in multiprocessing.active_children() if child.daemon]
    if children:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # torch's loader handler would report them as failures
        for child in children:
            child.kill()


atexit.register(kill_workers_left_at_exit)


def interrupt_on_stop_signals() -> None:
    """SIGTERM and SIGUSR1 raise `Interrupted` (one line, exit 75) in a command's own process where no training loop
    notes them; processes forked from it keep the signals' default action."""
    owner = os.getpid()

    def interrupt(signum: int, _frame) -> None:
        if os.getpid() != owner:  # a forked child: end as the signal ends a process
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Interrupted(f'{signal.Signals(signum).name} before the command\'s work was done (nothing half-written '
                          f'is left): run the same command again')

    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, interrupt)
