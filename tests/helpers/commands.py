"""Running the suite's commands as a user does: processes of their own from the repository root, no PYTHONPATH (the
tools in children of a tool server that has imported their libraries once: zygote.py)."""
from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from helpers.zygote import is_tool, kill_group, read_answer, send_request

ROOT = Path(__file__).resolve().parents[2]
# No PYTHONPATH (the installed package is what users run), and one thread per process so that every run a test
# compares with another computes the same way.
ENV = {**{k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}, 'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1'}


def run_python(argv: Sequence[str], cwd: Path = ROOT, timeout: int = 600, env: dict | None = None,
               fresh: bool = False, nested: bool = False) -> subprocess.CompletedProcess:
    """`python ARGV` in a process of its own, output captured: a tool (`argv[0]` a script in tools/) in a child of
    the tool server (zygote.py says what differs from a fresh interpreter), anything else, or with an `env` that
    differs from the tests' own beyond PYTHONPATH, or `fresh`, in a fresh interpreter. `nested`: the tools the tool
    runs with `sys.executable` are the server's children too."""
    argv = [str(arg) for arg in argv]
    if fresh or (env is not None and not search_path_only(env)) or not ToolServer.serves(argv, Path(cwd)):
        return subprocess.run([sys.executable, *argv], cwd=cwd, env=env or ENV, capture_output=True, text=True,
                              timeout=timeout)
    return ToolServer.shared().run(argv, Path(cwd), timeout, nested, env)


def search_path_only(env: dict) -> bool:
    """Whether `env` is the tests' own but for PYTHONPATH, which the tool server's child puts on its `sys.path` (the
    modules it names are not imported in the server)."""
    return {k: v for k, v in env.items() if k != 'PYTHONPATH'} == {k: v for k, v in ENV.items() if k != 'PYTHONPATH'}


def run_tool(tool: str, args: Sequence[str] = (), **kwargs) -> subprocess.CompletedProcess:
    """`python tools/TOOL ARGS`."""
    return run_python([ROOT / 'tools' / tool, *args], **kwargs)


class ToolServer:
    """This test process's tool server (zygote.py), started on first use and ended with the process."""

    _shared: ToolServer | None = None

    @staticmethod
    def serves(argv: Sequence[str], cwd: Path) -> bool:
        import torch
        return not os.environ.get('SUITE_TESTS_FRESH_PYTHON') and not torch.cuda.is_available() and is_tool(argv, cwd)

    @classmethod
    def shared(cls) -> ToolServer:
        if cls._shared is None or cls._shared.process.poll() is not None:
            cls._shared = cls()
        return cls._shared

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix='tool_server_'))
        self.socket_path = self.folder / 'socket'
        self.process = subprocess.Popen([sys.executable, ROOT / 'tests' / 'helpers' / 'zygote.py', self.socket_path],
                                        cwd=ROOT, env=ENV, stdin=subprocess.DEVNULL)
        atexit.register(self.close)
        self.calls = 0
        # the nested commands' stand-in is an executable in this folder: on a noexec mount they run fresh instead
        self.nests = not os.statvfs(self.folder).f_flag & os.ST_NOEXEC

    def close(self) -> None:
        self.process.terminate()  # the server kills its running commands, then ends
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def connect(self) -> socket.socket:
        """A connection, once the server has imported the tools' libraries and listens."""
        deadline = time.monotonic() + 300
        while True:
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                connection.connect(str(self.socket_path))
                return connection
            except (FileNotFoundError, ConnectionRefusedError):
                connection.close()
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f'the tool server ended or did not start (status {self.process.poll()})')
                time.sleep(0.05)

    def run(self, argv: list[str], cwd: Path, timeout: float, nested: bool = False,
            env: dict | None = None) -> subprocess.CompletedProcess:
        self.calls += 1
        stdout, stderr = self.folder / f'{self.calls}.out', self.folder / f'{self.calls}.err'
        command = [sys.executable, *argv]
        request = {'argv': argv, 'cwd': str(cwd), 'env': env, 'nested': nested and self.nests}
        pid = None
        with (open(os.devnull, 'rb') as stdin, open(stdout, 'wb') as out, open(stderr, 'wb') as err,
              self.connect() as connection):
            connection.settimeout(timeout)
            try:
                answers = send_request(connection, request, (stdin.fileno(), out.fileno(), err.fileno()))
                pid = read_answer(answers, 'pid')
                returncode = read_answer(answers, 'returncode')
            except TimeoutError:
                end_command(pid)
                raise subprocess.TimeoutExpired(command, timeout, *map(read_and_remove, (stdout, stderr))) from None
            except BaseException:  # the test stopped (its own timeout, Ctrl-C): so does its command, as subprocess does
                end_command(pid)
                raise
        return subprocess.CompletedProcess(command, returncode, *map(read_and_remove, (stdout, stderr)))


def end_command(pid: int | None) -> None:
    """Kill a command's process group (the command and the processes it started), if it started; the server kills
    it anyway once the connection closes."""
    if pid is not None:
        kill_group(pid)


def read_and_remove(path: Path) -> str:
    text = path.read_text(errors='replace') if path.exists() else ''
    path.unlink(missing_ok=True)
    return text


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


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The command failed with the suite's one-line error (no traceback); its text."""
    assert result.returncode == 2 and 'Traceback' not in result.stderr, result.stderr[-2000:]
    return result.stderr.strip().splitlines()[-1]


def succeeded(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """The result of a command that must have succeeded (else its output's end is the failure message)."""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def free_port() -> int:
    """A TCP port free on this machine now, for a torchrun rendezvous: tests running at once never share one."""
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


def run_torchrun(tool: str, args: Sequence[str], processes: int) -> subprocess.CompletedProcess:
    """`torchrun --nproc-per-node PROCESSES tools/TOOL ARGS` (gloo on CPU), on a free port; it must succeed."""
    return succeeded(run_python(['-m', 'torch.distributed.run', '--nproc-per-node', processes, '--master-port',
                                 free_port(), ROOT / 'tools' / tool, *args]))
