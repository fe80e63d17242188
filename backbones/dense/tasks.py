"""The dense tasks, found by the model a config builds: each task (`semantic/`, `instances/`, `depth/`, registered
when the package is imported) holds what it does its own way, and the runner, config reading and tools ask it,
never comparing task names. A task is a `DenseTask` registered with `register_task`; a model type no task claims is
a segmentor."""
from __future__ import annotations

import argparse
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.config import Config

from backbones.common.errors import UsageError
from backbones.dense.data_check import PairCheck
from backbones.dense.layouts import DataLayout, SmallDenseData, layout_of


class PredictorView(Protocol):
    """What a task's methods use of the `predict.SegPredictor` they are handed."""

    cfg: Config
    model: nn.Module
    classes: list[str]
    cat_ids: list[int]
    palette: list[list[int]]
    depth_scale: float

    def predict(self, path: str | Path) -> tuple[np.ndarray, Any]: ...

    def segment(self, path: str | Path) -> tuple[np.ndarray, np.ndarray]: ...

    def label_values(self, prediction: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class PredictionRequest:
    """What tools/predict_seg.py asks of a task's writer: images, their files, folder, overlays, score threshold."""

    images: list[Path]
    paths: list[Path]
    out: Path
    overlay: bool
    score_threshold: float


@dataclass(frozen=True)
class ExportChoice:
    """What export's segmentor options ask of a task's network: `top_k`, `pyramid_only`, `dynamic_size`."""

    top_k: int | None = None
    pyramid_only: bool = False
    dynamic_size: bool = False

    def __post_init__(self) -> None:
        if self.top_k is not None and self.pyramid_only:
            raise UsageError('--top-k: the number of detections of a whole detector\'s export; --pyramid-only '
                             'exports no detections (give one of them)')

    def given(self) -> list[str]:
        """The options given, by name."""
        return [name for name, value in (('--top-k', self.top_k is not None), ('--pyramid-only', self.pyramid_only))
                if value]


def no_other_inputs(images: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return ()


@dataclass(frozen=True)
class ExportedNetwork:
    """What an export holds of a model: the network (normalised images in), its ONNX outputs' names and export.json's
    facts (`output` at least); `input_names` and `other_inputs` for more inputs; `least_side`."""

    network: nn.Module
    output_names: str | list[str]
    facts: dict[str, Any]
    input_names: tuple[str, ...] = ('images',)
    other_inputs: Callable[[torch.Tensor], tuple[torch.Tensor, ...]] = no_other_inputs
    least_side: int = 0


class DenseTask(ABC):
    """One dense task. Class attributes say what it is; methods do what it does its own way."""

    name: ClassVar[str]  # recorded in checkpoints and export folders: 'semantic', 'instances', 'depth'
    title: ClassVar[str]  # in words: 'semantic segmentation'
    model_kind: ClassVar[str]  # what its model is called: 'segmentor'
    models: ClassVar[tuple[str, ...]] = ()  # the config model types that make it
    head_weights: ClassVar[str]  # a weight-name prefix only its models have
    summary_keys: ClassVar[tuple[str, ...]]  # the scores a test's line prints
    summary_digits: ClassVar[int] = 2
    multi_scale: ClassVar[bool] = False  # has a test-time augmentation (--ms, --tta: the config's tta_model)
    class_maps: ClassVar[bool] = False  # predicts a class per pixel: mmseg's pictures, --show-dir, --report
    no_overlay: ClassVar[str | None] = None  # why predict_seg --overlay is refused, where it is ('its maps ...')
    output_tails: ClassVar[tuple[str, ...]] = ()  # the files each image gets from predict_seg, besides overlays
    outputs_per_image: ClassVar[bool] = True  # test_seg --pred-dir and --show-dir write a file per test image
    classes_from_checkpoint: ClassVar[bool] = False  # a predictor's classes: the checkpoint's, not the test set's
    macs_counted: ClassVar[bool] = True  # its forward's work is fixed by the image size (model_info counts it)
    predictions_fit: ClassVar[str]  # 'its <predictions_fit> the pixels as stored'
    export_output: ClassVar[str]  # what an export's network returns, in words
    usual_image: ClassVar[tuple[int, int]]  # its reference data set's usual image (width, height), before training
    annotation_steps: ClassVar[tuple[str, ...]]  # the pipeline steps that read its ground truth (left out to predict)

    # ---- data

    def resolve_classes(self, cfg: Config, roots: set[str], checkpoint: str | None, embedded: bool) -> None:
        """The config's classes from its data (`roots`, or the embedded data), a trained `checkpoint`'s checked."""

    def use_trained_classes(self, cfg: Config, checkpoint: str) -> None:
        """With no data set at hand, the classes the checkpoint records."""

    def check_trained_classes(self, cfg: Config, checkpoint: str) -> None:
        """The data set's classes are the ones the checkpoint was trained on."""

    @abstractmethod
    def use_small_data(self, cfg: Config, data: SmallDenseData) -> None:
        """Point every loader of `cfg` at `data` and fit the pipelines' (and the model's) sizes to its images."""

    def use_small_model(self, cfg: Config) -> None:
        """The model sized for a small data set on a few CPU cores, in training, tests and predictions alike."""

    small_schedule: ClassVar[dict[str, Any]] = {}  # a small data set's schedule changed so (`Schedule`'s fields)

    @abstractmethod
    def loaded_sample(self, rng: np.random.Generator, width: int, height: int) -> dict:
        """The image and a plausible ground truth the pipeline's `Load...` steps give for a synthetic image."""

    @abstractmethod
    def check_entry(self, entry: dict, num_classes: int) -> PairCheck:
        """What is wrong with one entry of its data set, or None; and the ground truth's values."""

    def check_values(self, dataset, values: set[int]) -> None:
        """The ground truth's values over the whole data set, checked (`values`: the union of the entries')."""

    # ---- test

    @abstractmethod
    def test_evaluator(self, cfg: Config, out: str | None, pred_dir: str | None) -> dict | list:
        """The metric a test runs, writing its scores to `out` and its predictions into `pred_dir`."""

    def summary(self, metrics: dict[str, float]) -> str:
        """The scores of a test in one line."""
        return '  '.join(f'{key} {metrics[key]:.{self.summary_digits}f}' for key in self.summary_keys
                         if key in metrics)

    def training_hooks(self, cfg: Config, pictures: int) -> None:
        """The hooks a training run adds or drops (its validation pictures)."""
        cfg.default_hooks.pop('visualization', None)  # mmseg's drawing knows class maps only

    # ---- predictions

    @abstractmethod
    def write_predictions(self, predictor: PredictorView, request: PredictionRequest) -> list[Path]:
        """Write the predictions of `request.images`; returns the files written."""

    @abstractmethod
    def picture(self, predictor: PredictorView, entry: dict, alpha: float, score_threshold: float,
                report: str | None, with_labels: bool) -> np.ndarray:
        """The prediction for a test entry's image, beside the entry's ground truth if it has one."""

    # ---- export

    def input_stride(self, model: nn.Module, size: tuple[int, int]) -> int:
        """What an exported input's sides are multiples of."""
        return model.backbone.stride

    @abstractmethod
    def export_facts(self, predictor: PredictorView) -> dict:
        """export.json's task part: what a runtime needs to read the outputs."""

    def describe_outputs(self, predictor: PredictorView) -> str:
        """What an export predicts, in a few words ('150 classes')."""
        return f'{len(predictor.classes)} classes'

    def check_export_choice(self, choice: ExportChoice, config: str) -> None:
        """Refuse the export options the task has no use for, before any work: by default all (a detector's)."""
        if choice.given():
            raise UsageError(f'{" and ".join(choice.given())}: an option of a detector\'s export; {config} is a '
                             f'{self.title} config')

    @abstractmethod
    def exported_network(self, model: nn.Module, choice: ExportChoice) -> ExportedNetwork:
        """The network an export holds, as `choice` asks, its outputs as `export_output` says."""

    # ---- refusals

    def check_test_options(self, args: argparse.Namespace, config: str) -> None:
        """Refuse the test options the task has no use for, before any work."""
        if args.ms:
            self.check_multi_scale(config)
        if args.show_dir and not self.class_maps:
            raise UsageError(f'--show-dir draws a segmentor\'s predictions; {config} is a {self.title} config '
                             '(tools/visualize.py segmentation draws its prediction for an image)')

    def check_multi_scale(self, config: str) -> None:
        if not self.multi_scale:
            raise UsageError(f'--ms (--tta): {config} is a {self.title} config, a task without a multi-scale test '
                             '(test-time augmentation)')


SMALL_DATA_SPLITS = {'train_dataloader': 'training', 'val_dataloader': 'validation', 'test_dataloader': 'validation'}


def small_datasets(cfg: Config, data: SmallDenseData, shared: DataLayout) -> Iterator[dict]:
    """Each loader's data set pointed at the split of `data` it takes, as its layout reads it (`shared` for a type no
    layout claims), its training rescaling set to `data.ratio_range` and its flips off unless `data.mirrored`."""
    for loader, split in SMALL_DATA_SPLITS.items():
        if not cfg.get(loader):
            continue
        dataset = cfg[loader]['dataset']
        for step in dataset['pipeline']:
            if 'ratio_range' in step:
                step['ratio_range'] = data.ratio_range
            is_flip = isinstance(step['type'], str) and step['type'].endswith('Flip')  # mmcv's, the detectors'
            if is_flip and 'prob' in step and not data.mirrored:
                step['prob'] = 0.0
        (layout_of(dataset) or shared).use_small(dataset, data, split)
        yield dataset


TASKS: dict[str, DenseTask] = {}  # by name, in registration order
DEFAULT_TASK = 'semantic'  # the task of a model type no task claims


REQUIRED = ('name', 'title', 'model_kind', 'head_weights', 'summary_keys', 'predictions_fit', 'export_output',
            'usual_image', 'annotation_steps')  # the class attributes a task sets


def register_task(task: type[DenseTask]) -> type[DenseTask]:
    """Class decorator: `task` joins the registry; it sets every REQUIRED attribute, and its name and models are new."""
    missing = [name for name in REQUIRED if not hasattr(task, name)]
    if missing:
        raise TypeError(f'dense task {task.__name__} does not set {", ".join(missing)}')
    claimed = {model for other in TASKS.values() for model in other.models}
    if task.name in TASKS or claimed & set(task.models):
        raise ValueError(f'dense task {task.name}: its name or one of its models {task.models} is registered already')
    TASKS[task.name] = task()
    return task


def model_type(cfg: Config) -> str | None:
    """The type of the model a config builds (a test-time-augmentation wrapper's module's)."""
    model = cfg.model
    return model.module.get('type') if model.get('module') else model.get('type')


def task_of(cfg: Config) -> DenseTask:
    """The task of the model a config builds."""
    kind = model_type(cfg)
    return next((task for task in TASKS.values() if kind in task.models), TASKS[DEFAULT_TASK])


def task_named(name: str | None) -> DenseTask | None:
    """The task a checkpoint or export records by name; None for a name no task has."""
    return TASKS.get(name) if isinstance(name, str) else None


def tasks() -> list[DenseTask]:
    return list(TASKS.values())


class HeadAtInputSize(nn.Module):
    """A dense model's whole-image forward on normalised RGB images (mmseg's `encode_decode` without image metas), the
    decode head's output resampled to the input's size: a segmentor's per-class logits, a depth model's metres."""

    def __init__(self, model: nn.Module, align_corners: bool) -> None:
        super().__init__()
        self.model, self.align_corners = model, align_corners

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        out = self.model.decode_head(self.model.extract_feat(images))
        return F.interpolate(out, size=images.shape[2:], mode='bilinear', align_corners=self.align_corners)


def synthetic_image(rng: np.random.Generator, width: int, height: int) -> dict:
    """What LoadImageFromFile gives for a synthetic image."""
    image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    return {'img': image, 'img_path': 'synthetic.jpg', 'img_shape': (height, width), 'ori_shape': (height, width)}


def task_recognised_by(weight_names: list[str]) -> DenseTask | None:
    """The task whose models alone have some of these weights; None if none does."""
    return next((task for task in TASKS.values() if any(n.startswith(task.head_weights) for n in weight_names)),
                None)
