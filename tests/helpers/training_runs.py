"""Interrupting a training command as a user's machine might, and comparing what two runs wrote."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from helpers.commands import ENV, ROOT, run_tool


def kill_after_first_epoch(tool: str, args: Sequence[str], output: Path) -> None:
    """Start the command and SIGKILL it as soon as its first epoch is logged; it must not have finished."""
    proc = subprocess.Popen([sys.executable, str(ROOT / 'tools' / tool), *args], cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while not (output / 'log.jsonl').exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (output / 'metrics.json').exists(), 'the run finished before it could be interrupted'


def resume_killed_run(tool: str, args: Sequence[str], output: Path) -> None:
    """Kill a run after its first epoch, check that it is not silently overwritten, and resume it to the end."""
    kill_after_first_epoch(tool, args, output)
    refused = run_tool(tool, args)
    assert refused.returncode != 0 and '--resume' in refused.stderr
    resumed = run_tool(tool, [*args, '--resume'])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert 'resumed' in resumed.stdout


def read_log(output: Path) -> dict:
    """log.jsonl by epoch."""
    return {r['epoch']: r for r in map(json.loads, (output / 'log.jsonl').read_text().splitlines())}


def last_weights(output: Path) -> dict:
    return torch.load(output / 'last.pth', weights_only=True)['state_dict']


def assert_same_run(a: Path, b: Path, epochs: int, exact: bool = True, images: int | None = None) -> None:
    """The two runs logged the same losses and validation results and ended on the same weights: bit for bit
    (`exact`: a resumed run), or to float tolerance (a different process count)."""
    log_a, log_b = read_log(a), read_log(b)
    assert sorted(log_a) == sorted(log_b) == list(range(1, epochs + 1))
    for epoch in log_a:
        if exact:
            assert log_b[epoch]['train_loss'] == log_a[epoch]['train_loss'], epoch
            assert log_b[epoch]['top1'] == log_a[epoch]['top1'], epoch
        else:
            assert log_b[epoch]['train_loss'] == pytest.approx(log_a[epoch]['train_loss'], rel=1e-5), epoch
        if images is not None:
            assert log_a[epoch]['images'] == log_b[epoch]['images'] == images  # each validation image once
    wa, wb = last_weights(a), last_weights(b)
    assert sorted(wa) == sorted(wb)
    for k in wa:
        if exact:
            assert torch.equal(wa[k], wb[k]), k
        else:
            torch.testing.assert_close(wb[k], wa[k], atol=2e-5, rtol=1e-4)


def mid_epoch_point(output: Path) -> tuple | None:
    """(epochs done, batch) of a mid-epoch last.pth, None while there is none."""
    try:
        checkpoint = torch.load(output / 'last.pth', map_location='cpu', weights_only=True)
    except (FileNotFoundError, RuntimeError, EOFError):
        return None
    return (checkpoint['epochs_done'], checkpoint['batch']) if 'batch' in checkpoint else None


def stop_mid_epoch(tool: str, args: Sequence[str], output: Path, after: tuple | None) -> tuple:
    """Start the command (which writes a mid-epoch checkpoint after every update) and SIGTERM it once a checkpoint
    later than `after` appears; it must exit with status 75 at a mid-epoch point, which is returned."""
    proc = subprocess.Popen([sys.executable, str(ROOT / 'tools' / tool), *args, '--checkpoint-minutes', '1e-6'],
                            cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline:
        point = mid_epoch_point(output)
        if point is not None and point != after:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 75, stderr[-2000:]
    assert 'SIGTERM at epoch' in stderr and '--resume continues it' in stderr and 'Traceback' not in stderr
    stopped = mid_epoch_point(output)
    assert stopped is not None and stopped != after
    return stopped


def resume_after_stops(tool: str, args: Sequence[str], output: Path, stops: int) -> list:
    """Stop a run mid-epoch `stops` times (SIGTERM), resuming it each time, then let it finish; the stop points."""
    points, resume = [], []
    for _ in range(stops):
        points.append(stop_mid_epoch(tool, [*args, *resume], output, points[-1] if points else None))
        resume = ['--resume']
    finished = run_tool(tool, [*args, '--resume'])
    assert finished.returncode == 0, finished.stderr[-3000:]
    return points


def tiny_deit_run(folder: Path, epochs: int) -> tuple[Path, Path]:
    """An image folder of three named classes (helpers.cls_data) and a tiny DeiT trained on it for `epochs`, in
    process: the folder and the run's last.pth."""
    from classification import train
    from helpers.cls_data import make_image_folder
    from helpers.models import TINY_DEIT
    data = make_image_folder(folder / 'data')
    train.main([*TINY_DEIT, '--data-dir', str(data), '--no-token-labeling', '--img-size', '32', '--batch-size', '4',
                '--epochs', str(epochs), '--warmup-epochs', '0', '--workers', '0', '--device', 'cpu', '--output',
                str(folder / 'run')])
    return data, folder / 'run' / 'last.pth'
