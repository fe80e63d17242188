"""Monocular depth as a dense task: the depth papers' figures (DepthReport), depth maps written as 16-bit PNGs in
the data set's scale with a coloured picture beside each, metres exported at the input's size; NYU-v2's layout."""
from __future__ import annotations

import re
from pathlib import Path

import cv2
import matplotlib
import numpy as np
import torch.nn as nn
from mmengine.config import Config

from backbones.common.drawing import enlarge, write_png
from backbones.common.errors import DataError, UsageError
from backbones.common.log import logger
from backbones.dense.config import datasets, scale_sizes
from backbones.dense.data_check import PairCheck, depth_pair_check
from backbones.dense.depth.metric import write_depth_png
from backbones.dense.layouts import DataLayout, WrittenLayout, image_folder, layout_of, register_layout
from backbones.dense.masks import PICTURE_TAIL
from backbones.dense.pictures import side_by_side, titled
from backbones.dense.predict import SegPredictor
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


@register_layout
class NYULayout(DataLayout):
    """NYU-v2 in mmseg's layout: images/{train,test}/NAME.jpg, annotations/{train,test}/NAME.png (16-bit mm)."""

    title = 'NYU-v2'
    dataset_types = ('NYUDataset',)
    root = 'data/nyu'

    def check(self, dataset_cfg: dict) -> None:
        """mmseg's NYU data set reads a scene and a number from each image's name (failing on one without)."""
        images = image_folder(dataset_cfg)
        unnamed = sorted(path for path in images.rglob(f'*{dataset_cfg.get("img_suffix", ".jpg")}')
                         if not re.search(r'[0-9]', path.name))
        if unnamed:
            raise DataError(f'{len(unnamed)} image(s) in {images} have no number in their name, e.g. {unnamed[0]}: '
                            f'mmseg\'s NYU data set reads a scene and a number from each (bedroom_0001.jpg)')

    def use_small(self, dataset_cfg: dict, data: SmallDenseData, split: str) -> None:
        dataset_cfg.update(type='NYUDataset', data_root=str(data.root), img_suffix='.jpg', depth_map_suffix='.png',
                           data_prefix=dict(img_path=f'images/{split}', depth_map_path=f'depth/{split}'))
        for step in dataset_cfg['pipeline']:
            if step['type'] == 'LoadDepthAnnotation':
                step['depth_rescale_factor'] = 1 / data.depth_scale


@register_task
class Depth(DenseTask):
    name = 'depth'
    title = 'depth'
    model_kind = 'depth model'
    models = ('DepthEstimator', 'TokenDepthEstimator')
    head_weights = 'decode_head.depth_layer.'  # the suite's depth head
    multi_scale = True
    summary_keys = ('d1', 'abs_rel', 'rmse', 'log10')
    summary_digits = 3
    no_overlay = 'its maps come with NAME_color.png'
    output_tails = ('.png', PICTURE_TAIL)
    predictions_fit = 'depth map fits'
    export_output = 'depth in metres (batch, 1, H, W)'
    usual_image = (640, 480)  # NYU-v2's
    annotation_steps = ('LoadDepthAnnotation',)

    def use_small_data(self, cfg: Config, data: SmallDenseData) -> None:
        """The depth maps read and scored in the data's scale; every size scaled so that the training crop is the
        images' height, NYU's evaluation crop off (kept by a set written in its layout, `WrittenLayout`)."""
        factor = data.image_size[1] / training_crop_height(cfg)
        in_layout = any(isinstance(layout_of(dataset), WrittenLayout) for dataset in datasets(cfg))
        for dataset in small_datasets(cfg, data, NYULayout()):
            scale_sizes(dataset['pipeline'], factor)
        use_small_test_time(cfg, data)
        for evaluator in ('val_evaluator', 'test_evaluator'):
            if cfg.get(evaluator) and not in_layout:
                cfg[evaluator].update(crop_type=None, depth_scale_factor=data.depth_scale)

    def loaded_sample(self, rng: np.random.Generator, width: int, height: int) -> dict:
        """The image and its depth in metres, a receding plane with some pixels unmeasured (0)."""
        depth = np.repeat(np.linspace(6.0, 1.0, height, dtype=np.float32)[:, None], width, axis=1)
        depth[rng.random((height, width)) < 0.02] = 0.0
        return {**synthetic_image(rng, width, height), 'gt_depth_map': depth, 'seg_fields': ['gt_depth_map'],
                'depth_rescale_factor': 1e-3}

    def check_entry(self, entry: dict, num_classes: int) -> PairCheck:
        """The image and its depth map: both decode, one 16-bit channel the image's size."""
        return PairCheck(depth_pair_check(entry['img_path'], entry['depth_map_path']))

    def test_evaluator(self, cfg: Config, out: str | None, pred_dir: str | None) -> dict:
        """DepthReport with the config's own settings (depth range, crop, scale)."""
        own = cfg.get('test_evaluator') or {}
        return {**own, 'type': 'DepthReport', 'json_file': out, 'output_dir': pred_dir}

    def write_predictions(self, predictor: SegPredictor, request: PredictionRequest) -> list[Path]:
        """Each image's depth as a 16-bit PNG in the data set's scale, and its picture beside it (NAME_color.png)."""
        top = float(predictor.model.decode_head.max_depth)
        for image, path in zip(request.images, request.paths):
            _, sample = predictor.predict(image)
            depth = sample.pred_depth_map.data[0].cpu().numpy()
            write_depth_png(path, depth, predictor.depth_scale)
            write_png(colour_depth(depth, top), path.with_name(f'{path.stem}{PICTURE_TAIL}'))
            logger.info(f'{image} -> {path}: {depth.min():.2f} .. {depth.max():.2f} m')
        return request.paths

    def picture(self, predictor: SegPredictor, entry: dict, alpha: float, score_threshold: float,
                report: str | None, with_labels: bool) -> np.ndarray:
        """The predicted depth beside the image and the entry's ground truth, enlarged to about 256 pixels high."""
        pixels, sample = predictor.predict(entry['img_path'])
        scale = max(1, 256 // pixels.shape[0])
        panels = [titled(enlarge(pixels, scale), 'image')]
        predicted = sample.pred_depth_map.data[0].cpu().numpy()
        top = float(predictor.model.decode_head.max_depth)
        if entry.get('depth_map_path') and Path(entry['depth_map_path']).is_file():
            truth = cv2.imread(entry['depth_map_path'], cv2.IMREAD_UNCHANGED).astype(np.float64)
            panels.append(titled(enlarge(colour_depth(truth / predictor.depth_scale, top), scale), 'ground truth'))
        panels.append(titled(enlarge(colour_depth(predicted, top), scale), f'prediction (0-{top:g} m)'))
        return side_by_side(panels)

    def exported_network(self, model: nn.Module, choice: ExportChoice) -> ExportedNetwork:
        network = HeadAtInputSize(model, model.decode_head.align_corners)
        return ExportedNetwork(network, 'depth', {'output': self.export_output})

    def export_facts(self, predictor: SegPredictor) -> dict:
        return {'depth_png_scale': predictor.depth_scale, 'max_depth': float(predictor.model.decode_head.max_depth)}

    def describe_outputs(self, predictor: SegPredictor) -> str:
        return 'depth'


def training_crop_height(cfg: Config) -> int:
    """The height of the training pipeline's crop (mmseg's crop_size is (height, width))."""
    crop = next((step['crop_size'] for step in cfg.train_dataloader.dataset.pipeline if 'crop_size' in step), None)
    if crop is None:
        raise UsageError('a depth config on the embedded data needs a training crop (RandomCrop) to size it by')
    return crop[0]


def colour_depth(depth: np.ndarray, top: float) -> np.ndarray:
    """A depth map (metres) as RGB: magma from near bright to far dark over 0 .. `top` metres, no depth (0) black."""
    scale = matplotlib.colormaps['magma']
    shade = 1 - np.clip(depth / max(top, 1e-6), 0, 1)
    rgb = (scale(shade)[..., :3] * 255).round().astype(np.uint8)
    rgb[depth <= 0] = 0
    return rgb
