"""The suite's one logger: library code reports through it, and the commands show it on standard output."""
from __future__ import annotations

import logging
import sys
from typing import TextIO

logger = logging.getLogger('vit_dense')
_HANDLER_NAME = 'vit_dense.stdout'


def show_log(main_process: bool = True, stream: TextIO | None = None) -> None:
    """The suite's messages as plain lines on stdout (or `stream`): INFO and up on the main process, else errors."""
    handler = next((h for h in logger.handlers if h.get_name() == _HANDLER_NAME), None)
    if handler is None:
        handler = logging.StreamHandler(stream or sys.stdout)
        handler.set_name(_HANDLER_NAME)
        handler.setFormatter(logging.Formatter('%(message)s'))
        logger.addHandler(handler)
        logger.propagate = False
    elif stream is not None:
        handler.setStream(stream)
    logger.setLevel(logging.INFO if main_process else logging.ERROR)
