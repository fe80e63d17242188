"""`CocoAP`: COCO's box and mask AP of a model's predictions, computed by pycocotools against the data set's own
annotation file (crowd regions and all), in percent."""
from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from mmengine.dist import is_main_process
from mmengine.evaluator import BaseMetric
from mmseg.registry import METRICS
from pycocotools import mask as mask_utils
from pycocotools.cocoeval import COCOeval

from backbones.common.files import write_json_atomic
from backbones.common.log import logger
from backbones.dense.instances.coco import load_coco

KINDS = {'box': 'bbox', 'mask': 'segm'}
# COCOeval's first six summary numbers
SUMMARY = ('AP', 'AP50', 'AP75', 'APs', 'APm', 'APl')
PREDICTIONS = 'predictions.json'  # the detections' file in --pred-dir


def coco_results(image_id: int, predicted: dict, cat_ids: Sequence[int]) -> list[dict]:
    """One image's predictions (boxes x1, y1, x2, y2, labels from 0, scores, boolean masks) as COCO result entries."""
    boxes = predicted['bboxes'].cpu().numpy().astype(np.float64)
    masks = predicted['masks'].cpu().numpy()
    entries = []
    for box, label, score, mask in zip(boxes, predicted['labels'].tolist(), predicted['scores'].tolist(), masks):
        rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
        entries.append(dict(image_id=image_id, category_id=cat_ids[label], score=score,
                            bbox=[box[0], box[1], box[2] - box[0], box[3] - box[1]],
                            segmentation=dict(size=rle['size'], counts=rle['counts'].decode('ascii'))))
    return entries


def percent(value: float) -> float:
    """A COCOeval number in percent; its -1 (no ground truth in that range) as NaN."""
    return float('nan') if value < 0 else 100 * float(value)


def per_category_ap(evaluation: COCOeval, names: Sequence[str]) -> dict[str, float]:
    """Each category's AP (IoU 0.5:0.95, all areas, 100 detections), by name."""
    precision = evaluation.eval['precision'][:, :, :, 0, -1]  # IoU x recall x category
    result = {}
    for k, name in enumerate(names):
        values = precision[:, :, k]
        values = values[values > -1]
        result[name] = percent(values.mean()) if values.size else float('nan')
    return result


# COCOeval's area ranges of its summary numbers (all, small, medium, large), in pixels of ground-truth area
AREA_RANGES = {'AP': (0, 1e10), 'AP50': (0, 1e10), 'AP75': (0, 1e10), 'APs': (0, 32 ** 2), 'APm': (32 ** 2, 96 ** 2),
               'APl': (96 ** 2, 1e10)}


def without_detections(gt, image_ids: list[int], names: Sequence[str],
                       cat_ids: Sequence[int]) -> tuple[list[float], dict[str, float]]:
    """What COCOeval would give a run that detects nothing: 0 where there is ground truth to find, else -1."""
    found = gt.loadAnns(gt.getAnnIds(imgIds=image_ids, iscrowd=False))
    stats = [0.0 if any(low <= a['area'] <= high for a in found) else -1.0
             for low, high in (AREA_RANGES[name] for name in SUMMARY)]
    present = {a['category_id'] for a in found}
    return stats, {name: 0.0 if cat in present else float('nan') for name, cat in zip(names, cat_ids)}


def evaluate(gt, results: list[dict], image_ids: list[int], kind: str) -> COCOeval:
    """pycocotools' evaluation of `results` on `image_ids`, quiet. Each kind sees entries with only its own geometry:
    with a box, loadRes would size a mask's area range by it (detectron2 and mmdetection drop it too)."""
    dropped = 'segmentation' if kind == 'box' else 'bbox'
    entries = [{key: value for key, value in entry.items() if key != dropped} for entry in results]
    with contextlib.redirect_stdout(io.StringIO()):
        evaluation = COCOeval(gt, gt.loadRes(entries), KINDS[kind])
        evaluation.params.imgIds = image_ids
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return evaluation


@METRICS.register_module()
class CocoAP(BaseMetric):
    """Box and mask AP, per category too in `json_file` (0 detecting nothing); `predictions_dir`: COCO results."""

    default_prefix = None

    def __init__(self, json_file: str | None = None, predictions_dir: str | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.json_file, self.predictions_dir = json_file, predictions_dir

    def process(self, data_batch: dict, data_samples: Sequence[dict]) -> None:
        cat_ids = self.dataset_meta['cat_ids']
        for sample in data_samples:
            self.results.append((sample['img_id'], coco_results(sample['img_id'], sample['pred_instances'], cat_ids)))

    def compute_metrics(self, results: list) -> dict[str, float]:
        gt = load_coco(self.dataset_meta['ann_file'])
        image_ids = sorted({image_id for image_id, _ in results})
        detections = [entry for _, entries in results for entry in entries]
        names = self.dataset_meta['classes']
        metrics, per_class = {}, {}
        for kind in KINDS:
            if detections:
                evaluation = evaluate(gt, detections, image_ids, kind)
                stats, per_class[kind] = evaluation.stats[:len(SUMMARY)], per_category_ap(evaluation, names)
            else:
                stats, per_class[kind] = without_detections(gt, image_ids, names, self.dataset_meta['cat_ids'])
            metrics.update({f'{kind}_{name}': percent(value) for name, value in zip(SUMMARY, stats)})
        if not detections:
            logger.warning(f'warning: no detections on {len(image_ids)} images: every AP with ground truth to find '
                           f'is 0')
        logger.info('AP: ' + '  '.join(f'{key} {value:.2f}' for key, value in metrics.items()
                                       if not math.isnan(value)))
        if self.predictions_dir and is_main_process():
            Path(self.predictions_dir).mkdir(parents=True, exist_ok=True)
            write_json_atomic(Path(self.predictions_dir) / PREDICTIONS, detections)
        if self.json_file and is_main_process():
            Path(self.json_file).parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.json_file, json_ready({**metrics, 'images': len(image_ids), 'per_class': {
                name: {kind: per_class[kind][name] for kind in KINDS} for name in names}}))
        return metrics


def json_ready(report: dict) -> dict:
    """A report with its NaNs (APs of area ranges without ground truth) as null: JSON has no NaN."""
    def plain(value):
        if isinstance(value, dict):
            return {key: plain(v) for key, v in value.items()}
        return None if isinstance(value, float) and math.isnan(value) else value
    return plain(report)
