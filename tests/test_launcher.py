"""The studies' one launcher of child commands: the suite's tools named through it alone, in the checkout; one stop
rule (an interrupt the command's `finally` blocks answer, a grace, then every process under it killed, those in
sessions of their own and those its end left to init included) at its time limit and at the block's end, however the
block ends; train_cls alone and under torchrun (two at once: no fixed port), timed from its update lines in a
steady-state window, and stopped with every process under it (torchrun's workers start sessions of their own)."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time

import pytest

from backbones.common.errors import UsageError
from classification.studies import launcher
from classification.studies.launcher import (
    REPOSITORY,
    LaunchedCommand,
    command_name,
    process_tree,
    running,
    tool_command,
)
from classification.studies.timing import SteadyWindow
from helpers.models import TINY_DEIT

THREADS = {'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1'}  # two cores for three runs


@pytest.mark.slow
def test_training_runs_are_timed_by_their_update_lines_and_stopped_whole(labeled_images, tmp_path):
    data, _ = labeled_images
    options = [*TINY_DEIT, '--data-dir', data, '--img-size', '32', '--batch-size', '2', '--workers', '1', '--epochs',
               '100', '--log-interval', '1', '--pictures', '0', '--device', 'cpu']
    runs = {name: LaunchedCommand(tool_command('train_cls', [*options, '--output', tmp_path / name], processes), name,
                                  env=THREADS)
            for name, processes in (('alone', None), ('torchrun', 2), ('torchrun again', 2))}
    sessions = {}
    for run in runs.values():  # all three at once: the two torchrun jobs must not want the same port
        run.__enter__()
    try:
        for name, run in runs.items():
            window = SteadyWindow(seconds=0, min_batches=2, warmup=2)
            rate, updates = run.steady_rate(window, images_per_update=2)
            assert rate > 0 and updates >= 2 and window.first >= 2, name
            # alone: the run and its loader worker; torchrun: the launcher, and two workers with their loader workers
            sessions[name] = whole_tree(run.process.pid, 5 if name.startswith('torchrun') else 2)
    finally:
        for run in runs.values():
            run.__exit__(None, None, None)
    for name, tree in sessions.items():
        # alone: every process in the run's session; torchrun: each worker in a session of its own
        assert len(set(tree.values())) == (3 if name.startswith('torchrun') else 1), name
        assert [pid for pid in tree if running(pid)] == [], f'{name}: processes left running'


def whole_tree(pid: int, least: int, timeout: float = 60.0) -> dict[int, int]:
    """The processes under `pid` (itself included) with their sessions, once there are at least `least` of them (the
    loader workers end with each epoch and validation, and new ones start)."""
    deadline = time.monotonic() + timeout
    while True:
        tree = {}
        for p in process_tree(pid):
            with contextlib.suppress(ProcessLookupError):  # ended since it was listed
                tree[p] = os.getsid(p)
        if len(tree) >= least or time.monotonic() > deadline:
            assert len(tree) >= least, tree
            return tree
        time.sleep(0.01)


def python_child(code: str, *args: object) -> list[str]:
    """A Python command running `code` (its arguments in sys.argv[1:])."""
    return [sys.executable, '-c', code, *map(str, args)]


WAITS_IN_TRY = """
import pathlib, sys, time
try:
    print('ready')
    time.sleep(60)
finally:
    pathlib.Path(sys.argv[1]).write_text('finally ran')
    print('stopped')
"""
IGNORES_SIGINT = """
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
print('ready')
time.sleep(60)
"""
# a grandchild in the child's session or one of its own (as torchrun starts its workers), not holding the child's
# output (which would keep it open, and its reader reading): its pid, then the child waits, or ends at once
STARTS_A_GRANDCHILD = """
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=sys.argv[1] == 'own session')
print(grandchild.pid, flush=True)
time.sleep(60 if sys.argv[2] == 'waits' else 1)  # or ends after a second (the processes under it were seen)
"""
# the same, its grandchild holding the child's output open after the child ended (as a torchrun worker would)
LEAVES_A_GRANDCHILD_HOLDING_ITS_OUTPUT = """
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)
print(grandchild.pid, flush=True)
time.sleep(1)
"""


@pytest.mark.parametrize('interrupted', [False, True])
def test_a_command_still_running_at_the_blocks_end_is_interrupted_and_its_finally_blocks_run(tmp_path, interrupted):
    """SIGINT first, and no grace waited once it has ended: a trainer checkpoints, pytest prints its summary (what
    it says as it stops is kept). The same when the block ends with Ctrl-C in the parent."""
    marker = tmp_path / 'finally'
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt) if interrupted else contextlib.nullcontext():
        with LaunchedCommand(python_child(WAITS_IN_TRY, marker), 'child', grace=30) as run:
            assert next(run.lines()) == 'ready'
            if interrupted:
                raise KeyboardInterrupt
    assert marker.read_text() == 'finally ran'
    assert run.process.returncode == -signal.SIGINT  # Python's end at an unhandled KeyboardInterrupt
    assert time.monotonic() - started < 20
    assert run.log[:2] == ['ready', 'stopped'] and run.log[-1] == 'KeyboardInterrupt'  # its traceback's end


def test_a_command_started_by_a_study_that_ignores_the_interrupt_still_hears_it(tmp_path):
    """A study run in the background of a script ignores SIGINT, and an ignored signal is inherited: its commands
    are started at SIGINT's default all the same, so that the stop's interrupt runs their finally blocks."""
    marker = tmp_path / 'finally'
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with LaunchedCommand(python_child(WAITS_IN_TRY, marker), 'child', grace=30) as run:
            assert next(run.lines()) == 'ready'
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # the study's own disposition, as it was
    finally:
        signal.signal(signal.SIGINT, previous)
    assert marker.read_text() == 'finally ran'


def test_a_command_that_ignores_the_interrupt_is_killed_after_the_grace():
    started = time.monotonic()
    with LaunchedCommand(python_child(IGNORES_SIGINT), 'child', grace=1) as run:
        assert next(run.lines()) == 'ready'
    assert run.process.returncode == -signal.SIGKILL
    assert 1 <= time.monotonic() - started < 20


@pytest.mark.parametrize('session, child', [('own session', 'waits'), ('same session', 'ends'),
                                            ('own session', 'ends')])
def test_the_processes_a_command_started_are_killed_with_it(session, child):
    """A grandchild in a session of its own, left to init when the interrupt ends the command (it had been under it
    before the interrupt); one in the command's session, or in its own, left running by a command that ended by
    itself, killed at once (no grace)."""
    started = time.monotonic()
    with LaunchedCommand(python_child(STARTS_A_GRANDCHILD, session, child), 'child', grace=30) as run:
        grandchild = int(next(run.lines()))
        assert running(grandchild) and (os.getsid(grandchild) == grandchild) == (session == 'own session')
        if child == 'ends':
            assert run.wait() == 0
    assert not running(grandchild)
    assert time.monotonic() - started < 20


def test_a_grandchild_holding_the_output_of_a_command_that_ended_is_stopped_at_the_limit():
    """The command ended by itself, but what it left in a session of its own keeps its output open: the reading ends
    at the limit, which says it stopped the command, and nothing is left running."""
    started = time.monotonic()
    with LaunchedCommand(python_child(LEAVES_A_GRANDCHILD_HOLDING_ITS_OUTPUT), 'child', limit=3, grace=0.5) as run:
        assert run.wait() is None
        grandchild = int(run.log[0])
    assert not running(grandchild) and time.monotonic() - started < 15


def test_a_command_past_its_limit_is_stopped_and_says_so():
    with LaunchedCommand(python_child(IGNORES_SIGINT), 'child', limit=0.5, grace=0.5) as run:
        assert run.wait() is None and run.log == ['ready']
    assert run.process.returncode == -signal.SIGKILL
    with LaunchedCommand(python_child('import sys; print("done"); sys.exit(3)'), 'child', limit=30) as run:
        assert run.wait() == 3 and run.log == ['done']  # ended before its limit: its own status


def test_standard_output_to_a_file_and_the_lines_appended_to_a_log(tmp_path):
    log = tmp_path / 'run.log'
    log.write_text('an earlier run\n')
    code = 'import sys; print("figures"); print("progress", file=sys.stderr); print("more", file=sys.stderr)'
    with LaunchedCommand(python_child(code), 'child', stdout=tmp_path / 'out.json', log_file=log) as run:
        assert run.wait() == 0
    assert run.log == ['progress', 'more'] and (tmp_path / 'out.json').read_text() == 'figures\n'
    assert log.read_text() == 'an earlier run\nprogress\nmore\n'
    with LaunchedCommand(python_child(code), 'child', log_file=log) as run:  # both streams, as lines
        assert run.wait() == 0
    assert sorted(run.log) == ['figures', 'more', 'progress'] and log.read_text().endswith('more\n')


def test_the_tools_are_named_in_the_checkout_alone(monkeypatch, tmp_path):
    script = str(REPOSITORY / 'tools' / 'train_cls.py')
    assert tool_command('train_cls', ['lvvit_s', 2]) == [sys.executable, script, 'lvvit_s', '2']
    under_torchrun = tool_command('train_cls', ['lvvit_s'], processes=2)
    assert under_torchrun == [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', '2',
                              script, 'lvvit_s']
    assert command_name(tool_command('train_cls')) == 'tools/train_cls.py'
    assert command_name(under_torchrun) == 'torchrun tools/train_cls.py'
    with pytest.raises(UsageError, match=re.escape(f"no tool 'train_cls.py' in {REPOSITORY / 'tools'}")):
        tool_command('train_cls.py')
    monkeypatch.setattr(launcher, 'REPOSITORY', tmp_path)  # an installed package: no checkout around it
    with pytest.raises(UsageError, match=re.escape(f'{tmp_path} has no tools/ folder: ') + '.*run them from a clone'):
        tool_command('train_cls')
