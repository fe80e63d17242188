"""mmseg's IoUMetric, with unrounded results and a JSON report of the per-class table."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import torch
from mmengine.dist import is_main_process

from classification.checkpointing import write_json_atomic
from mmseg.evaluation import IoUMetric
from mmseg.registry import METRICS


def summarise_areas(intersect: np.ndarray, union: np.ndarray, label: np.ndarray, classes) -> dict:
    """mIoU, mAcc, aAcc (percent, classes absent from ground truth and prediction left out) and the class table."""
    with np.errstate(divide='ignore', invalid='ignore'):
        iou = intersect / union
        acc = intersect / label

    def percent(value: float) -> Optional[float]:
        return None if math.isnan(value) else float(value) * 100

    return {
        'mIoU': percent(np.nanmean(iou)), 'aAcc': percent(intersect.sum() / label.sum()),
        'mAcc': percent(np.nanmean(acc)),
        'per_class': {name: {'IoU': percent(i), 'Acc': percent(a)} for name, i, a in zip(classes, iou, acc)},
    }


@METRICS.register_module()
class IoUReport(IoUMetric):
    """IoUMetric (mIoU) that returns unrounded mIoU/mAcc/aAcc and, with `json_file`, writes them and the per-class
    IoU/Acc table there as {"mIoU", "aAcc", "mAcc", "per_class": {class: {"IoU", "Acc"}}} (percent)."""

    def __init__(self, json_file: Optional[str] = None, **kwargs) -> None:
        super().__init__(iou_metrics=['mIoU'], **kwargs)
        self.json_file = json_file

    def compute_metrics(self, results: list) -> Dict[str, float]:
        super().compute_metrics(results)  # logs mmseg's per-class table
        intersect, union, _, label = (torch.stack(areas).sum(0).cpu().double().numpy() for areas in zip(*results))
        report = summarise_areas(intersect, union, label, self.dataset_meta['classes'])
        if self.json_file and is_main_process():
            Path(self.json_file).parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.json_file, report)
        return {key: report[key] for key in ('aAcc', 'mIoU', 'mAcc')}
