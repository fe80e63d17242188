"""A tool server for the tests: one Python process that has run the module-level imports of every tool (torch, timm,
mmengine, mmseg and the suite's own packages), then forks a child per command, which runs `tools/TOOL ARGS` as its
`__main__`, as `python tools/TOOL ARGS` would, output to files.

Why: a fresh interpreter spends 3 to 5 s importing torch, timm and mmseg before a tool's first line, and the suite runs
its tools some 150 times (about 10 minutes of a 2-core machine's test time). A forked child starts with those modules
already imported and then runs the tool's own code unchanged, in a process of its own, with the tests' environment.

What differs from a fresh interpreter:
- every tool sees the modules every other tool imports (a tool using a submodule it never imports would pass here);
- messages printed while importing are printed once, by the server, not by each command;
- Python's hash seed is the server's (numpy's global generator is reseeded in each child, as a fresh process seeds
  it; torch's default seed is the same fixed one in both);
- the environment is the tests' own as the server started (libraries read some variables at import).
So these run in a fresh interpreter (`commands.run_python`): a call with `fresh=True` (the tests that read what a
command prints while importing), with an `env` of its own, `python -c` and `-m` commands, every call on a machine with
CUDA (a child forked after mmengine's import has looked at CUDA cannot initialise it), and every call when
SUITE_TESTS_FRESH_PYTHON=1.

    python tests/helpers/zygote.py SOCKET     # serves until its parent process ends

Requests are one JSON line per connection: {"argv": [tool, *args], "cwd": ..., "stdout": file, "stderr": file}; the
server answers {"pid": N} once the child runs and {"returncode": N} when it has ended (negative: ended by a signal,
as subprocess reports it).
"""
from __future__ import annotations

import ast
import atexit
import json
import os
import runpy
import signal
import socket
import sys
import threading
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def preload_tools_imports() -> None:
    """Run the module-level imports of every tool (the libraries they call), none of their code."""
    for tool in sorted((ROOT / 'tools').glob('*.py')):
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


def run_as_main(request: dict) -> None:
    """In the forked child: the tool as `__main__` with the request's arguments, directory and output files; never
    returns."""
    os.chdir(request['cwd'])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request['stdout'], os.O_WRONLY | os.O_CREAT),
                            (2, request['stderr'], os.O_WRONLY | os.O_CREAT)):
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
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


def serve(socket_path: str) -> None:
    preload_tools_imports()
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getppid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path)
    server.listen(4)
    server.settimeout(2.0)
    while True:
        try:
            connection, _ = server.accept()
        except TimeoutError:
            if os.getppid() != parent:  # the test process has gone: so does its server
                return
            continue
        connection.settimeout(None)
        with connection:
            request = json.loads(connection.makefile().readline())
            pid = os.fork()
            if pid == 0:
                server.close()
                connection.close()
                run_as_main(request)
            connection.sendall(json.dumps({'pid': pid}).encode() + b'\n')
            _, status = os.waitpid(pid, 0)
            returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            try:
                connection.sendall(json.dumps({'returncode': returncode}).encode() + b'\n')
            except OSError:
                pass  # the test that asked has gone (stopped by its timeout)


if __name__ == '__main__':
    serve(sys.argv[1])
