"""Pictures every dense task draws with: panels titled and set side by side, and `prediction_picture`, the picture
of a trained model's prediction that tools/visualize.py draws (each task draws its own panels: `DenseTask.picture`)."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np

from backbones.common.errors import UsageError
from backbones.dense.predict import SegPredictor
from backbones.dense.run_data import EmbeddedSegData

HEADER = 22  # pixels of the title strip above each panel


def titled(panel: np.ndarray, title: str) -> np.ndarray:
    """A panel with a white strip above it holding its title."""
    strip = np.full((HEADER, panel.shape[1], 3), 255, np.uint8)
    cv2.putText(strip, title, (4, HEADER - 7), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
    return np.concatenate([strip, panel])


def side_by_side(panels: Sequence[np.ndarray], gap: int = 6) -> np.ndarray:
    """Panels of one height in a row, a white gap between them."""
    height = max(p.shape[0] for p in panels)
    spacer = np.full((height, gap, 3), 255, np.uint8)
    row = [spacer] * (2 * len(panels) - 1)
    row[::2] = [np.pad(p, ((0, height - p.shape[0]), (0, 0), (0, 0)), constant_values=255) for p in panels]
    return np.concatenate(row, axis=1)


def prediction_picture(config: str, checkpoint: str, image: str | None = None, data_root: str | None = None,
                       report: str | None = None, alpha: float = 0.6, with_labels: bool = True,
                       fallback: EmbeddedSegData | None = None, score_threshold: float = 0.5) -> np.ndarray:
    """What `checkpoint` predicts for `image` (None: the test set's first) beside its ground truth, where known."""
    predictor = SegPredictor(config, checkpoint, data_root=data_root, fallback=fallback, need_data=image is None)
    entry = test_entry(predictor.test_set(), image) if predictor.data_at_hand else {'img_path': image}
    if report and not predictor.task.class_maps:
        raise UsageError(f'--report draws a segmentor\'s per-class IoU; {config} is a {predictor.task.title} config')
    return predictor.task.picture(predictor, entry, alpha, score_threshold, report, with_labels)


def test_entry(dataset, image: str | None) -> dict:
    """The data set's entry of `image` (the same file or name), its first without one; else no ground truth."""
    entries = [dataset.get_data_info(i) for i in range(len(dataset))]
    if image is None:
        return entries[0]
    return next((e for e in entries if Path(e['img_path']).resolve() == Path(image).resolve()
                 or Path(e['img_path']).name == Path(image).name), {'img_path': image})


