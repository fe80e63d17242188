"""Kill a training command at each of its checkpoint write points in turn, and resume it (used by the tests).

    python tests/helpers/kill_at_write.py TOOL OUT_ROOT ARGS...      (ARGS without --output)

A write point is one of the two moments of an atomic write of last.pth, best.pth or metrics.json: the temporary
file complete but not yet renamed over the target, and just after the rename. The command runs once to the end in
OUT_ROOT/straight, listing the points it passes; then, for each point N, in OUT_ROOT/kill_N: it is SIGKILLed at
point N, and the same command with --resume finishes the run. Each run is a forked child of this process, which
imports the code once (and runs nothing in torch itself, so forking is safe). Prints a JSON summary.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from backbones.common.errors import AlreadyDone
from classification import train, transfer

TOOLS = {'train_cls.py': train.main, 'transfer_cifar.py': transfer.main}
TARGETS = ('last.pth', 'best.pth', 'metrics.json')


def install_write_points(kill_at: int, record: Path) -> None:
    """Wrap os.replace so that each write point is recorded, and the process SIGKILLed at number `kill_at`."""
    real_replace, passed = os.replace, []

    def point(label: str) -> None:
        passed.append(label)
        with open(record, 'a') as f:
            f.write(label + '\n')
        if len(passed) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def replace(src, dst, *args, **kwargs):
        name = Path(dst).name
        tracked = name in TARGETS and Path(src).name.startswith(f'.{name}.tmp')
        if tracked:
            point(f'before {name}')
        real_replace(src, dst, *args, **kwargs)
        if tracked:
            point(f'after {name}')

    os.replace = replace


def run_forked(main: Callable[[list[str]], object], argv: list[str], kill_at: int, record: Path) -> int:
    """Run main(argv) in a child process; its exit code (negative: the signal that ended it)."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            install_write_points(kill_at, record)
            main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except AlreadyDone:  # the run was finished (a kill after metrics.json): as run_command, exit status 0
            code = 0
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main() -> None:
    tool, out_root, args = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    command = TOOLS[tool]
    out_root.mkdir(parents=True, exist_ok=True)
    straight = out_root / 'straight'
    summary = {'straight': run_forked(command, [*args, '--output', str(straight)], 0, out_root / 'points.txt')}
    points = (out_root / 'points.txt').read_text().splitlines()
    summary.update(points=points, killed=[], resumed=[])
    for n in range(1, len(points) + 1):
        out = out_root / f'kill_{n}'
        summary['killed'].append(run_forked(command, [*args, '--output', str(out)], n, out_root / 'ignored.txt'))
        summary['resumed'].append(run_forked(command, [*args, '--output', str(out), '--resume'], 0,
                                             out_root / 'ignored.txt'))
    print(json.dumps(summary))


if __name__ == '__main__':
    main()
