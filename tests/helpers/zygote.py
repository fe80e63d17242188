"""A tool server for the tests: one Python process that has run the module-level imports of every tool (torch, timm,
mmengine, mmseg and the suite's own packages), then forks a child per command, which runs `tools/TOOL ARGS` as its
`__main__`, as `python tools/TOOL ARGS` would, with the caller's stdin, stdout and stderr.

Why: a fresh interpreter spends 3 to 5 s importing torch, timm and mmseg before a tool's first line, and the suite runs
its tools some 150 times (about 10 minutes of a 2-core machine's test time). A forked child starts with those modules
already imported and then runs the tool's own code unchanged, in a process of its own.

Nested commands: a tool that runs the suite's tools itself (the token-labeling reproduction runs some 30) is given, in
a request with "nested": true, a `sys.executable` of the server's own (`python` in the server's folder). That stand-in
sends `python tools/TOOL ARGS` to this server, with its environment, directory and file descriptors, passes on the
signals it gets and ends as the command ends (by the same signal, or with the same status); anything else it runs in
the real interpreter. The command's process is then a child of the server, not of the tool that started it.

What differs from a fresh interpreter:
- every tool sees the modules every other tool imports (a tool using a submodule it never imports would pass here);
- messages printed while importing are printed once, by the server, not by each command;
- Python's hash seed is the server's (numpy's global generator is reseeded in each child, as a fresh process seeds
  it; torch's default seed is the same fixed one in both);
- libraries read some environment variables once, at import: they see the server's environment (the tests' own).
So these run in a fresh interpreter (`commands.run_python`): a call with `fresh=True` (the tests that read what a
command prints while importing), with an `env` of its own, `python -c` and `-m` commands, every call on a machine with
CUDA (a child forked after mmengine's import has looked at CUDA cannot initialise it), and every call when
SUITE_TESTS_FRESH_PYTHON=1.

    python tests/helpers/zygote.py SOCKET                  # serves until its parent process ends
    python tests/helpers/zygote.py SOCKET --as-python ARGV  # the nested commands' stand-in for `python ARGV`

Requests are one JSON line per connection, {"argv": [tool, *args], "cwd": ..., "env": {...} or null, "nested": bool},
sent with the command's stdin, stdout and stderr as file descriptors (SCM_RIGHTS). The server answers {"pid": N} once
the child runs and {"returncode": N} when it has ended (negative: ended by a signal, as subprocess reports it); a
caller that closes its connection first has its command killed.
"""
from __future__ import annotations

import ast
import atexit
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import threading
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / 'tools'
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def is_tool(argv: list[str], cwd: str | Path) -> bool:
    """`argv` is `tools/TOOL.py ARGS` of this repository (what the server runs)."""
    return bool(argv) and argv[0].endswith('.py') and (Path(cwd) / argv[0]).resolve().parent == TOOLS


def send_request(connection: socket.socket, request: dict, fds: tuple[int, int, int]) -> int:
    """Send `request` with the command's stdin, stdout and stderr `fds`; returns the command's pid."""
    data = json.dumps(request).encode() + b'\n'
    sent = socket.send_fds(connection, [data[:4096]], list(fds))
    connection.sendall(data[sent:])
    return read_answer(connection, 'pid')


def read_answer(connection: socket.socket, key: str) -> int:
    line = b''
    while not line.endswith(b'\n'):
        chunk = connection.recv(4096)
        if not chunk:
            raise ConnectionError('the tool server closed the connection')
        line += chunk
    return json.loads(line)[key]


def receive_request(connection: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
    while not data.endswith(b'\n'):
        chunk = connection.recv(1 << 16)
        if not chunk:
            raise ConnectionError('the caller closed the connection mid-request')
        data += chunk
    return json.loads(data), fds


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
    """In the forked child: the tool as `__main__` with the request's arguments, directory, environment and file
    descriptors; never returns."""
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
    except BaseException:  # noqa: BLE001 - the interpreter's own handling of an uncaught exception
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
    """The nested commands' `python`: an executable beside the socket that runs this file with `--as-python`."""
    path = Path(socket_path).with_name('python')
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "{Path(__file__).resolve()}" "{socket_path}" '
                    f'--as-python "$@"\n')
    path.chmod(0o755)
    return str(path)


def serve(socket_path: str) -> None:
    """One process serving every request of its test process: a selector over the listening socket, each running
    command's pidfd (readable when it ends) and its caller's connection (readable when the caller has gone)."""
    preload_tools_imports()
    sys.stdout.flush()
    sys.stderr.flush()
    stand_in = write_stand_in(socket_path)
    parent = os.getppid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path)
    server.listen(16)
    events = selectors.DefaultSelector()
    events.register(server, selectors.EVENT_READ)
    running: dict[int, tuple[socket.socket, int]] = {}  # pid -> (caller's connection, pidfd)

    def finish(pid: int) -> None:
        connection, pidfd = running.pop(pid)
        for handle in (connection, pidfd):
            if handle in events.get_map():  # a caller that has gone is no longer watched
                events.unregister(handle)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        try:
            connection.sendall(json.dumps({'returncode': returncode}).encode() + b'\n')
        except OSError:
            pass  # the caller has gone
        connection.close()

    while True:
        ready = events.select(timeout=2.0)
        if not ready and os.getppid() != parent:  # the test process has gone: so do its server and commands
            for pid in running:
                os.kill(pid, signal.SIGKILL)
            return
        for key, _ in ready:
            kind, pid = key.data or ('listen', 0)
            if kind == 'listen':
                connection, _ = server.accept()
                request, fds = receive_request(connection)
                pid = os.fork()
                if pid == 0:
                    events.close()
                    for handle in (server, *(c for c, _ in running.values()), connection):
                        handle.close()
                    for _, pidfd in running.values():
                        os.close(pidfd)
                    run_as_main(request, fds, stand_in)
                for fd in fds:
                    os.close(fd)
                connection.sendall(json.dumps({'pid': pid}).encode() + b'\n')
                pidfd = os.pidfd_open(pid)
                running[pid] = (connection, pidfd)
                events.register(pidfd, selectors.EVENT_READ, ('ended', pid))
                events.register(connection, selectors.EVENT_READ, ('caller', pid))
            elif kind == 'caller':  # the caller closed its connection (killed, or its own timeout): end its command
                if pid in running:
                    os.kill(pid, signal.SIGKILL)
                    events.unregister(running[pid][0])
            elif pid in running:
                finish(pid)


def as_python(socket_path: str, argv: list[str]) -> None:
    """`python ARGV` for a nested command: a tool through the server (signals passed on, ended as the command ends),
    anything else in the real interpreter."""
    if not is_tool(argv, os.getcwd()):
        os.execv(sys.executable, [sys.executable, *argv])
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(socket_path)
    request = {'argv': argv, 'cwd': os.getcwd(), 'env': dict(os.environ), 'nested': True}
    pid = send_request(connection, request, (0, 1, 2))
    def pass_on(received: int, _frame: object) -> None:
        try:
            os.kill(pid, received)
        except ProcessLookupError:
            pass  # it has just ended: its status follows

    for number in FORWARDED_SIGNALS:
        signal.signal(number, pass_on)
    returncode = read_answer(connection, 'returncode')
    if returncode < 0:
        signal.signal(-returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
    sys.exit(returncode)


if __name__ == '__main__':
    if sys.argv[2:3] == ['--as-python']:
        as_python(sys.argv[1], sys.argv[3:])
    else:
        serve(sys.argv[1])
