"""The embedded pages as a dense config's data: what tools/train_seg.py, tools/test_seg.py, predict_seg and the
segmentation pictures run on when the config's data set is not on disk
(`backbones.dense.run_data.EmbeddedSegData`). The config keeps its model, heads, pipelines and test modes; its task
fits them to the pages, its schedule is replaced by one sized for minutes on 2 CPU cores, and its backbone, when the
config's ImageNet weights are not on disk, is the same model pretrained on the embedded scans (`cls_data`)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from mmengine.config import Config

from backbones.common.files import ready_mark
from backbones.common.log import logger
from backbones.common.outputs import output_folder
from backbones.dense.config import LOADERS, datasets
from backbones.dense.layouts import WrittenLayout, layout_of
from backbones.dense.tasks import SmallDenseData, task_of
from backbones.dense.train import PretrainedBackbone, Pretraining
from classification.digits.cls_data import RECIPE, EmbeddedScans, describe_backbone
from classification.digits.pages import CLASSES, DEPTH_SCALE, IMAGE_SIZE, PALETTE, VERSION, write_digits_ade

PAGES_DIR = Path('data/digits_seg')  # the default --digits-seg-dir
# The configs run on the pages at the scale that makes their training crop (ADE20K's configs': 512) the input size
# of the classification pretraining on the scans, 48/512 (pages.py says why the two must match).
SCALE = RECIPE['img_size'] / 512
# Training rescales by 0.75-1.5 rather than ADE20K's 0.5-2.0: the digits vary in size by themselves, and at half
# size they would span one or two tokens.
RATIO_RANGE = (0.75, 1.5)
# The multi-scale test's ratios of the single-scale size: the sizes training saw, not ADE20K's 0.75-1.75, which blow
# the digits up beyond them and scored below single-scale (docs/segmentation.md has the measurements).
TEST_RATIOS = (0.75, 1.0, 1.25, 1.5)


@dataclass(frozen=True)
class Schedule:
    """The schedule a config takes on the pages (minutes on 2 CPU cores); heads learn `head_lr_mult` times faster."""

    iters: int = 160
    warmup_iters: int = 16
    lr: float = 1.5e-4
    head_lr_mult: float = 10.0
    min_lr: float = 1e-6
    batch_size: int = 16
    val_interval: int = 160
    checkpoint_interval: int = 80
    log_interval: int = 10
    workers: int = 2
    seed: int = 0


@dataclass(frozen=True)
class EmbeddedPages:
    """The pages under `root`, written on first use; backbones pretrained on the scans of `scans`."""

    root: Path = PAGES_DIR
    scans: EmbeddedScans = field(default_factory=EmbeddedScans)
    scale: float = SCALE
    schedule: Schedule = field(default_factory=Schedule)  # a task changes it as its `small_schedule` says
    test_ratios: tuple[float, ...] = TEST_RATIOS
    description: ClassVar[str] = 'the embedded digits pages (scikit-learn\'s scans in rows, written on first use)'

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group('the embedded digits, used when the config\'s ADE20K is not on disk')
        group.add_argument('--digits-seg-dir', type=output_folder, default=PAGES_DIR,
                           help=f'where the embedded pages are written (default {PAGES_DIR})')
        EmbeddedScans.add_arguments(group)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EmbeddedPages:
        return cls(args.digits_seg_dir, EmbeddedScans.from_args(args))

    def use_data(self, cfg: Config) -> None:
        """Point the config at the pages (written on first use), as its task takes a small data set: its sizes fit
        to the pages (a semantic config's times `scale`), no mirror images (a mirrored digit is not a digit)."""
        write_digits_ade(self.root)
        data = self.as_small_data()
        layouts = {layout.title: layout.small_root(data) for layout in map(layout_of, datasets(cfg))
                   if isinstance(layout, WrittenLayout)}
        logger.info(f'data: the embedded digits pages in {self.root}'
                    + ''.join(f', written in the layout of {title} in {root}' for title, root in layouts.items()))
        task_of(cfg).use_small_data(cfg, data)

    def moved_to(self, root: Path) -> EmbeddedPages:
        """The pages in `root` where they are written there whole (its READY mark of this version), else these."""
        if ready_mark(root) == VERSION:
            return replace(self, root=Path(root))
        return self

    def as_small_data(self) -> SmallDenseData:
        return SmallDenseData(self.root, CLASSES, tuple(tuple(c) for c in PALETTE), IMAGE_SIZE, self.scale,
                              RATIO_RANGE, self.test_ratios, DEPTH_SCALE, mirrored=False)

    def use_schedule(self, cfg: Config) -> None:
        """Replace the config's ADE20K schedule by `schedule` (the tool merges command-line options after)."""
        schedule = replace(self.schedule, **task_of(cfg).small_schedule)
        cfg.train_cfg.update(max_iters=schedule.iters, val_interval=schedule.val_interval)
        cfg.optim_wrapper.optimizer['lr'] = schedule.lr
        paramwise = cfg.optim_wrapper.get('paramwise_cfg', {})
        custom_keys = {**paramwise.get('custom_keys', {}),
                       **{part: dict(lr_mult=schedule.head_lr_mult)
                          for part in ('neck', 'decode_head', 'auxiliary_head', 'rpn', 'roi_heads')}}
        cfg.optim_wrapper['paramwise_cfg'] = {**paramwise, 'custom_keys': custom_keys}
        cfg.param_scheduler = [
            dict(type='LinearLR', start_factor=1e-3, by_epoch=False, begin=0, end=schedule.warmup_iters),
            dict(type='PolyLR', power=1.0, eta_min=schedule.min_lr, by_epoch=False, begin=schedule.warmup_iters,
                 end=schedule.iters),
        ]
        cfg.train_dataloader['batch_size'] = schedule.batch_size
        for loader in LOADERS:
            if cfg.get(loader):
                cfg[loader]['num_workers'] = min(cfg[loader].get('num_workers', 0), schedule.workers)
        cfg.default_hooks['checkpoint']['interval'] = schedule.checkpoint_interval
        cfg.default_hooks['logger']['interval'] = schedule.log_interval
        cfg.randomness = dict(seed=schedule.seed)

    def use_model(self, cfg: Config) -> None:
        """The model as its task sizes it for a small data set, everywhere it is built."""
        task_of(cfg).use_small_model(cfg)

    def pretrained_backbone(self, pretraining: Pretraining) -> PretrainedBackbone:
        """The first stage of a run on the pages that asks for it: the config's backbone pretrained with token
        labeling on the scans (trained on first use, kept afterwards), and where it came from."""
        checkpoint = self.scans.pretrained_backbone(pretraining.model_name, pretraining.model_kwargs)
        return PretrainedBackbone(checkpoint, describe_backbone(checkpoint))
