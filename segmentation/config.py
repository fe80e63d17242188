"""Config preparation shared by tools/train_seg.py and tools/test_seg.py."""
from __future__ import annotations

import copy

from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator

from mmengine.config import Config

from common.errors import CheckpointError, DataError, UsageError
from classification.recipes import DIGITS as DIGITS_RECIPE
from common.log import logger

from .digits import CLASSES, write_digits_ade

ADE20K_ROOT = 'data/ade/ADEChallengeData2016'
DIGITS_ROOT = 'data/digits_seg'
ADE20K_CROP = 512  # the configs' training crop side
# The configs run on the embedded set at the scale that makes their training crop the input size of the
# classification pretraining on digits, 48/512 (segmentation/digits.py says why the two must match).
DIGITS_SCALE = DIGITS_RECIPE['img_size'] / ADE20K_CROP
# Training rescales by 0.75-1.5 rather than ADE20K's 0.5-2.0: the digits vary in size by themselves, and at half
# size they would span one or two tokens.
DIGITS_RATIO_RANGE = (0.75, 1.5)
LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')
_SIZE_KEYS = ('scale', 'crop_size', 'size', 'stride')


def load_config(path: str, cfg_options: dict | None = None) -> Config:
    if not Path(path).is_file():
        raise UsageError(f'{path}: config file not found')
    cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    return cfg


def _datasets(cfg: Config) -> Iterator[dict]:
    for loader in LOADERS:
        if cfg.get(loader):
            yield cfg[loader]['dataset']


def set_data_root(cfg: Config, root: str) -> None:
    for dataset in _datasets(cfg):
        dataset['data_root'] = root


def scale_sizes(node, factor: float) -> None:
    """Multiply every (w, h) size under `node` (pipelines, preprocessor, slide window) by `factor`, in place."""
    if isinstance(node, list):
        for item in node:
            scale_sizes(item, factor)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in _SIZE_KEYS and isinstance(value, (tuple, list)) and all(isinstance(v, int) for v in value):
                node[key] = tuple(max(1, round(v * factor)) for v in value)
            else:
                scale_sizes(value, factor)


@dataclass(frozen=True)
class DigitsSchedule:
    """The schedule a config takes on the embedded set, sized for minutes on 2 CPU cores (ADE20K's 160k iterations
    of 16 images would take days there). AdamW as the config says, at this lr: linear warm-up, then linear decay.
    The neck and heads, which start from random weights, learn `head_lr_mult` times faster than the backbone."""

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


DIGITS_SCHEDULE = DigitsSchedule()


def use_digits_schedule(cfg: Config, schedule: DigitsSchedule = DIGITS_SCHEDULE) -> None:
    """Replace the config's ADE20K schedule by `schedule` (options given on the command line are merged after)."""
    cfg.train_cfg.update(max_iters=schedule.iters, val_interval=schedule.val_interval)
    cfg.optim_wrapper.optimizer['lr'] = schedule.lr
    paramwise = cfg.optim_wrapper.get('paramwise_cfg', {})
    custom_keys = {**paramwise.get('custom_keys', {}),
                   **{part: dict(lr_mult=schedule.head_lr_mult) for part in ('neck', 'decode_head', 'auxiliary_head')}}
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


def describe_schedule(cfg: Config) -> str:
    """The schedule a run takes, in one line."""
    warmup, decay = cfg.param_scheduler[0], cfg.param_scheduler[-1]
    accumulate = cfg.optim_wrapper.get('accumulative_counts', 1)
    batches = (f', {accumulate} accumulated per update' if accumulate > 1 else '')
    return (f'{cfg.train_cfg["max_iters"]} iterations of {cfg.train_dataloader["batch_size"]} images{batches}, '
            f'lr {cfg.optim_wrapper.optimizer["lr"]:.3g} ({warmup.get("end", 0)} warm-up, then to '
            f'{decay.get("eta_min", 0):.3g}), validation every {cfg.train_cfg["val_interval"]}, checkpoint every '
            f'{cfg.default_hooks["checkpoint"]["interval"]}')


def accumulate_gradients(cfg: Config, steps: int) -> None:
    """One optimizer update every `steps` iterations (mmengine's `accumulative_counts`: each loss divided by
    `steps`, the gradients summed). mmengine counts iterations, not updates, so every count of the schedule (its
    length, warm-up and decay, validation and checkpoint intervals) is multiplied by `steps`: the run makes the
    config's number of updates, each of `steps` times the batch, along the same lr curve. The lr is the config's,
    which the papers set for their global batch (ADE20K: 16 images per update)."""
    if steps == 1:
        return
    cfg.optim_wrapper['accumulative_counts'] = steps
    cfg.train_cfg['max_iters'] *= steps
    cfg.train_cfg['val_interval'] *= steps
    for scheduler in cfg.param_scheduler:
        for key in ('begin', 'end'):
            if key in scheduler:
                scheduler[key] *= steps
    cfg.default_hooks['checkpoint']['interval'] *= steps


def use_digits_data(cfg: Config, scale: float = DIGITS_SCALE) -> None:
    """Point the config at the embedded digits set (written on first use), its sizes times `scale`."""
    write_digits_ade(DIGITS_ROOT)
    for dataset in _datasets(cfg):
        dataset.update(type='DigitsSegDataset', data_root=DIGITS_ROOT)
        scale_sizes(dataset['pipeline'], scale)
        for step in dataset['pipeline']:
            if 'ratio_range' in step:
                step['ratio_range'] = DIGITS_RATIO_RANGE
            if step['type'] == 'RandomFlip':
                step['prob'] = 0.0  # a mirrored digit is not a digit
    if cfg.get('tta_model'):
        drop_tta_flips(cfg)
    scale_sizes(cfg.get('tta_pipeline', []), scale)
    scale_sizes(cfg.model.get('data_preprocessor', {}), scale)
    scale_sizes(cfg.model.get('test_cfg', {}), scale)
    for head in ('decode_head', 'auxiliary_head'):
        if cfg.model.get(head):
            cfg.model[head]['num_classes'] = len(CLASSES)


def drop_tta_flips(cfg: Config) -> None:
    """Test at every scale of the multi-scale test without the mirror images."""
    cfg.tta_model['flip'] = False


def flipping_tta_pipeline(pipeline: list) -> list:
    """mmseg's way of a multi-scale + flip test, for comparison: a copy of a test-time pipeline that flips every
    scale itself (each scale resized twice, ten views for SegTTAModel)."""
    pipeline = copy.deepcopy(pipeline)
    tta = next(step for step in pipeline if step['type'] == 'TestTimeAug')
    tta['transforms'].insert(1, [dict(type='RandomFlip', prob=0.0, direction='horizontal'),
                                 dict(type='RandomFlip', prob=1.0, direction='horizontal')])
    return pipeline


def tta_flips(cfg: Config) -> bool:
    """Whether the multi-scale test adds each scale's mirror image."""
    return bool(cfg.tta_model.get('flip', False))


def resolve_data(cfg: Config, data_root: str | None = None) -> bool:
    """Apply `data_root`; fall back to the digits set when the config's ADE20K is not on disk. True if it did."""
    if data_root:
        set_data_root(cfg, data_root)
    roots = {dataset['data_root'] for dataset in _datasets(cfg)}
    missing = sorted(root for root in roots if not Path(root).is_dir())
    if not missing:
        return False
    if missing != [ADE20K_ROOT]:
        raise DataError(f'data root not found: {", ".join(missing)}')
    logger.info(f'ADE20K not found at {ADE20K_ROOT}: using the embedded digits set in {DIGITS_ROOT} '
                '(see README, "Segmentation on ADE20K", to use the real data)')
    use_digits_data(cfg)
    return True


def check_pretrained(cfg: Config) -> None:
    pretrained = cfg.model.backbone.get('pretrained')
    if pretrained and not Path(pretrained).is_file():
        raise CheckpointError(
            f'backbone checkpoint {pretrained} not found: download the ImageNet weights (README, "Segmentation on '
            'ADE20K"), point model.backbone.pretrained at yours, or set it to None to train from scratch')


def shorten_schedule(cfg: Config, iters: int) -> None:
    """Run the schedule in `iters` iterations: warm-up, decay and the checkpoint interval shrink with it, and
    validation (the slow part of a short run) happens once, at the end."""
    factor = iters / cfg.train_cfg['max_iters']
    cfg.train_cfg['max_iters'] = iters
    for scheduler in cfg.param_scheduler:
        for key in ('begin', 'end'):
            if key in scheduler:
                scheduler[key] = min(iters, max(1 if scheduler[key] else 0, round(scheduler[key] * factor)))
    # a phase left with no iteration (the decay of a 1-iteration run) is dropped: mmengine refuses begin == end
    cfg.param_scheduler = [s for s in cfg.param_scheduler if s.get('end', iters) > s.get('begin', 0)]
    interval = max(1, round(cfg.default_hooks['checkpoint']['interval'] * factor))
    cfg.train_cfg['val_interval'] = iters
    cfg.default_hooks['checkpoint']['interval'] = interval
    cfg.default_hooks['logger']['interval'] = min(cfg.default_hooks['logger']['interval'], interval)
