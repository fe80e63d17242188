"""The one way the studies run another command: the suite's tools by name (`tool_command`, the only place a library
module names a path under tools/, those of the one checkout, `REPOSITORY`) and any other command (timm's train.py,
pytest), each in a session of its own, its output read line by line as it comes (update lines parsed: train_cls's and
timm's), its pace timed in a steady-state window, and stopped by one rule (`LaunchedCommand.stop`): an interrupt, as
Ctrl-C's (its `finally` blocks run: a trainer's checkpoint, pytest's summary, a benchmark's own runs stopped), a grace
period, then every process still running under it (in whatever session or group it started) killed."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TextIO

from backbones.common.errors import DataError, SuiteError, UsageError
from backbones.common.files import write_json_atomic
from backbones.common.log import logger
from classification.engine.fit import update_of_step_line
from classification.engine.memory import child_pids
from classification.studies.timing import SteadyWindow

REPOSITORY = Path(__file__).resolve().parents[2]  # the checkout: its tools are what is run, and the commands run there
GRACE = 10.0  # seconds between a stop's interrupt and its kill
SEEN_EVERY = 0.2  # seconds between two records of the processes under a running command
TIMM_STEP_LINE = re.compile(r'Train: (\d+) \[\s*(\d+)/(\d+)')  # timm's: epoch, update in the epoch (from 0), updates


def update_of_timm_line(line: str) -> int | None:
    """The run's update count (from 1) a timm train.py log line reports, or None."""
    found = TIMM_STEP_LINE.search(line)
    return None if found is None else int(found[1]) * int(found[3]) + int(found[2]) + 1


def tool_path(tool: str) -> str:
    """A tool's path from the checkout's root, as a user types it: tools/train_cls.py (whether or not it is there)."""
    return f'tools/{Path(tool).stem}.py'


def tool_command(tool: str, args: Sequence[object] = (), processes: int | None = None) -> list[str]:
    """tools/`tool`.py of the checkout with `args`, alone (`processes` None) or as `processes` workers under torchrun,
    whose rendezvous takes a port the operating system gives (`--standalone`: no fixed port another job could
    hold). Outside a checkout (an installed package has no tools/ beside it), and for a tool that is not there, a
    UsageError."""
    tools = REPOSITORY / 'tools'
    if not tools.is_dir():
        raise UsageError(f'{REPOSITORY} has no tools/ folder: the studies run the suite\'s tools, which come with a '
                         f'checkout of its repository (run them from a clone, not from an installed package)')
    if tool not in {path.stem for path in tools.glob('*.py')}:
        raise UsageError(f'no tool {tool!r} in {tools}')
    launcher = ['-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', str(processes)]
    return [sys.executable, *(launcher if processes is not None else []), str(REPOSITORY / tool_path(tool)),
            *map(str, args)]


def command_name(command: Sequence[str]) -> str:
    """How messages name a command: a tool of the checkout by its path there (`torchrun tools/train_cls.py` under
    torchrun), another command by its first word."""
    parts = [str(part) for part in command]
    script = next((Path(part) for part in parts if Path(part).parent == REPOSITORY / 'tools'), None)
    if script is None:
        return parts[0]
    return ('torchrun ' if 'torch.distributed.run' in parts else '') + script.relative_to(REPOSITORY).as_posix()


def process_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the process's name (its state first), None once it has gone."""
    try:
        return Path(f'/proc/{pid}/stat').read_text().rpartition(')')[2].split()
    except OSError:
        return None


def started_at(pid: int) -> str | None:
    """When process `pid` started (clock ticks after boot): with its pid, what tells it from a later process given the
    same pid. None once it has gone."""
    fields = process_fields(pid)
    return None if fields is None else fields[19]


def running(pid: int) -> bool:
    """Whether process `pid` exists and has not ended (a zombie, whose status its parent has not read, has)."""
    fields = process_fields(pid)
    return fields is not None and fields[0] != 'Z'


def process_tree(pid: int) -> list[int]:
    """Process `pid` and every process below it: its children, theirs, and so on (none once it has gone)."""
    try:
        children = child_pids(pid)
    except OSError:
        return []
    return [pid, *(p for child in children for p in process_tree(child))]


def session_members(session: int) -> list[int]:
    """The processes of session `session` (its leader's pid): those a leader that ended left behind included."""
    return [int(entry.name) for entry in Path('/proc').iterdir()
            if entry.name.isdigit() and (fields := process_fields(int(entry.name))) and fields[3] == str(session)]


def kill_processes(roots: Iterable[int], timeout: float = 30.0) -> None:
    """SIGKILL to each of `roots` and everything below them, in whatever group each started (torchrun starts every
    worker in a session of its own; loader workers are in their trainer's group), and wait (up to `timeout` seconds)
    until none runs: the next measurement shares the machine with none of them. The trees are frozen first, each
    process stopped (SIGSTOP) until no process in them is left unstopped (a stopped process forks no more, and a
    killed one's children would be lost to init), then each process and its group is killed."""
    roots = list(roots)
    stopped: set[int] = set()
    while new := [p for root in roots for p in process_tree(root) if p not in stopped]:
        for p in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGSTOP)
            stopped.add(p)
    groups = set()
    for p in stopped:
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(p))
    for group in groups - {os.getpgrp()}:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    for p in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(running(p) for p in stopped) and time.monotonic() < deadline:
        time.sleep(0.01)


@contextlib.contextmanager
def interrupt_heard() -> Iterator[None]:
    """SIGINT handled, not ignored, while a command starts: an ignored signal stays ignored across exec, and a study
    started in the background of a script (which ignores SIGINT) would give its commands an interrupt they cannot
    hear, and the stop rule its grace for nothing. A handled one starts the command at SIGINT's default."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


class LaunchedCommand:
    """A command in a session of its own (in the checkout), named `name` in messages (default: `command_name`), its
    output read line by line as it comes and kept in `log` (and appended to `log_file`): standard output and error
    together, or standard error alone where `stdout` names the file its standard output goes to. It is stopped
    (`stop`) when its `limit` (seconds) passes and when the block ends with it still running (at its end, at an
    error, at Ctrl-C); what a command that ended left running in its session is killed at the block's end.

        with LaunchedCommand(tool_command('train_cls', args, processes=2)) as run:
            for update in run.updates():
                ...
            raise run.ended_before('its first update')
    """

    def __init__(self, command: Sequence[str], name: str | None = None,
                 update_of: Callable[[str], int | None] = update_of_step_line, env: dict | None = None,
                 limit: float | None = None, grace: float = GRACE, stdout: Path | None = None,
                 log_file: Path | None = None) -> None:
        self.command, self.update_of = [str(part) for part in command], update_of
        self.name = name or command_name(command)
        self.env = {**os.environ, **(env or {}), 'PYTHONUNBUFFERED': '1'}  # each line as it is written
        self.limit, self.grace, self.stdout, self.log_file = limit, grace, stdout, log_file
        self.log: list[str] = []
        self.process: subprocess.Popen | None = None
        self.launched = 0.0
        self.stopped_at_limit = False
        self.stopping = threading.Lock()  # the limit's stop and the block's end, one at a time
        self.ended = threading.Event()  # the block has ended: the limit has nothing left to stop
        self.watch: threading.Thread | None = None
        self.seen: dict[int, str | None] = {}  # every process seen under the command while it ran: its start
        self.files = contextlib.ExitStack()  # the files the command writes to and its lines are appended to
        self.appended: TextIO | None = None

    def __enter__(self) -> LaunchedCommand:
        with contextlib.ExitStack() as files:  # closed here if the command does not start
            out = files.enter_context(open(self.stdout, 'w')) if self.stdout else subprocess.PIPE
            self.appended = files.enter_context(open(self.log_file, 'a', buffering=1)) if self.log_file else None
            self.launched = time.perf_counter()
            with interrupt_heard():
                self.process = subprocess.Popen(self.command, cwd=REPOSITORY, env=self.env, stdout=out,
                                                stderr=subprocess.PIPE if self.stdout else subprocess.STDOUT,
                                                text=True, errors='replace', start_new_session=True)
            self.files = files.pop_all()
        self.watch = threading.Thread(target=self.watch_tree, daemon=True)
        self.watch.start()
        return self

    def __exit__(self, *_) -> None:
        self.ended.set()
        try:
            if self.watch is not None:
                self.watch.join()
            self.stop()
            for _ in self.lines():  # the rest of its output, kept: what it said as it stopped
                pass
        finally:
            if self.process.poll() is None:  # a second Ctrl-C before the stop began
                kill_processes([self.process.pid])
            self.process.wait()
            for stream in (self.process.stdout, self.process.stderr):
                if stream is not None:
                    stream.close()
            self.files.close()

    def watch_tree(self) -> None:
        """While the command runs: the processes under it recorded every SEEN_EVERY seconds (one that outlives a
        parent which ended, in a session of its own, is still known at the stop), and the stop at its limit."""
        deadline = None if self.limit is None else time.monotonic() + self.limit
        while True:  # until the block ends: a process left holding the command's output keeps it reading
            if self.process.poll() is None:
                self.seen.update({p: started_at(p) for p in process_tree(self.process.pid) if p not in self.seen})
            left = SEEN_EVERY if deadline is None else min(SEEN_EVERY, deadline - time.monotonic())
            if self.ended.wait(max(left, 0)):
                return
            if deadline is not None and time.monotonic() >= deadline:
                self.stop(at_limit=True)
                return

    def left_running(self, recorded: dict[int, str | None]) -> list[int]:
        """The processes of `recorded` still running as themselves (a pid taken again by another process is not)."""
        return [p for p, start in recorded.items() if start is not None and started_at(p) == start]

    def stop(self, at_limit: bool = False) -> None:
        """The one stop rule: SIGINT to the command's process group, as Ctrl-C in a terminal sends it (Python's
        `finally` blocks run: a trainer checkpoints, pytest prints its summary, a benchmark stops the runs it started;
        loader workers leave it to their trainer), up to `grace` seconds for it to end, then every process still
        running of those under it before the interrupt (its loader and torchrun workers, in sessions of their own or
        left to init by its end) and of its session frozen and killed. A command that has ended: what its session
        left running is killed at once."""
        with self.stopping:
            pid = self.process.pid
            self.stopped_at_limit = self.stopped_at_limit or at_limit
            if self.process.poll() is not None:
                kill_processes([*self.left_running(self.seen), *session_members(pid)])
                return
            before = {**self.seen, **{p: started_at(p) for p in {*process_tree(pid), *session_members(pid)}}}
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGINT)
            try:
                self.process.wait(self.grace)
            except subprocess.TimeoutExpired:
                pass
            finally:  # a second Ctrl-C in the grace ends it
                kill_processes([*self.left_running(before), *session_members(pid)])

    def seconds_since_launch(self) -> float:
        return time.perf_counter() - self.launched

    def lines(self) -> Iterator[str]:
        """The command's output lines (without their line ends) as they arrive, each kept in `log` and appended to
        `log_file`; ends when its output does."""
        for line in (self.process.stderr if self.stdout else self.process.stdout):
            line = line.rstrip('\n')
            self.log.append(line)
            if self.appended is not None:
                self.appended.write(line + '\n')
            yield line

    def wait(self, on_line: Callable[[str], None] = lambda line: None) -> int | None:
        """The rest of the command's output read (each line handed to `on_line` as it arrives) and its end waited
        for: its exit status, or None where its limit stopped it."""
        for line in self.lines():
            on_line(line)
        status = self.process.wait()
        return None if self.stopped_at_limit else status

    def updates(self) -> Iterator[int]:
        """The update counts the command's log lines report, as they arrive; ends when its output does."""
        for line in self.lines():
            update = self.update_of(line)
            if update is not None:
                yield update

    def ended_before(self, what: str) -> DataError:
        """The error of a command whose output ended before `what`: its exit status and its last lines."""
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


class ToolStages:
    """The suite's tools run as a study's stages: each through `LaunchedCommand` (Ctrl-C, SIGTERM or a closed terminal
    stops the running one by its rule), logged to a file, its seconds kept in `seconds`; `same_command` refuses a
    stage's results to a rerun with other settings. `device` 'cpu' hides the GPUs from every stage."""

    def __init__(self, device: str | None) -> None:
        self.env = {'CUDA_VISIBLE_DEVICES': ''} if device == 'cpu' else {}
        self.seconds: dict[str, float] = {}
        if threading.current_thread() is threading.main_thread():  # a hangup as the stop signals (run_command's)
            signal.signal(signal.SIGHUP, signal.getsignal(signal.SIGTERM))

    def run(self, name: str, tool: str, argv: list[str], log: Path) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        logger.info(f'[{time.strftime("%H:%M:%S")}] {name}')
        with LaunchedCommand(tool_command(tool, argv), name, env=self.env, log_file=log) as command:
            status = command.wait()
        self.seconds[name] = round(command.seconds_since_launch(), 1)
        if status != 0:
            raise SuiteError(f'{name} failed (exit {status}); the end of {log}:\n' + '\n'.join(command.log[-15:]))

    @staticmethod
    def same_command(record: Path, tool: str, argv: list[str], started: bool) -> bool:
        """The stage whose command `record` holds must be run with the same command (`--resume` aside) once it has
        `started` (made results); the first time, and while nothing was made, the command is (re)recorded, and True
        says the settings changed. A stage `started` without a record (an older version's) is refused too."""
        command = [f'{tool}.py', *(arg for arg in argv if arg != '--resume')]
        made = json.loads(record.read_text()) if record.is_file() else None
        if started and made is None:
            raise UsageError(f'{record.parent} holds results with no record of the settings they were made with: '
                             f'use another --out')
        if made == command:
            return False
        if started:
            changed = ' '.join(arg for arg in command if arg not in made) or 'fewer options'
            raise UsageError(f'{record.name.removesuffix(".command.json")} in {record.parent} was made by '
                             f'`{" ".join(made)}`; this run gives it {changed}: use another --out, or the settings it '
                             f'was made with')
        record.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(record, command)
        return made is not None
