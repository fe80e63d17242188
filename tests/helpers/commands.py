"""Running the suite's commands as a user does: fresh processes from the repository root, no PYTHONPATH."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from collections.abc import Sequence

ROOT = Path(__file__).resolve().parents[2]
# No PYTHONPATH (the installed package is what users run), and one thread per process so that every run a test
# compares with another computes the same way.
ENV = {**{k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}, 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1'}


def run_python(argv: Sequence[str], cwd: Path = ROOT, timeout: int = 600,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """`python ARGV` in a fresh process, output captured."""
    return subprocess.run([sys.executable, *map(str, argv)], cwd=cwd, env=env or ENV, capture_output=True,
                          text=True, timeout=timeout)


def run_tool(tool: str, args: Sequence[str] = (), **kwargs) -> subprocess.CompletedProcess:
    """`python tools/TOOL ARGS`."""
    return run_python([ROOT / 'tools' / tool, *args], **kwargs)


def run_tool_on_tmpfs(tool: str, args: Sequence[str], mount: Path, size_kb: int = 1024, read_only: bool = False,
                      timeout: int = 600) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`python tools/TOOL ARGS` with a fresh tmpfs of `size_kb` (a disk that fills up), read-only if asked, mounted at
    `mount`, in user and mount namespaces of the command's own (`unshare`): the machine's disks are left alone.
    Returns the command's result and the files it left on the tmpfs (relative paths). The test is skipped where this
    system does not allow such namespaces."""
    probe = subprocess.run(['unshare', '--user', '--map-root-user', '--mount', 'true'], capture_output=True)
    if probe.returncode != 0:
        import pytest
        pytest.skip(f'no user and mount namespaces here (unshare: {probe.stderr.decode().strip()})')
    mount.mkdir(parents=True, exist_ok=True)
    script = (f'mount -t tmpfs -o size={size_kb}k tmpfs "$0" && '
              + ('mount -o remount,ro "$0" && ' if read_only else '')
              + '{ "$@"; status=$?; echo; echo "@files@"; cd "$0" && find . -type f; exit $status; }')
    result = subprocess.run(['unshare', '--user', '--map-root-user', '--mount', 'sh', '-c', script, str(mount),
                             sys.executable, str(ROOT / 'tools' / tool), *map(str, args)], cwd=ROOT, env=ENV,
                            capture_output=True, text=True, timeout=timeout)
    result.stdout, _, listing = result.stdout.rpartition('\n@files@\n')
    return result, sorted(line[2:] for line in listing.splitlines())


def succeeded(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """The result of a command that must have succeeded (else its output's end is the failure message)."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def run_torchrun(tool: str, args: Sequence[str], processes: int, port: int) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node PROCESSES tools/TOOL ARGS` (gloo on CPU); it must succeed."""
    return succeeded(run_python(['-m', 'torch.distributed.run', '--nproc-per-node', processes, '--master-port', port,
                                 ROOT / 'tools' / tool, *args]))
