"""How every command runs (`run_command`): the suite's errors (`SuiteError`) and storage faults (`STORAGE_ERRORS`)
print as one line with exit status 2; `AlreadyDone` says so and exits with 0; `Interrupted` exits with 75; the log
goes to standard output. `--debug`, or SUITE_DEBUG=1, shows the traceback instead; other errors keep theirs."""
from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable

from backbones.common.errors import AlreadyDone, Interrupted, SuiteError
from backbones.common.lifecycle import interrupt_on_stop_signals
from backbones.common.log import show_log

EXIT_CODE = 2
# a disk that is full or over quota, read-only, or refuses a file: the path and the reason are the whole story
STORAGE_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG)


def one_line(exc: BaseException) -> str:
    """The message of an error; of one re-raised by a loader worker, the original error's message."""
    text = str(exc).strip()
    if 'Original Traceback' in text:
        text = text.splitlines()[-1].split(': ', 1)[-1]
    return text


DEBUG_HINT = '(--debug shows the traceback)'


def run_command(main: Callable[[], object]) -> None:
    """Run a command's `main`: the suite's errors become one line on stderr and exit status 2 (see module doc)."""
    debug = '--debug' in sys.argv or os.environ.get('SUITE_DEBUG', '') not in ('', '0')
    sys.argv = [arg for arg in sys.argv if arg != '--debug']
    show_log()
    interrupt_on_stop_signals()
    try:
        status = main()
    except Interrupted as exc:
        print(f'interrupted: {one_line(exc)}', file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        if debug:
            raise
        # Ctrl-C: the writes are atomic, so nothing half-written is left; 130 is the shell's status for SIGINT
        print('interrupted: SIGINT (Ctrl-C) before the command\'s work was done (nothing half-written is left): run '
              'the same command again', file=sys.stderr)
        sys.exit(130)
    except AlreadyDone as exc:
        print(f'nothing to do: {one_line(exc)}', file=sys.stderr)
        sys.exit(0)
    except (SuiteError, OSError) as exc:
        if debug or (isinstance(exc, OSError) and exc.errno not in STORAGE_ERRORS):
            raise
        message = f'{one_line(exc)}{storage_hint(exc)}'
        # an error quoting a failed inner command's output may end with that command's hint already
        hint = '' if message.endswith(DEBUG_HINT) else f'  {DEBUG_HINT}'
        print(f'error: {message}{hint}', file=sys.stderr)
        sys.exit(EXIT_CODE)
    if isinstance(status, int):  # a command's own exit status; other return values are results, not statuses
        sys.exit(status)


def write_document(text: str) -> None:
    """A command's result document (JSON) on standard output, its log then on standard error."""
    print(text, flush=True)


def storage_hint(exc: BaseException) -> str:
    """What to do about a file that could not be written."""
    if not isinstance(exc, OSError):
        return ''
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return ('; nothing was left half-written: free space there and run again (a training run continues with '
                '--resume, a label store where it stopped)')
    return '; give an output path elsewhere'
