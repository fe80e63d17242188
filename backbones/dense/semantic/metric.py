"""mmseg's IoUMetric, with unrounded results and a JSON report of the per-class table."""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from mmengine.dist import is_main_process
from mmseg.evaluation import IoUMetric
from mmseg.registry import METRICS
from PIL import Image

from backbones.common.errors import DataError
from backbones.common.files import write_json_atomic
from backbones.common.log import logger
from backbones.dense.layouts import annotation_values


def summarise_areas(intersect: torch.Tensor, union: torch.Tensor, pred: torch.Tensor, label: torch.Tensor,
                    classes: Sequence[str], metrics: Sequence[str] = ('mIoU',), nan_to_num: float | None = None,
                    beta: float = 1) -> dict:
    """mIoU, mAcc, aAcc and the means of the other `metrics` mmseg's IoUMetric computes, in percent, with mmseg's
    arithmetic; the class table; the classes without ground-truth pixels (`unlabelled`)."""
    with np.errstate(divide='ignore', invalid='ignore'):
        table = IoUMetric.total_area_to_metrics(intersect, union, pred, label, list(dict.fromkeys(['mIoU', *metrics])),
                                                nan_to_num, beta)

    def percent(value: float) -> float | None:
        return None if math.isnan(value) else float(value) * 100

    per_class = {key: np.asarray(value) for key, value in table.items() if key != 'aAcc'}
    means = {'mIoU': percent(np.nanmean(per_class['IoU'])), 'aAcc': percent(table['aAcc']),
             **{f'm{key}': percent(np.nanmean(values)) for key, values in per_class.items() if key != 'IoU'}}
    return {
        **means,
        'per_class': {name: {key: percent(values[i]) for key, values in per_class.items()}
                      for i, name in enumerate(classes)},
        'unlabelled': [name for name, pixels in zip(classes, label.tolist()) if pixels == 0],
    }


def confusion_pairs(pred: torch.Tensor, label: torch.Tensor, num_classes: int, ignore_index: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """One image's confusion matrix, sparse: the cells (ground truth x num_classes + prediction) its pixels fall in
    and their counts, ignored pixels and labels outside the classes left out as mmseg's IoUMetric does."""
    kept = (label != ignore_index) & (label >= 0) & (label < num_classes)
    cells = label[kept].long() * num_classes + pred[kept].long()
    cells, counts = torch.unique(cells, return_counts=True)
    return cells.cpu(), counts.cpu()


def confusion_matrix(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], num_classes: int) -> np.ndarray:
    """The (ground truth, prediction) pixel counts of the images `confusion_pairs` gave."""
    matrix = np.zeros(num_classes * num_classes, np.int64)
    for cells, counts in pairs:
        np.add.at(matrix, cells.numpy(), counts.numpy())
    return matrix.reshape(num_classes, num_classes)


def row_shares(matrix: np.ndarray) -> np.ndarray:
    """A confusion matrix's rows normalised (NaN in the row of a class without ground-truth pixels)."""
    totals = matrix.sum(1, keepdims=True)
    with np.errstate(divide='ignore', invalid='ignore'):
        return np.where(totals > 0, matrix / totals, np.nan)


def confusion_report(matrix: np.ndarray) -> dict:
    """The report's confusion matrix: `counts` (row: the ground truth's class, column: the predicted class, in the
    order of `per_class`) and `normalised` (`row_shares`; a class without ground-truth pixels has a row of nulls)."""
    return {'rows': 'ground truth', 'columns': 'prediction', 'counts': matrix.tolist(),
            'normalised': [[None if np.isnan(v) else float(v) for v in row] for row in row_shares(matrix)]}


def unlabelled_warning(report: dict) -> str | None:
    """A line naming the classes the ground truth holds no pixel of, and what that does to the means; else None."""
    missing, count = report['unlabelled'], len(report['per_class'])
    if not missing:
        return None
    return (f'warning: {len(missing)} of {count} classes have no pixel in the ground truth ({", ".join(missing[:5])}'
            f'{", ..." if len(missing) > 5 else ""}): mAcc averages over the other {count - len(missing)}, and mIoU '
            f'leaves them out too unless they are predicted (then at 0); these scores do not measure those classes')


MMSEG_ORDER = {'aAcc': 0, 'mIoU': 1, 'mAcc': 2}


@METRICS.register_module()
class IoUReport(IoUMetric):
    """IoUMetric returning unrounded means (mIoU, mAcc, aAcc; those `iou_metrics` asks for) and writing them with the
    per-class table and the confusion matrix (`confusion_report`) to `json_file`, in percent."""

    def __init__(self, json_file: str | None = None, iou_metrics: Sequence[str] = ('mIoU',), **kwargs) -> None:
        super().__init__(iou_metrics=list(iou_metrics), **kwargs)
        self.json_file = json_file
        # the label maps are written here, in the data set's values (mmseg's writes class indices, + 1 for ADE20K)
        self.labels_dir, self.output_dir = self.output_dir, None

    def process(self, data_batch: dict, data_samples: Sequence[dict]) -> None:
        """mmseg's areas of each image with its `confusion_pairs`; each label map written into `output_dir`."""
        super().process(data_batch, data_samples)
        if self.labels_dir is not None:
            for sample in data_samples:
                values = annotation_values(sample['pred_sem_seg']['data'].squeeze().cpu().numpy(), self.dataset_meta)
                path = Path(self.labels_dir) / f'{Path(sample["img_path"]).stem}.png'
                Image.fromarray(values.astype(np.uint8)).save(path)
        if self.format_only:
            return
        num_classes = len(self.dataset_meta['classes'])
        pairs = [confusion_pairs(sample['pred_sem_seg']['data'].squeeze(), sample['gt_sem_seg']['data'].squeeze(),
                                 num_classes, self.ignore_index) for sample in data_samples]
        first = len(self.results) - len(pairs)
        self.results[first:] = [(*areas, pair) for areas, pair in zip(self.results[first:], pairs)]

    def compute_metrics(self, results: list) -> dict[str, float]:
        if self.format_only:  # a test set without ground truth: the label maps alone
            logger.info(f'label maps written to {self.labels_dir}')
            return {}
        areas_of_images = [result[:4] for result in results]
        super().compute_metrics(areas_of_images)  # logs mmseg's per-class table
        areas = (torch.stack(area).sum(0).cpu().double() for area in zip(*areas_of_images))
        classes = self.dataset_meta['classes']
        report = summarise_areas(*areas, classes, self.metrics, self.nan_to_num, self.beta)
        report['confusion'] = confusion_report(confusion_matrix([result[4] for result in results], len(classes)))
        warning = unlabelled_warning(report)
        if warning:
            logger.warning(warning)
        if self.json_file and is_main_process():
            Path(self.json_file).parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.json_file, report)
        means = [key for key in report if key not in ('per_class', 'unlabelled', 'confusion')]
        # mmseg's order (aAcc, mIoU, mAcc, then the others asked), which its log line keeps
        return {key: report[key] for key in sorted(means, key=lambda key: MMSEG_ORDER.get(key, len(MMSEG_ORDER)))}


def read_json_report(path: str | Path):
    """A test_seg.py report's JSON, unchecked; a file that does not read as JSON is a DataError naming it."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f'{path}: not a readable test_seg.py report ({type(e).__name__}: {e})') from e


def read_report(path: str | Path, classes: Sequence[str]) -> dict:
    """A report `IoUReport` wrote for a data set of `classes`; any other file is a DataError naming it."""
    report = read_json_report(path)
    keys = ('mIoU', 'aAcc', 'mAcc', 'per_class')
    if not isinstance(report, dict) or not all(k in report for k in keys) or not isinstance(report['per_class'], dict):
        raise DataError(f'{path}: not a test_seg.py report (it needs {", ".join(keys)}); write one with '
                        f'tools/test_seg.py --out')
    named = list(report['per_class'])
    if named != list(classes):
        raise DataError(f'{path}: a report on {len(named)} classes ({", ".join(named[:3])}, ...), not on this data '
                        f'set\'s {len(classes)} ({", ".join(classes[:3])}, ...)')
    return report


def read_confusion(path: str | Path) -> tuple[list[str], np.ndarray]:
    """The classes and confusion matrix (pixel counts) of a test_seg.py report, else a DataError naming the file."""
    report = read_json_report(path)
    classes = list(report.get('per_class') or {}) if isinstance(report, dict) else []
    counts = (report.get('confusion') or {}).get('counts') if classes else None
    try:
        matrix = np.array(counts, dtype=np.int64)
    except (TypeError, ValueError):
        matrix = np.zeros(0)
    if not classes or matrix.shape != (len(classes), len(classes)) or (matrix < 0).any():
        raise DataError(f'{path}: not a test_seg.py report with a confusion matrix of its classes ("per_class" and '
                        f'"confusion": {{"counts"}}, classes x classes); write one with tools/test_seg.py --out')
    return classes, matrix


def top_confusions(classes: Sequence[str], matrix: np.ndarray, count: int) -> list[tuple[str, str, float, int]]:
    """The `count` largest confusions (truth, prediction, share of the truth's pixels, pixels), largest share first."""
    shares = row_shares(matrix)
    cells = [(shares[t, p], int(matrix[t, p]), t, p) for t, p in zip(*np.nonzero(matrix)) if t != p]
    cells.sort(key=lambda cell: (-cell[0], -cell[1], cell[2], cell[3]))
    return [(classes[t], classes[p], float(share), pixels) for share, pixels, t, p in cells[:count]]
