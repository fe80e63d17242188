"""mmseg's IoUMetric, with unrounded results and a JSON report of the per-class table."""
from __future__ import annotations

import json
import math
from pathlib import Path
from collections.abc import Sequence

import numpy as np
import torch
from mmengine.dist import is_main_process

from backbones.common.errors import DataError
from backbones.common.files import write_json_atomic
from backbones.common.log import logger
from mmseg.evaluation import IoUMetric
from mmseg.registry import METRICS


def summarise_areas(intersect: torch.Tensor, union: torch.Tensor, pred: torch.Tensor, label: torch.Tensor,
                    classes: Sequence[str]) -> dict:
    """mIoU, mAcc, aAcc (percent; classes absent from ground truth and prediction left out of the means, as mmseg)
    and the class table, from mmseg's own per-class arithmetic (`IoUMetric.total_area_to_metrics`); and the classes
    the ground truth holds no pixel of (`unlabelled`: the means leave them out or count them at 0, so that a set
    that labels only its background scores 100)."""
    with np.errstate(divide='ignore', invalid='ignore'):
        table = IoUMetric.total_area_to_metrics(intersect, union, pred, label, ['mIoU'])

    def percent(value: float) -> float | None:
        return None if math.isnan(value) else float(value) * 100

    return {
        'mIoU': percent(np.nanmean(table['IoU'])), 'aAcc': percent(table['aAcc']),
        'mAcc': percent(np.nanmean(table['Acc'])),
        'per_class': {name: {'IoU': percent(i), 'Acc': percent(a)}
                      for name, i, a in zip(classes, table['IoU'], table['Acc'])},
        'unlabelled': [name for name, pixels in zip(classes, label.tolist()) if pixels == 0],
    }


def unlabelled_warning(report: dict) -> str | None:
    """A line saying which classes the ground truth holds no pixel of, and what that does to the means; None when it
    holds every class."""
    missing, count = report['unlabelled'], len(report['per_class'])
    if not missing:
        return None
    return (f'warning: {len(missing)} of {count} classes have no pixel in the ground truth ({", ".join(missing[:5])}'
            f'{", ..." if len(missing) > 5 else ""}): mAcc averages over the other {count - len(missing)}, and mIoU '
            f'leaves them out too unless they are predicted (then at 0); these scores do not measure those classes')


@METRICS.register_module()
class IoUReport(IoUMetric):
    """IoUMetric (mIoU) that returns unrounded mIoU/mAcc/aAcc and, with `json_file`, writes them and the per-class
    IoU/Acc table there as {"mIoU", "aAcc", "mAcc", "per_class": {class: {"IoU", "Acc"}}} (percent)."""

    def __init__(self, json_file: str | None = None, **kwargs) -> None:
        super().__init__(iou_metrics=['mIoU'], **kwargs)
        self.json_file = json_file

    def compute_metrics(self, results: list) -> dict[str, float]:
        super().compute_metrics(results)  # logs mmseg's per-class table
        areas = (torch.stack(area).sum(0).cpu().double() for area in zip(*results))
        report = summarise_areas(*areas, self.dataset_meta['classes'])
        warning = unlabelled_warning(report)
        if warning:
            logger.warning(warning)
        if self.json_file and is_main_process():
            Path(self.json_file).parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.json_file, report)
        return {key: report[key] for key in ('aAcc', 'mIoU', 'mAcc')}


def read_report(path: str | Path, classes: Sequence[str]) -> dict:
    """A report `IoUReport` wrote (tools/test_seg.py --out) for a data set of `classes`; a file that is no such report
    (damaged, another kind of JSON, or for other classes) is a DataError naming it."""
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f'{path}: not a readable test_seg.py report ({type(e).__name__}: {e})') from e
    keys = ('mIoU', 'aAcc', 'mAcc', 'per_class')
    if not isinstance(report, dict) or not all(k in report for k in keys) or not isinstance(report['per_class'], dict):
        raise DataError(f'{path}: not a test_seg.py report (it needs {", ".join(keys)}); write one with '
                        f'tools/test_seg.py --out')
    named = list(report['per_class'])
    if named != list(classes):
        raise DataError(f'{path}: a report on {len(named)} classes ({", ".join(named[:3])}, ...), not on this data '
                        f'set\'s {len(classes)} ({", ".join(classes[:3])}, ...)')
    return report
