"""Dense predictions for new images with a trained checkpoint: the model of a config with every weight of the
checkpoint (strictly, as tools/test_seg.py loads it), the config's test pipeline without its annotations,
single-scale or the multi-scale (+ flip) test of its `tta_model`; per image, at its own size, a label map
(segmentors), instances with boxes, masks and scores (detectors) or a depth map in metres (depth models)."""
from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import torch
from mmcv import rescale_size
from mmcv.transforms import Compose
from mmengine.config import Config
from mmengine.dataset import pseudo_collate
from mmseg.registry import DATASETS, MODELS, TRANSFORMS
from PIL import Image

from backbones.common.errors import DataError, UsageError
from backbones.common.images import IMG_EXTENSIONS, ImageReadError, read_image
from backbones.dense.layouts import annotation_values
from backbones.dense.own_data import default_palette
from backbones.dense.run_data import EmbeddedSegData, resolve_trained_data
from backbones.dense.runner import checkpoint_meta
from backbones.dense.tasks import DenseTask, task_of
from backbones.dense.trained_checkpoints import built_segmentor, load_trained_config
from backbones.dense.tta import check_tta_settings, drop_tta_flips

DEPTH_SCALE = 1000  # depth PNG values per metre where a config names none (NYU-v2's millimetres)


def without_annotations(pipeline: list, task: DenseTask) -> list:
    """A test pipeline (its TestTimeAug's lists too) without the steps that read the task's ground truth."""
    annotation_steps = task.annotation_steps
    kept = []
    for step in copy.deepcopy(pipeline):
        if step['type'] in annotation_steps:
            continue
        if step['type'] == 'TestTimeAug':
            step['transforms'] = [[t for t in group if t['type'] not in annotation_steps]
                                  for group in step['transforms']]
            step['transforms'] = [group for group in step['transforms'] if group]
        kept.append(step)
    return kept


def check_opencv_reads(path: Path) -> tuple[int, int]:
    """An image file OpenCV decodes, as the pipelines read images (not a GIF), and its (width, height)."""
    try:
        with Image.open(path) as image:
            kind, size = image.format, image.size
    except Exception as e:  # PIL raises OSError, ValueError, SyntaxError, ... for what is no image
        raise ImageReadError(f'{path} cannot be read as an image ({type(e).__name__}: {e})') from e
    if not cv2.haveImageReader(str(path)):
        raise ImageReadError(f'{path}: OpenCV, the segmentation pipeline\'s decoder, does not read this format '
                             f'({kind}; it reads {", ".join(IMG_EXTENSIONS)}): convert it to PNG')
    return size


def resize_steps(pipeline: list) -> list[dict]:
    """A test pipeline's Resize steps, its multi-scale test's included."""
    steps = []
    for step in pipeline:
        groups = step['transforms'] if step['type'] == 'TestTimeAug' else [[step]]
        steps += [t for group in groups for t in group if t['type'] == 'Resize']
    return steps


def check_resizable(path: Path, size: tuple[int, int], pipeline: list) -> None:
    """An image of `size` (width, height) keeps a whole pixel of each side through the pipeline's ratio-keeping
    resizes (a 3000x10 image resized to fit 64x48 is 64 pixels by none: OpenCV fails with an assertion)."""
    for step in resize_steps(pipeline):
        if step.get('keep_ratio') and step.get('scale'):
            width, height = rescale_size(size, tuple(step['scale']))
            if min(width, height) < 1:
                raise DataError(f'{path} is {size[0]}x{size[1]}: the test pipeline resizes it to fit '
                                f'{tuple(step["scale"])} keeping its ratio, which leaves {width}x{height} pixels: crop '
                                f'it to a less extreme shape')


def mask_paths(images: Sequence[Path], out: Path, tails: Sequence[str] = ('.png',)) -> list[Path]:
    """`out/<image stem>.png` for each image. Every file an image gets is `out/<image stem><tail>` for each of `tails`:
    two images that would write one file (`b.png`, `b_color.png`) are refused, naming both."""
    written: dict[Path, Path] = {}
    for image in images:
        for path in (out / f'{image.stem}{tail}' for tail in tails):
            if written.get(path, image) != image:
                raise UsageError(f'{written[path]} and {image} would both write {path}: give images of distinct '
                                 f'names (or predict them into separate folders)')
            written[path] = image
    return [out / f'{image.stem}.png' for image in images]


class SegPredictor:
    """`predictor(path)`: each pixel's class index as tools/test_seg.py predicts it (`multi_scale`, `flip`);
    `predictor.predict(path)`: the model's data sample, any task. The data is chosen as test_seg chooses it; without it,
    the checkpoint's classes and test pipeline serve."""

    def __init__(self, config: str, checkpoint: str, multi_scale: bool = False, flip: bool = True,
                 data_root: str | None = None, cfg_options: dict | None = None,
                 fallback: EmbeddedSegData | None = None, device: str = 'cpu', need_data: bool = False,
                 loaded: Config | None = None) -> None:
        cfg, data = load_trained_config(config, checkpoint, cfg_options, data_root, fallback, need_data, loaded)
        self.task = task = task_of(cfg)
        self.data_at_hand = data.at_hand
        resolve_trained_data(cfg, checkpoint, data, fallback, cfg_options)
        model = built_segmentor(cfg, checkpoint)
        self.cfg, self.model = cfg, model.to(device)
        self.tested = model  # what predicts: the model, or its test-time augmentation around it
        pipeline = cfg.test_dataloader.dataset.pipeline
        if multi_scale:
            task.check_multi_scale(config)
            check_tta_settings(cfg)
            if not flip:
                drop_tta_flips(cfg)
            self.tested = MODELS.build({**cfg.tta_model, 'module': model}).eval()
            pipeline = cfg.tta_pipeline
        self.steps = steps = without_annotations(pipeline, task)
        self.load, self.pipeline = TRANSFORMS.build(steps[0]), Compose(steps[1:])  # the first step reads the image
        test_set = self.test_set(lazy=True)
        meta = test_set.metainfo
        if task.classes_from_checkpoint:  # the categories trained on, with their ids (else the test set's)
            meta = checkpoint_meta(checkpoint).get('dataset_meta') or self.test_set().metainfo
        self.classes = list(meta.get('classes') or ())
        self.cat_ids = list(meta.get('cat_ids') or ())
        self.palette = [list(c) for c in meta.get('palette') or default_palette(len(self.classes))]
        self.stored_as = test_set.metainfo  # how its annotation files store the classes (`annotation_values`)
        self.depth_scale = float((cfg.get('test_evaluator') or {}).get('depth_scale_factor', DEPTH_SCALE))

    def test_set(self, lazy: bool = False):
        """The config's test set (`lazy`: its meta data only, no files listed)."""
        return DATASETS.build({**self.cfg.test_dataloader.dataset, 'pipeline': [], 'lazy_init': lazy})

    def __call__(self, path: str | Path) -> np.ndarray:
        return self.segment(path)[1]

    def segment(self, path: str | Path) -> tuple[np.ndarray, np.ndarray]:
        """The image as the model reads it (RGB, pixels as stored), and the class index of each of its pixels."""
        pixels, sample = self.predict(path)
        return pixels, sample.pred_sem_seg.data[0].cpu().numpy()

    def check_image(self, path: str | Path) -> None:
        """An image the model can predict (read from its header): `check_opencv_reads`, `check_resizable`."""
        check_resizable(Path(path), check_opencv_reads(Path(path)), self.steps)

    def predict(self, path: str | Path):
        """The image as the model reads it (RGB), and the model's data sample for it (`pred_sem_seg`, ...)."""
        path = Path(path)
        read_image(path)  # decodes the whole file: OpenCV would read a truncated JPEG as grey, silently
        self.check_image(path)
        loaded = self.load({'img_path': str(path)})
        pixels = np.ascontiguousarray(loaded['img'][..., ::-1])  # BGR -> RGB, a copy the pipeline leaves alone
        data = pseudo_collate([self.pipeline(loaded)])
        with torch.no_grad():
            sample = self.tested.test_step(data)[0]
        return pixels, sample

    def label_values(self, prediction: np.ndarray) -> np.ndarray:
        """Class indices as the data set's annotation files store them (what tools/test_seg.py --pred-dir writes)."""
        return annotation_values(prediction, self.stored_as)
