"""A dense task of a test's own, registered from this one module as a user's would be (a config names it in its
custom_imports): "nearness", whether each pixel lies nearer than NEAR metres, predicted by a depth model. It has
its own model type, metric, prediction files, picture and export, so that the tools that run it (train_seg,
test_seg, predict_seg, export) can be seen to ask the task, never to know it."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.evaluator import BaseMetric

import backbones.dense  # noqa: F401  (first: it lets mmseg import on mmcv-lite)

# isort: split
from mmseg.registry import METRICS, MODELS

from backbones.common.errors import UsageError
from backbones.common.files import write_json_atomic
from backbones.dense.data_check import PairCheck, depth_pair_check
from backbones.dense.depth.estimator import TokenDepthEstimator
from backbones.dense.tasks import (
    DenseTask,
    ExportChoice,
    ExportedNetwork,
    HeadAtInputSize,
    PredictionRequest,
    SmallDenseData,
    register_task,
    synthetic_image,
)

NEAR = 4.5  # metres


@MODELS.register_module()
class NearnessEstimator(TokenDepthEstimator):
    """The suite's depth model under a model type of the task's own."""


@METRICS.register_module()
class NearAgreement(BaseMetric):
    """The share of measured pixels whose nearness the prediction gets right; written to `json_file` if given."""

    def __init__(self, json_file: str | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.json_file = json_file

    def process(self, data_batch: dict, data_samples: list[dict]) -> None:
        for sample in data_samples:
            truth, predicted = sample['gt_depth_map']['data'][0], sample['pred_depth_map']['data'][0]
            measured = truth > 0
            agree = ((predicted < NEAR) == (truth < NEAR)) & measured
            self.results.append((int(agree.sum()), int(measured.sum())))

    def compute_metrics(self, results: list) -> dict[str, float]:
        metrics = {'near_agreement': sum(a for a, _ in results) / max(1, sum(m for _, m in results))}
        if self.json_file:
            write_json_atomic(self.json_file, metrics)
        return metrics


class NearMap(HeadAtInputSize):
    """The exported network: 1 where a pixel lies nearer than NEAR metres, else 0."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return (super().forward(images) < NEAR).float()


@register_task
class Nearness(DenseTask):
    name = 'nearness'
    title = 'nearness'
    model_kind = 'nearness model'
    models = ('NearnessEstimator',)
    head_weights = 'decode_head.near.'  # none: its checkpoints say their task
    summary_keys = ('near_agreement',)
    summary_digits = 4
    no_overlay = 'its predictions are shares, written as JSON'
    output_tails = ('.json',)
    predictions_fit = 'nearness fits'
    export_output = f'1 where a pixel lies nearer than {NEAR} m, else 0 (batch, 1, H, W)'
    usual_image = (64, 48)
    annotation_steps = ('LoadDepthAnnotation',)

    def use_small_data(self, cfg: Config, data: SmallDenseData) -> None:
        raise UsageError('nearness has no embedded data: give its data set')

    def loaded_sample(self, rng: np.random.Generator, width: int, height: int) -> dict:
        depth = np.full((height, width), 3.0, np.float32)
        return {**synthetic_image(rng, width, height), 'gt_depth_map': depth, 'seg_fields': ['gt_depth_map']}

    def check_entry(self, entry: dict, num_classes: int) -> PairCheck:
        return PairCheck(depth_pair_check(entry['img_path'], entry['depth_map_path']))

    def test_evaluator(self, cfg: Config, out: str | None, pred_dir: str | None) -> dict:
        return dict(type='NearAgreement', json_file=out)

    def write_predictions(self, predictor, request: PredictionRequest) -> list[Path]:
        paths = [path.with_suffix('.json') for path in request.paths]
        for image, path in zip(request.images, paths):
            _, sample = predictor.predict(image)
            near = sample.pred_depth_map.data[0].cpu().numpy() < NEAR
            path.write_text(json.dumps({'image': str(image), 'near_share': float(near.mean())}))
        return paths

    def picture(self, predictor, entry: dict, alpha: float, score_threshold: float, report: str | None,
                with_labels: bool) -> np.ndarray:
        pixels, sample = predictor.predict(entry['img_path'])
        near = sample.pred_depth_map.data[0].cpu().numpy() < NEAR
        return np.where(near[..., None], pixels, pixels // 4).astype(np.uint8)

    def exported_network(self, model: nn.Module, choice: ExportChoice) -> ExportedNetwork:
        network = NearMap(model, model.decode_head.align_corners)
        return ExportedNetwork(network, 'near', {'output': self.export_output})

    def export_facts(self, predictor) -> dict:
        return {'near_metres': NEAR}

    def describe_outputs(self, predictor) -> str:
        return f'nearer than {NEAR} m'
