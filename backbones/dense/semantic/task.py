"""Semantic segmentation as a dense task: mIoU (mmseg's IoUMetric, reported by the suite's IoUReport), class maps
written as PNGs in the data set's label values and drawn over the image, the multi-scale test, logits exported at
the input's size; ADE20K's and own data's layouts (their small data: the pages' class maps as they are)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch.nn as nn
from mmengine.config import Config
from mmseg.registry import METRICS

from backbones.common.drawing import write_png
from backbones.common.errors import DataError, UsageError
from backbones.common.log import logger
from backbones.dense.config import scale_sizes
from backbones.dense.data_check import PairCheck, check_labels_used, pair_check
from backbones.dense.layouts import DataLayout, image_folder, register_layout
from backbones.dense.masks import OVERLAY_TAIL, write_mask
from backbones.dense.own_data import (
    check_trained_classes,
    is_own_data_config,
    read_own_data,
    set_classes,
    use_own_data,
    use_trained_classes,
)
from backbones.dense.predict import SegPredictor
from backbones.dense.semantic.metric import read_report
from backbones.dense.semantic.pictures import draw_labels, read_annotation, segmentation_picture
from backbones.dense.tasks import (
    DenseTask,
    ExportChoice,
    ExportedNetwork,
    HeadAtInputSize,
    PredictionRequest,
    SmallDenseData,
    register_task,
    small_datasets,
    synthetic_image,
)
from backbones.dense.tta import use_small_test_time

ADE20K_CLASSES = 150
IOU_METRICS = ('IoUMetric', 'IoUReport')  # mmseg's, and the suite's that reports it
IOU_MEANS = ('mIoU', 'mDice', 'mFscore')  # what their `iou_metrics` may ask for


@register_layout
class OwnSegLayout(DataLayout):
    """A data set of one's own (`own_data` checks it as it reads it), or any that mmseg's BaseSegDataset reads."""

    title = 'a data set of your own'
    dataset_types = ('BaseSegDataset',)
    root = 'data/own_seg'  # what the own-data configs name: your data set there, or --data-root

    def use_small(self, dataset_cfg: dict, data: SmallDenseData, split: str) -> None:
        dataset_cfg.update(type='BaseSegDataset', img_suffix='.jpg', seg_map_suffix='.png', data_root=str(data.root),
                           data_prefix=dict(img_path=f'images/{split}', seg_map_path=f'annotations/{split}'))


@register_layout
class ADE20KLayout(OwnSegLayout):
    """ADE20K: images/{training,validation}/ADE_*.jpg, annotations/.../ADE_*.png (0 other, 1..150 the classes)."""

    title = 'ADE20K'
    dataset_types = ('ADE20KDataset',)
    root = 'data/ade/ADEChallengeData2016'

    def check(self, dataset_cfg: dict) -> None:
        """Its image folder, holding ADE20K's images only: a folder of other images (a data set of its own classes)
        would be trained as ADE20K's 150 classes, its value 0 ignored and 1, 2, ... read as wall, building, ..."""
        images = image_folder(dataset_cfg)
        hint = ('for a data set of your own classes take an own-data config, e.g. '
                f'seg_configs/upernet_lvvit_s_own_data.py --data-root {dataset_cfg.get("data_root")} '
                '(docs/segmentation.md, "Your own data")')
        if not images.is_dir():
            raise DataError(f'{images}: no such folder (ADE20K\'s configs read its layout: images/training, '
                            f'images/validation); {hint}')
        foreign = [path for path in sorted(images.rglob(f'*{dataset_cfg.get("img_suffix", ".jpg")}'))
                   if not re.match(r'ADE_(train|val|test)_\d+$', path.stem)]  # every ADE20K image's name
        if foreign:
            raise DataError(f'{images} holds images that are not ADE20K\'s (e.g. {foreign[0].name}; ADE20K\'s are '
                            f'ADE_train_*, ADE_val_*), and this config trains ADE20K\'s 150 classes (mask value 0 '
                            f'ignored): {hint}')


@register_task
class SemanticSegmentation(DenseTask):
    name = 'semantic'
    title = 'semantic segmentation'
    model_kind = 'segmentor'
    head_weights = 'decode_head.conv_seg.'  # mmseg's class layer
    summary_keys = ('mIoU', 'mAcc', 'aAcc')
    multi_scale = True
    class_maps = True
    output_tails = ('.png',)
    predictions_fit = 'mask fits'
    export_output = 'logits (batch, classes, H, W); the class of a pixel is the argmax'
    usual_image = (683, 512)  # ADE20K's
    annotation_steps = ('LoadAnnotations',)

    def resolve_classes(self, cfg: Config, roots: set[str], checkpoint: str | None, embedded: bool) -> None:
        if not embedded and is_own_data_config(cfg):  # an own-data config takes the data's folders and classes
            if len(roots) > 1:
                raise UsageError(f'an own-data config reads one folder; its loaders name {", ".join(sorted(roots))} '
                                 '(--data-root sets one for all)')
            use_own_data(cfg, read_own_data(next(iter(roots))))

    def use_trained_classes(self, cfg: Config, checkpoint: str) -> None:
        use_trained_classes(cfg, checkpoint)

    def check_trained_classes(self, cfg: Config, checkpoint: str) -> None:
        check_trained_classes(cfg, checkpoint)

    def use_small_data(self, cfg: Config, data: SmallDenseData) -> None:
        """The class maps, the sizes times `data.scale`, the test at `data.test_ratios`, the data's classes."""
        set_classes(cfg, data.classes, [list(c) for c in data.palette], reduce_zero_label=True)
        for dataset in small_datasets(cfg, data, OwnSegLayout()):
            scale_sizes(dataset['pipeline'], data.scale)
        use_small_test_time(cfg, data)
        scale_sizes(cfg.model.get('data_preprocessor', {}), data.scale)
        scale_sizes(cfg.model.get('test_cfg', {}), data.scale)

    def loaded_sample(self, rng: np.random.Generator, width: int, height: int) -> dict:
        """The image and its class map: ADE20K's 150 classes in blocks, as regions are, and some ignored pixels."""
        blocks = rng.integers(0, ADE20K_CLASSES, (8, 8)).astype(np.uint8)
        label = np.kron(blocks, np.ones((height // 8 + 1, width // 8 + 1), np.uint8))[:height, :width].copy()
        label[rng.random((height, width)) < 0.05] = 255
        return {**synthetic_image(rng, width, height), 'gt_seg_map': label, 'seg_fields': ['gt_seg_map'],
                'reduce_zero_label': False}

    def check_entry(self, entry: dict, num_classes: int) -> PairCheck:
        """The image and its class map: both decode, the same size, the map's values classes (or ignored)."""
        return pair_check(entry['img_path'], entry['seg_map_path'], num_classes, entry.get('reduce_zero_label', False),
                          entry.get('label_map'))

    def check_values(self, dataset, values: set[int]) -> None:
        check_labels_used(dataset, values)

    def test_evaluator(self, cfg: Config, out: str | None, pred_dir: str | None) -> dict | list:
        return semantic_evaluator(cfg.get('test_evaluator') or {'type': 'IoUReport'}, out, pred_dir)

    def training_hooks(self, cfg: Config, pictures: int) -> None:
        cfg.default_hooks.visualization = dict(type='ValidationPictures', count=pictures)

    def write_predictions(self, predictor: SegPredictor, request: PredictionRequest) -> list[Path]:
        """A label map per image in the data set's values, and the classes over the image if asked."""
        for image, mask in zip(request.images, request.paths):
            pixels, prediction = predictor.segment(image)
            write_mask(predictor.label_values(prediction), mask)
            if request.overlay:
                write_png(draw_labels(pixels, prediction, predictor.classes, predictor.palette),
                          mask.with_name(f'{mask.stem}{OVERLAY_TAIL}'))
            found = np.unique(prediction)
            logger.info(f'{image} -> {mask}: ' + ', '.join(predictor.classes[c] for c in found[:8])
                        + (f', ... ({len(found)} classes)' if len(found) > 8 else ''))
        return request.paths

    def picture(self, predictor: SegPredictor, entry: dict, alpha: float, score_threshold: float,
                report: str | None, with_labels: bool) -> np.ndarray:
        """The classes over the image, beside the ground truth, with a test_seg `report`'s per-class IoU."""
        scores = read_report(report, predictor.classes) if report else None
        pixels, prediction = predictor.segment(entry['img_path'])
        truth = None
        if entry.get('seg_map_path') and Path(entry['seg_map_path']).is_file():
            truth = read_annotation(entry['seg_map_path'], entry.get('reduce_zero_label', False),
                                    entry.get('label_map'))
        return segmentation_picture(pixels, prediction, predictor.classes, predictor.palette, truth, scores, alpha,
                                    with_labels)

    def exported_network(self, model: nn.Module, choice: ExportChoice) -> ExportedNetwork:
        return ExportedNetwork(HeadAtInputSize(model, model.align_corners), 'logits', {'output': self.export_output})

    def export_facts(self, predictor: SegPredictor) -> dict:
        count = len(predictor.classes)
        values = predictor.label_values(np.arange(count)).tolist()  # how the data set's masks store each class
        stored = ('class index' if values == list(range(count)) else 'class index + 1, 0 for none (ADE20K)'
                  if values == list(range(1, count + 1)) else f'the data set\'s id of each class (Cityscapes\' label '
                  f'ids): {values}')
        return {'classes': predictor.classes, 'palette': predictor.palette, 'mask_values': stored}


def semantic_evaluator(own: dict | list, out: str | None, pred_dir: str | None) -> dict | list:
    """A segmentation config's test_evaluator (one metric or a list), its IoUMetric made the suite's IoUReport with
    the same settings, which writes `out` and `pred_dir` (they need an IoU metric); any other metric as it is."""
    metrics = [dict(metric) for metric in (own if isinstance(own, (list, tuple)) else [own])]
    unknown = [str(metric.get('type')) for metric in metrics if METRICS.get(metric.get('type')) is None]
    if unknown:
        raise UsageError(f'the config\'s test_evaluator names {", ".join(unknown)}, which is no metric mmseg or the '
                         f'suite registers')
    iou = [metric for metric in metrics if metric.get('type') in IOU_METRICS]
    if len(iou) > 1:
        raise UsageError('the config\'s test_evaluator holds more than one IoU metric: their scores share their names')
    asked = [name for metric in iou for name in metric.get('iou_metrics', ()) if name not in IOU_MEANS]
    if asked:
        raise UsageError(f'the config\'s test_evaluator asks for {", ".join(map(str, asked))}: IoUMetric computes '
                         f'{", ".join(IOU_MEANS)}')
    if (out or pred_dir) and not iou:
        names = ', '.join(str(metric.get('type')) for metric in metrics)
        raise UsageError(f'--out and --pred-dir are written by the IoU metric; the config\'s test_evaluator is '
                         f"{names}: add dict(type='IoUMetric') to it, or leave them out")
    for metric in iou:
        metric.update(type='IoUReport', json_file=out, output_dir=pred_dir or metric.get('output_dir'))
    return metrics if isinstance(own, (list, tuple)) else metrics[0]
