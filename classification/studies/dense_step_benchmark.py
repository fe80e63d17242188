"""The dense models' training step in its steady state, as tools/train_seg.py runs it on one GPU: the config's model,
optimizer and per-GPU batch, on batches that its own training pipeline made from synthetic images of the data set's
usual size (tools/measure_gpu.py's `dense_steps` stage).

Only the pipeline's reading steps (`Load...`) are left out: each synthetic sample is what they would have produced
(the image, and its class map, instances or depth), so the crops, jitter and padding, and so the step's cost, are the
data set's. The step is `train_step` followed by reading the logged losses, as mmengine's loop does each iteration.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch
from mmcv.transforms import Compose
from mmengine.config import Config
from mmengine.dataset import pseudo_collate
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope

import backbones.segmentation  # noqa: F401  (first: it lets mmseg import on mmcv-lite; registers the suite's modules)

# isort: split
from mmseg.registry import MODELS

from backbones.segmentation.config import load_config, scale_sizes
from backbones.segmentation.tasks import task_of
from classification.studies.timing import SteadyWindow


@dataclass(frozen=True)
class DenseStep:
    """One config's step timed: images and iterations per second, its batch, the largest image its pipeline gave
    (before the preprocessor's padding), and the device memory it took at its peak (None on a CPU)."""
    config: str
    task: str
    batch_size: int
    largest_image: tuple[int, int]  # (height, width)
    img_s: float
    it_s: float
    peak_memory_gib: float | None

    def as_dict(self) -> dict:
        return {'config': self.config, 'task': self.task, 'batch_size': self.batch_size,
                'largest_image': list(self.largest_image), 'img_s': self.img_s, 'it_s': self.it_s,
                'peak_memory_gib': self.peak_memory_gib}


def training_batches(cfg: Config, count: int, batch_size: int, scale: float, seed: int = 0) -> list[dict]:
    """`count` batches of `batch_size` made by the config's training pipeline, its reading steps left out, from
    its task's synthetic samples of the data set's usual size times `scale`."""
    task = task_of(cfg)
    steps = [step for step in cfg.train_dataloader.dataset.pipeline if not step['type'].startswith('Load')]
    pipeline = Compose(steps)
    width, height = (max(1, round(side * scale)) for side in task.usual_image)
    rng = np.random.default_rng(seed)
    np.random.seed(seed)  # the pipelines' own draws
    return [pseudo_collate([pipeline(task.loaded_sample(rng, width, height)) for _ in range(batch_size)])
            for _ in range(count)]


def dense_config(path: str, scale: float) -> Config:
    """The config without its ImageNet weights (random weights time the same), its sizes times `scale`."""
    cfg = load_config(path, {'model.backbone.pretrained': None})
    if scale != 1.0:
        scale_sizes(cfg.train_dataloader.dataset.pipeline, scale)
        scale_sizes(cfg.model.get('data_preprocessor', {}), scale)
    return cfg


def time_dense_step(path: str, device: torch.device, seconds: float, min_batches: int, warmup: int,
                    scale: float = 1.0, batch_size: int | None = None, batches: int = 4) -> DenseStep:
    """The training step of the config at `path` on `device`: `warmup` steps, then at least `seconds` and
    `min_batches`, cycling over `batches` distinct batches (moved to the device each step, as the loop does)."""
    init_default_scope('mmseg')
    cfg = dense_config(path, scale)
    batch_size = batch_size or cfg.train_dataloader.batch_size
    data = training_batches(cfg, batches, batch_size, scale)
    model = MODELS.build(cfg.model).to(device).train()
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
    window = SteadyWindow(seconds, min_batches, warmup=warmup, device=device)
    largest = (0, 0)
    for count, batch in enumerate(itertools.cycle(data), 1):
        for value in model.train_step(batch, optim).values():
            value.item()  # mmengine's loop reads the logged losses each step
        largest = max(largest, largest_image(batch))
        if window.done(count, batch_size):
            break
    img_s = window.images_per_second()
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == 'cuda' else None
    return DenseStep(path, task_of(cfg).name, batch_size, largest, img_s, img_s / batch_size, peak)


def largest_image(batch: dict) -> tuple[int, int]:
    """The batch's largest image (height, width) as the pipeline left it, before the preprocessor's padding."""
    return max(tuple(image.shape[-2:]) for image in batch['inputs'])
