"""A tool server for the tests: one Python process that has run the module-level imports of every tool (torch, timm,
mmengine, mmseg and the suite's own packages), then forks a child per command, which runs `tools/TOOL ARGS` as its
`__main__`, as `python tools/TOOL ARGS` would, with the caller's stdin, stdout and stderr.

Why: a fresh interpreter spends 3 to 5 s importing torch, timm and mmseg before a tool's first line, and the suite runs
its tools some 150 times (about 10 minutes of a 2-core machine's test time). A forked child starts with those modules
already imported and then runs the tool's own code unchanged, in a process of its own.

Nested commands: a tool that runs the suite's tools itself (the token-labeling reproduction runs some 30) is given, in
a request with "nested": true, a `sys.executable` of the server's own (`python` in the server's folder). That stand-in
sends `python tools/TOOL ARGS` to this server with its directory, environment and stdin, stdout and stderr; passes the
signals it gets (TERM, INT, HUP, QUIT, USR1, USR2, those not ignored; any that come while it starts are held until the
command runs) to the command's process group; and ends as the command ends (by the same signal, or with the same
status). Anything else, and a tool whose import-time variables (`IMPORT_TIME_VARIABLES`) differ from the server's, it
runs in the real interpreter.

What differs from a fresh interpreter:
- every tool sees the modules every other tool imports (a tool using a submodule it never imports would pass here);
- messages printed while importing are printed once, by the server, not by each command;
- Python's hash seed is the server's (numpy's global generator is reseeded in each child, as a fresh process seeds
  it; torch's default seed is the same fixed one in both);
- libraries read some environment variables once, at import: they see the server's environment (the tests' own);
- the command is a child of the server in a process group of its own, not a child of its caller: a caller that
  looks at its children, or signals its own group, finds a nested command's stand-in instead (the stand-in passes
  signals on; one killed outright has the server kill its command's group a moment later). Tests that measure a
  tool's child processes do not ask for nested commands.
A call whose environment differs from the tests' own only by PYTHONPATH runs here with that path's folders put on its
`sys.path` (the modules they hold are not imported in the server). These run in a fresh interpreter
(`commands.run_python`): a call with `fresh=True` (the tests that read what a command prints while importing), with
another `env` of its own, `python -c` and `-m` commands, every call on a machine with
CUDA (a child forked after mmengine's import has looked at CUDA cannot initialise it), and every call when
SUITE_TESTS_FRESH_PYTHON=1.

    python tests/helpers/zygote.py SOCKET                  # serves until its parent process ends, or SIGTERM
    python tests/helpers/zygote.py SOCKET --as-python ARGV  # the nested commands' stand-in for `python ARGV`

Requests are one JSON line per connection, {"argv": [tool, *args], "cwd": ..., "env": {...} or null, "nested": bool},
sent with the command's stdin, stdout and stderr as file descriptors (SCM_RIGHTS). The server answers {"pid": N} once
the child runs and {"returncode": N} when it has ended (negative: ended by a signal, as subprocess reports it); a
caller that closes its connection first has its command's process group killed, and a server that ends (its test
process gone, or SIGTERM) kills every running command's group.
"""
from __future__ import annotations

import ast
import atexit
import json
import os
import runpy
import selectors
import shlex
import signal
import socket
import sys
import threading
import traceback
from pathlib import Path
from typing import BinaryIO

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / 'tools'
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# Variables that libraries or the interpreter read once, at start or import: a nested command whose values differ
# from the server's (as its imports left them) runs in a fresh interpreter. (CUDA_VISIBLE_DEVICES is left out: the
# server serves only where there is no CUDA, and the token-labeling study sets it empty for its CPU runs.)
IMPORT_TIME_VARIABLES = ('PYTHONPATH', 'PYTHONHASHSEED', 'PYTHONIOENCODING', 'PYTHONWARNINGS',
                         'PYTHONDONTWRITEBYTECODE', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'TORCH_LOGS')


def is_tool(argv: list[str], cwd: str | Path) -> bool:
    """`argv` is `tools/TOOL.py ARGS` of this repository (what the server runs)."""
    return bool(argv) and argv[0].endswith('.py') and (Path(cwd) / argv[0]).resolve().parent == TOOLS


def send_request(connection: socket.socket, request: dict, fds: tuple[int, int, int]) -> BinaryIO:
    """Send `request` with the command's stdin, stdout and stderr `fds`; returns the reader of the server's answers
    (`read_answer`)."""
    data = json.dumps(request).encode() + b'\n'
    sent = socket.send_fds(connection, [data[:4096]], list(fds))
    connection.sendall(data[sent:])
    return connection.makefile('rb')


def send_answer(connection: socket.socket, key: str, value: int) -> None:
    """The server's answer {"pid": N} or {"returncode": N} (`read_answer` reads it)."""
    connection.sendall(json.dumps({key: value}).encode() + b'\n')


def read_answer(answers: BinaryIO, key: str) -> int:
    """The server's next answer, {"pid": N} or {"returncode": N}: its `key`."""
    line = answers.readline()
    if not line.endswith(b'\n'):
        raise ConnectionError('the tool server closed the connection')
    return json.loads(line)[key]


def receive_request(connection: socket.socket) -> tuple[dict, list[int]]:
    """A request and its file descriptors; the descriptors are closed if the request is incomplete."""
    data, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
    try:
        while not data.endswith(b'\n'):
            chunk = connection.recv(1 << 16)
            if not chunk:
                raise ConnectionError('the caller closed the connection mid-request')
            data += chunk
        request = json.loads(data)
        if len(fds) != 3:
            raise ValueError(f'{len(fds)} file descriptors, not 3')
        return request, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def preload_tools_imports() -> None:
    """Run the module-level imports of every tool (the libraries they call), none of their code."""
    for tool in sorted(TOOLS.glob('*.py')):
        tree = ast.parse(tool.read_text(), str(tool))
        imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        exec(compile(ast.Module(body=imports, type_ignores=[]), str(tool), 'exec'), {'__name__': 'preload'})


def exit_status(code: object) -> int:
    """The process's exit status for `SystemExit(code)`, as the interpreter sets it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def run_as_main(request: dict, fds: list[int], stand_in: str) -> None:
    """In the forked child: the tool as `__main__` in a process group of its own, with the request's arguments,
    directory, environment and file descriptors; never returns."""
    os.setpgid(0, 0)  # its caller signals and kills the command with the processes it starts (loader workers)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's own handler is not the tool's
    os.chdir(request['cwd'])
    for fd, received in enumerate(fds):
        os.dup2(received, fd)
        os.close(received)
    if request.get('env') is not None:
        os.environ.clear()
        os.environ.update(request['env'])
    if os.environ.get('PYTHONUNBUFFERED'):  # as `python -u`: what is printed is written at once
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(write_through=True)
    if request.get('nested'):
        sys.executable = stand_in
    tool = request['argv'][0]
    sys.argv = list(request['argv'])
    sys.path[0] = os.path.dirname(os.path.abspath(tool))  # as `python tools/TOOL` sets it
    if request.get('env') is not None:  # PYTHONPATH's folders after the tool's, as a fresh interpreter has them
        sys.path[1:1] = [os.path.abspath(path) for path in request['env'].get('PYTHONPATH', '').split(os.pathsep)
                         if path]
    if 'numpy' in sys.modules:
        sys.modules['numpy'].random.seed()  # from the OS, as a fresh interpreter's import seeds it
    status, interrupted = 0, False
    try:
        runpy.run_path(tool, run_name='__main__')
    except SystemExit as stop:
        status = exit_status(stop.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:
        traceback.print_exc()
        status = 1
    try:  # the interpreter's shutdown: non-daemon threads joined, exit functions run, buffers flushed
        threading._shutdown()
        atexit._run_exitfuncs()
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except OSError:
            status = 120  # as the interpreter ends when it cannot flush its output
        if interrupted:  # an uncaught KeyboardInterrupt ends the interpreter by SIGINT
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        os._exit(status)


def write_stand_in(socket_path: str) -> str:
    """The nested commands' `python`: an executable beside the socket that runs this file with `--as-python`, and
    the server's import-time variables beside it."""
    folder = Path(socket_path).parent
    (folder / 'variables.json').write_text(json.dumps({k: os.environ.get(k) for k in IMPORT_TIME_VARIABLES}))
    path = folder / 'python'
    command = [sys.executable, '-I', '-S', str(Path(__file__).resolve()), socket_path, '--as-python']
    path.write_text('#!/bin/sh\nexec ' + ' '.join(map(shlex.quote, command)) + ' "$@"\n')
    path.chmod(0o755)
    return str(path)


def kill_group(pid: int, number: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pid, number)
    except (ProcessLookupError, PermissionError):
        pass


class Server:
    """One process serving every request of its test process: a selector over the listening socket, each running
    command's pidfd (readable when it ends), its caller's connection (readable when the caller has gone) and the
    test process's pidfd (readable when it has ended: the server kills its commands and ends too, as on SIGTERM)."""

    def __init__(self, socket_path: str) -> None:
        self.stand_in = write_stand_in(socket_path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(socket_path)
        self.listener.listen(16)
        self.events = selectors.DefaultSelector()
        self.events.register(self.listener, selectors.EVENT_READ, ('request', 0))
        self.parent = os.pidfd_open(os.getppid())
        self.events.register(self.parent, selectors.EVENT_READ, ('parent', 0))
        self.running: dict[int, tuple[socket.socket, int]] = {}  # pid -> (caller's connection, pidfd)

    def serve(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self.end())
        while True:
            for key, _ in self.events.select():
                kind, pid = key.data
                if kind == 'request':
                    self.start()
                elif kind == 'parent':
                    self.end()
                elif kind == 'caller':  # the caller closed its connection (killed, or its own timeout)
                    kill_group(pid)
                    self.events.unregister(self.running[pid][0])
                elif pid in self.running:
                    self.finish(pid)

    def start(self) -> None:
        connection, _ = self.listener.accept()
        connection.settimeout(30)  # a caller sends its request as it connects: one that stalls is dropped
        try:
            request, fds = receive_request(connection)
        except (OSError, ValueError):
            connection.close()
            return
        pid = os.fork()
        if pid == 0:
            try:
                self.events.close()
                for handle in (self.listener, connection, *(c for c, _ in self.running.values())):
                    handle.close()
                for fd in (self.parent, *(pidfd for _, pidfd in self.running.values())):
                    os.close(fd)
                run_as_main(request, fds, self.stand_in)
            except BaseException:
                traceback.print_exc()
            os._exit(1)
        try:
            os.setpgid(pid, pid)  # as the child does: whichever runs first, the group exists before any kill
        except OSError:
            pass
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.running[pid] = (connection, pidfd)
        self.events.register(pidfd, selectors.EVENT_READ, ('ended', pid))
        try:
            send_answer(connection, 'pid', pid)
            self.events.register(connection, selectors.EVENT_READ, ('caller', pid))
        except OSError:  # the caller has gone already: so does its command
            kill_group(pid)

    def finish(self, pid: int) -> None:
        connection, pidfd = self.running.pop(pid)
        for handle in (connection, pidfd):
            if handle in self.events.get_map():
                self.events.unregister(handle)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        try:
            send_answer(connection, 'returncode', returncode)
        except OSError:
            pass  # the caller has gone
        connection.close()

    def end(self) -> None:
        for pid in self.running:
            kill_group(pid)
        os._exit(0)


def as_python(socket_path: str, argv: list[str]) -> None:
    """`python ARGV` for a nested command: a tool through the server (the signals it gets passed on to the command's
    process group, ended as the command ends), anything else in the real interpreter, as is a tool whose import-time
    variables differ from the server's."""
    forwarded = [n for n in FORWARDED_SIGNALS if signal.getsignal(n) != signal.SIG_IGN]  # ignored stays ignored
    signal.pthread_sigmask(signal.SIG_BLOCK, forwarded)  # held until the command runs, then passed on
    server_variables = json.loads(Path(socket_path).with_name('variables.json').read_text())
    if not is_tool(argv, os.getcwd()) or any(os.environ.get(k) != v for k, v in server_variables.items()):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, forwarded)
        os.execv(sys.executable, [sys.executable, *argv])
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(socket_path)
    answers = send_request(connection, {'argv': argv, 'cwd': os.getcwd(), 'env': dict(os.environ), 'nested': True},
                           (0, 1, 2))
    pid = read_answer(answers, 'pid')
    for number in forwarded:
        signal.signal(number, lambda received, _: kill_group(pid, received))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, forwarded)
    returncode = read_answer(answers, 'returncode')
    if returncode < 0:  # ended by a signal: so does this process (SIGKILL and SIGSTOP keep their action)
        number = -returncode
        if number not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [number])
        os.kill(os.getpid(), number)
        os._exit(128 + number)
    sys.exit(returncode)


if __name__ == '__main__':
    if sys.argv[2:3] == ['--as-python']:
        as_python(sys.argv[1], sys.argv[3:])
    else:
        preload_tools_imports()
        sys.stdout.flush()
        sys.stderr.flush()
        Server(sys.argv[1]).serve()
