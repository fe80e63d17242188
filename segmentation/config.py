"""Config preparation shared by tools/train_seg.py and tools/test_seg.py."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Optional

from mmengine.config import Config

from .digits import CLASSES, write_digits_ade

ADE20K_ROOT = 'data/ade/ADEChallengeData2016'
DIGITS_ROOT = 'data/digits_seg'
DIGITS_SCALE = 0.25  # the embedded set's images are a quarter of ADE20K's scale
LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')
_SIZE_KEYS = ('scale', 'crop_size', 'size', 'stride')


def load_config(path: str, cfg_options: Optional[dict] = None) -> Config:
    if not Path(path).is_file():
        raise FileNotFoundError(f'{path}: config file not found')
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


def _scale_sizes(node, factor: float) -> None:
    """Multiply every (w, h) size under `node` (pipelines, preprocessor, slide window) by `factor`, in place."""
    if isinstance(node, list):
        for item in node:
            _scale_sizes(item, factor)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in _SIZE_KEYS and isinstance(value, (tuple, list)) and all(isinstance(v, int) for v in value):
                node[key] = tuple(max(1, round(v * factor)) for v in value)
            else:
                _scale_sizes(value, factor)


def use_digits_data(cfg: Config, scale: float = DIGITS_SCALE) -> None:
    """Point the config at the embedded digits set (written on first use), its sizes times `scale`."""
    write_digits_ade(DIGITS_ROOT)
    for dataset in _datasets(cfg):
        dataset.update(type='DigitsSegDataset', data_root=DIGITS_ROOT)
        _scale_sizes(dataset['pipeline'], scale)
    _scale_sizes(cfg.get('tta_pipeline', []), scale)
    _scale_sizes(cfg.model.get('data_preprocessor', {}), scale)
    _scale_sizes(cfg.model.get('test_cfg', {}), scale)
    for head in ('decode_head', 'auxiliary_head'):
        if cfg.model.get(head):
            cfg.model[head]['num_classes'] = len(CLASSES)
    pretrained = cfg.model.backbone.get('pretrained')
    if pretrained and not Path(pretrained).is_file():
        print(f'{pretrained} not found: the backbone starts from random weights on the digits set')
        cfg.model.backbone['pretrained'] = None


def resolve_data(cfg: Config, data_root: Optional[str] = None) -> bool:
    """Apply `data_root`; fall back to the digits set when the config's ADE20K is not on disk. True if it did."""
    if data_root:
        set_data_root(cfg, data_root)
    roots = {dataset['data_root'] for dataset in _datasets(cfg)}
    missing = sorted(root for root in roots if not Path(root).is_dir())
    if not missing:
        return False
    if missing != [ADE20K_ROOT]:
        raise FileNotFoundError(f'data root not found: {", ".join(missing)}')
    print(f'ADE20K not found at {ADE20K_ROOT}: using the embedded digits set in {DIGITS_ROOT} '
          '(see README, "Segmentation on ADE20K", to use the real data)')
    use_digits_data(cfg)
    return True


def check_pretrained(cfg: Config) -> None:
    pretrained = cfg.model.backbone.get('pretrained')
    if pretrained and not Path(pretrained).is_file():
        raise FileNotFoundError(
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
    interval = max(1, round(cfg.default_hooks['checkpoint']['interval'] * factor))
    cfg.train_cfg['val_interval'] = iters
    cfg.default_hooks['checkpoint']['interval'] = interval
    cfg.default_hooks['logger']['interval'] = min(cfg.default_hooks['logger']['interval'], interval)
