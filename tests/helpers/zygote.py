"""A tool server for the tests: one Python process that has imported what the tools import, then forks a child per
command, which runs `tools/TOOL ARGS` as its `__main__` exactly as `python tools/TOOL ARGS` would, output to files.

Why: a fresh interpreter spends 3 to 5 s importing torch, timm and mmseg before a tool's first line, and the suite runs
its tools some 150 times (about 10 minutes of a 2-core machine's test time). A forked child starts with those modules
already imported and then runs the tool's own code unchanged, in a process of its own, with the tests' environment.

What differs from a fresh interpreter, and is therefore left to fresh processes (`commands.run_python(fresh=True)`,
or every command with SUITE_TESTS_FRESH_PYTHON=1): messages printed while importing (the tests that look for notices
in a run's output run fresh), environment variables other than the tests' own (read at import by some libraries),
and `python -c` or `-m` commands.

    python tests/helpers/zygote.py SOCKET     # serves until the socket is closed or the process is ended

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
    status = 0
    try:
        runpy.run_path(tool, run_name='__main__')
    except SystemExit as stop:
        status = exit_status(stop.code)
    except BaseException:  # noqa: BLE001 - the interpreter's own handling of an uncaught exception
        traceback.print_exc()
        status = 1
    try:  # the interpreter's shutdown: non-daemon threads joined, exit functions run, buffers flushed
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


def serve(socket_path: str) -> None:
    preload_tools_imports()
    sys.stdout.flush()
    sys.stderr.flush()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path)
    server.listen(4)
    while True:
        connection, _ = server.accept()
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
