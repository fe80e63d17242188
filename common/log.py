"""The suite's one logger: library code reports through it, and the commands show it on standard output."""
from __future__ import annotations

import logging
import sys

logger = logging.getLogger('vit_dense')
_HANDLER_NAME = 'vit_dense.stdout'


def show_log(main_process: bool = True) -> None:
    """Print the suite's messages as plain lines on standard output: INFO and up on the main process, errors only on
    the others (under torchrun every process runs the same code)."""
    if not any(handler.get_name() == _HANDLER_NAME for handler in logger.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler.set_name(_HANDLER_NAME)
        handler.setFormatter(logging.Formatter('%(message)s'))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.INFO if main_process else logging.ERROR)
