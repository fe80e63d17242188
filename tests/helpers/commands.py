"""Running the suite's commands as a user does: fresh processes from the repository root, no PYTHONPATH."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]
# No PYTHONPATH (the installed package is what users run), and one thread per process so that every run a test
# compares with another computes the same way.
ENV = {**{k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}, 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1'}


def run_python(argv: Sequence[str], cwd: Path = ROOT, timeout: int = 600,
               env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """`python ARGV` in a fresh process, output captured."""
    return subprocess.run([sys.executable, *map(str, argv)], cwd=cwd, env=env or ENV, capture_output=True,
                          text=True, timeout=timeout)


def run_tool(tool: str, args: Sequence[str] = (), **kwargs) -> subprocess.CompletedProcess:
    """`python tools/TOOL ARGS`."""
    return run_python([ROOT / 'tools' / tool, *args], **kwargs)


def succeeded(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """The result of a command that must have succeeded (else its output's end is the failure message)."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def run_torchrun(tool: str, args: Sequence[str], processes: int, port: int) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node PROCESSES tools/TOOL ARGS` (gloo on CPU); it must succeed."""
    return succeeded(run_python(['-m', 'torch.distributed.run', '--nproc-per-node', processes, '--master-port', port,
                                 ROOT / 'tools' / tool, *args]))
