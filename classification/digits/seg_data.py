"""The embedded pages as a segmentation config's data: what tools/train_seg.py, tools/test_seg.py and the
segmentation pictures run on when the config's ADE20K is not on disk (`backbones.segmentation.config.EmbeddedSegData`).

The config keeps its model, heads, pipelines and test modes; its sizes are scaled to the pages, its schedule is
replaced by one sized for minutes on 2 CPU cores, and its backbone, when the config's ImageNet weights are not on
disk, is the same model pretrained with token labeling on the embedded scans (`cls_data`): the first stage of
tools/train_seg.py (`train_seg`), whose checkpoint the segmentation trainer then starts from.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from mmengine.config import Config

from backbones.common.cli import output_folder
from backbones.common.log import logger
from backbones.segmentation.config import ADE20K_CROP, LOADERS, dense_task, drop_tta_flips, scale_sizes
from backbones.segmentation.own_data import set_classes
from backbones.segmentation.train import (
    PretrainedBackbone,
    Pretraining,
    build_parser,
    parse_with_fallback,
    prepare,
    train,
)
from classification.digits.cls_data import RECIPE, EmbeddedScans, describe_backbone
from classification.digits.pages import CLASSES, DATASET, IMAGE_SIZE, PALETTE, write_digits_ade

PAGES_DIR = Path('data/digits_seg')  # the default --digits-seg-dir
# The configs run on the pages at the scale that makes their training crop the input size of the classification
# pretraining on the scans, 48/512 (pages.py says why the two must match).
SCALE = RECIPE['img_size'] / ADE20K_CROP
# Training rescales by 0.75-1.5 rather than ADE20K's 0.5-2.0: the digits vary in size by themselves, and at half
# size they would span one or two tokens.
RATIO_RANGE = (0.75, 1.5)
# The multi-scale test's ratios of the single-scale size: the sizes training saw, not ADE20K's 0.75-1.75, which blow
# the digits up beyond them and scored below single-scale (docs/segmentation.md has the measurements).
TEST_RATIOS = (0.75, 1.0, 1.25, 1.5)
# A detector's heads on the pages, sized for minutes on 2 CPU cores (ViTDet's 256-channel heads on 512 regions per
# image take 45 s an iteration there): 64-channel pyramid and heads, 64 sampled regions per image, fewer proposals.
DETECTOR_ON_PAGES = dict(neck=dict(out_channels=64), fc_channels=256, roi_heads=dict(batch_size_per_image=64),
                         rpn=dict(pre_nms_top_n=dict(training=300, testing=300),
                                  post_nms_top_n=dict(training=100, testing=100)))
# The depth configs' sizes on the pages: NYU's 480 px crops become the pages' 48 px height.
DEPTH_SCALE = 48 / 480


@dataclass(frozen=True)
class Schedule:
    """The schedule a config takes on the pages, sized for minutes on 2 CPU cores (ADE20K's 160k iterations of 16
    images would take days there). AdamW as the config says, at this lr: linear warm-up, then linear decay. The neck
    and heads, which start from random weights, learn `head_lr_mult` times faster than the backbone."""

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


# A detector's: its heads start from random weights and learn at a higher lr for longer, on fewer images a batch
# (with the config's layer-wise lr decay, the backbone's lr shrinks towards its input).
DETECTOR_SCHEDULE = Schedule(iters=400, lr=5e-4, batch_size=8, val_interval=400, checkpoint_interval=200)


@dataclass(frozen=True)
class EmbeddedPages:
    """The pages under `root`, written on first use; backbones pretrained on the scans of `scans`."""

    root: Path = PAGES_DIR
    scans: EmbeddedScans = field(default_factory=EmbeddedScans)
    scale: float = SCALE
    schedule: Schedule = field(default_factory=Schedule)
    detector_schedule: Schedule = DETECTOR_SCHEDULE
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
        """Point the config at the pages (written on first use), its sizes times `scale`, mirror images off: their
        class maps for a semantic config, their digits as COCO instances for a detector, their synthetic depth for a
        depth model."""
        logger.info(f'data: the embedded digits pages in {self.root}')
        write_digits_ade(self.root)
        task = dense_task(cfg)
        for loader in LOADERS:
            if not cfg.get(loader):
                continue
            dataset = cfg[loader]['dataset']
            split = 'training' if loader == 'train_dataloader' else 'validation'
            if task == 'instances':
                dataset.update(type='CocoInstances', data_root=str(self.root),
                               ann_file=f'annotations/instances_{split}.json',
                               data_prefix=dict(img_path=f'images/{split}'))
            elif task == 'depth':
                dataset.update(type='NYUDataset', data_root=str(self.root), img_suffix='.jpg', depth_map_suffix='.png',
                               data_prefix=dict(img_path=f'images/{split}', depth_map_path=f'depth/{split}'))
            else:
                dataset.update(DATASET, data_root=str(self.root),
                               data_prefix=dict(img_path=f'images/{split}', seg_map_path=f'annotations/{split}'))
            self.fit_pipeline(dataset['pipeline'], task)
        if task == 'depth':
            for evaluator in ('val_evaluator', 'test_evaluator'):
                cfg[evaluator].update(crop_type=None)  # NYU's crop is for NYU's 640x480 images
        if task != 'semantic':
            return
        if cfg.get('tta_model'):
            drop_tta_flips(cfg)
        if cfg.get('tta_pipeline'):
            self.use_test_ratios(cfg)
        scale_sizes(cfg.model.get('data_preprocessor', {}), self.scale)
        scale_sizes(cfg.model.get('test_cfg', {}), self.scale)
        set_classes(cfg, CLASSES, PALETTE, reduce_zero_label=True)  # data sets and heads

    def fit_pipeline(self, pipeline: list[dict], task: str) -> None:
        """A pipeline's sizes for the pages, in place: a semantic or depth config's times `scale` (its training crop
        becomes the pretraining's input size), a detector's large-scale jitter and test size the page's own, the
        jitter within RATIO_RANGE; no mirror images."""
        if task == 'instances':
            for step in pipeline:
                if step['type'] == 'LargeScaleJitter':
                    step.update(size=IMAGE_SIZE, scale_range=RATIO_RANGE)
                if step['type'] == 'Resize':
                    step['scale'] = IMAGE_SIZE
        else:
            scale_sizes(pipeline, self.scale if task == 'semantic' else DEPTH_SCALE)
        for step in pipeline:
            if 'ratio_range' in step:
                step['ratio_range'] = RATIO_RANGE
            if step['type'] in ('RandomFlip', 'RandomInstanceFlip'):
                step['prob'] = 0.0  # a mirrored digit is not a digit

    def use_test_ratios(self, cfg: Config) -> None:
        """The multi-scale test resizes to `test_ratios` times the single-scale test's size (already scaled)."""
        size = next(step['scale'] for step in cfg.test_dataloader.dataset.pipeline if step['type'] == 'Resize')
        tta = next(step for step in cfg.tta_pipeline if step['type'] == 'TestTimeAug')
        tta['transforms'][0] = [dict(type='Resize', scale=(round(size[0] * r), round(size[1] * r)), keep_ratio=True)
                                for r in self.test_ratios]

    def use_schedule(self, cfg: Config) -> None:
        """Replace the config's ADE20K schedule by `schedule` (the tool merges command-line options after)."""
        detector = dense_task(cfg) == 'instances'
        schedule = self.detector_schedule if detector else self.schedule
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
        """A detector's pyramid and heads sized for the pages (DETECTOR_ON_PAGES), in training, tests and
        predictions alike; other models keep the config's sizes."""
        if dense_task(cfg) == 'instances':
            cfg.merge_from_dict(dict(model=DETECTOR_ON_PAGES))

    def pretrained_backbone(self, pretraining: Pretraining) -> PretrainedBackbone:
        """The first stage of a run on the pages that asks for it: the config's backbone pretrained with token
        labeling on the scans (trained on first use, kept afterwards), and where it came from."""
        checkpoint = self.scans.pretrained_backbone(pretraining.model_name, pretraining.model_kwargs)
        return PretrainedBackbone(checkpoint, describe_backbone(checkpoint))


def train_seg(argv: list[str] | None = None, description: str | None = None) -> None:
    """tools/train_seg.py: a segmentation config trained; without its data on disk, on the embedded pages, and where
    its ImageNet weights are not on disk either, in two stages: the backbone pretrained on the embedded scans (kept
    for the next run), then the segmentor from that checkpoint."""
    args, pages = parse_with_fallback(build_parser(description), argv, EmbeddedPages)
    run = prepare(args, pages)
    train(run, pages.pretrained_backbone(run.pretraining) if run.pretraining else None)
