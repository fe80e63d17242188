"""The studies' launcher of training runs: train_cls alone and under torchrun (two at once: no fixed port), timed from
its update lines in a steady-state window, and stopped with every process under it (torchrun's workers start sessions
of their own)."""
from __future__ import annotations

import contextlib
import os
import time

import pytest

from classification.studies.timing import SteadyWindow
from classification.studies.training_runs import TrainingRun, process_tree, running, train_cls_command
from helpers.models import TINY_DEIT

THREADS = {'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1'}  # two cores for three runs


@pytest.mark.slow
def test_training_runs_are_timed_by_their_update_lines_and_stopped_whole(labeled_images, tmp_path):
    data, _ = labeled_images
    options = [*TINY_DEIT, '--data-dir', data, '--img-size', '32', '--batch-size', '2', '--workers', '1', '--epochs',
               '100', '--log-interval', '1', '--pictures', '0', '--device', 'cpu']
    runs = {name: TrainingRun(train_cls_command([*options, '--output', tmp_path / name], processes), name, env=THREADS)
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
