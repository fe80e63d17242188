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
# mmengine log lines, by a pattern of the whole line
HARMLESS_LOG_PATTERNS = {
    r'\S+ is skipped since its requires_grad=False$': 'a frozen backbone\'s parameters, which its optimizer rightly '
    'leaves out (mmengine says so of each: 191 lines for LV-ViT-S)',
}
# a detector's export (torch.export and torch's ONNX exporter tracing torchvision's nms), by their start
HARMLESS_EXPORT_WARNINGS = {  # FutureWarning
    '`create_unbacked_symint` is deprecated': 'torchvision 0.29\'s own nms meta kernel calls it, once per trace',
}
HARMLESS_EXPORT_LOG_LINES = {  # the ONNX IR's logger
    'Attribute type is ambiguous because it is an empty sequence': 'an empty attribute torch\'s exporter writes, '
    'taken as the type it is (INTS); the ONNX file is checked in onnxruntime against the model',
}
ONNX_IR_LOGGER = 'onnx_ir._convenience'


def silence_harmless_warnings() -> None:
    for start in HARMLESS_WARNINGS:
        warnings.filterwarnings('ignore', message=re.escape(start), category=UserWarning)
    for start in HARMLESS_EXPORT_WARNINGS:
        warnings.filterwarnings('ignore', message=re.escape(start), category=FutureWarning)
    logging.getLogger(ONNX_IR_LOGGER).addFilter(HarmlessLogLines(HARMLESS_EXPORT_LOG_LINES, patterns={}))


class HarmlessLogLines(logging.Filter):
    """A logger filter dropping the lines starting as `lines` or matching `patterns`."""

    def __init__(self, lines: dict[str, str] = HARMLESS_LOG_LINES,
                 patterns: dict[str, str] = HARMLESS_LOG_PATTERNS) -> None:
        super().__init__()
        self.starts = tuple(lines)
        self.patterns = [re.compile(pattern) for pattern in patterns]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith(self.starts) or any(pattern.match(message) for pattern in self.patterns))
