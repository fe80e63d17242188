"""The notices mmseg 1.2.2 and mmengine 0.10.7 print on every run that ask nothing of a user of the suite: they are
silenced, each for the reason given; any other warning still shows."""
from __future__ import annotations

import logging
import re
import warnings

# Python warnings, by the start of their message
HARMLESS_WARNINGS = {
    '``build_loss`` would be deprecated': 'mmseg builds its heads\' losses this way itself',
    'Default ``avg_non_ignore`` is False': 'the configs keep mmseg 0.x\'s loss averaging, as the papers trained',
}
# mmengine log lines (its logger), by their start
HARMLESS_LOG_LINES = {
    'The prefix is not set in metric class': 'a prefix would rename the metrics (mIoU) every tool reads',
    '"FileClient" will be deprecated': 'mmengine\'s own hooks build one',
    '"HardDiskBackend" is the alias of "LocalBackend"': 'mmengine\'s own hooks build one',
}


def silence_harmless_warnings() -> None:
    for start in HARMLESS_WARNINGS:
        warnings.filterwarnings('ignore', message=re.escape(start), category=UserWarning)


class HarmlessLogLines(logging.Filter):
    """A filter for mmengine's logger that drops `HARMLESS_LOG_LINES`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(tuple(HARMLESS_LOG_LINES))
