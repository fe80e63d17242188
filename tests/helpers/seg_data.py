"""Helpers for the segmentation tests: tiny versions of the real configs, a tiny ADE20K-format data set."""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
from mmengine.config import Config

from backbones.dense.config import scale_sizes
from helpers.commands import ROOT

CONFIGS = ROOT / 'seg_configs'
OWN_CLASSES = ('background', 'road', 'car', 'tree', 'sky')  # write_own_seg's: class 0 is a real class
TINY_SCALE = 1 / 8  # ADE20K's 512 px crops and (2048, 512) test scale become 64 px and (256, 64)
DIM = 32
# Per family: the model overrides that make a tiny version of each config's backbone.
TINY_MODELS = {
    'upernet_lvvit_s.py': dict(embed_dim=DIM, depth=4, num_heads=2, stem_chs=8),
    'fcn_lvvit_s.py': dict(embed_dim=DIM, depth=4, num_heads=2, stem_chs=8),
    'upernet_t2t_vit_14.py': dict(embed_dim=DIM, depth=4, num_heads=2, token_dim=8),
    'upernet_cait_s24.py': dict(embed_dim=DIM, depth=4, num_heads=2, depth_token_only=1),
    'upernet_deit_s.py': dict(embed_dim=DIM, depth=4, num_heads=2),
    'upernet_dinov2_s.py': dict(embed_dim=DIM, depth=4, num_heads=2),
}


def tiny_model_overrides(config_name: str, img_size: int = 64) -> dict:
    """Overrides (a config's `model` dict) for a 4-block, 32-wide backbone and 16-channel heads."""
    if config_name.startswith('linear'):
        return tiny_linear_overrides(config_name, img_size)
    levels = 2 if config_name.startswith('fcn') else 4
    neck_out = (DIM,) * (levels - 1) + (48,)
    model = dict(
        backbone=dict(model_kwargs=TINY_MODELS[config_name.replace('_own_data', '')],
                      out_indices=tuple(range(4 - levels, 4)),
                      img_size=img_size, pretrained=None),
        neck=dict(in_channels=DIM, out_channels=neck_out),
        auxiliary_head=dict(in_channels=DIM, channels=16),
    )
    if levels == 4:
        model['decode_head'] = dict(in_channels=list(neck_out), channels=16)
    else:
        model['decode_head'] = dict(in_channels=neck_out[-1], channels=16)
    return model


def tiny_linear_overrides(config_name: str, img_size: int) -> dict:
    """A linear config's overrides: the tiny backbone of its family, its last block (or last 4: "+ms") into the
    linear head."""
    blocks = 4 if config_name.startswith('linear_ms') else 1
    family = 'upernet_dinov2_s.py' if 'dinov2' in config_name else 'upernet_lvvit_s.py'
    return dict(backbone=dict(model_kwargs=TINY_MODELS[family], out_indices=tuple(range(4 - blocks, 4)),
                              img_size=img_size, pretrained=None),
                decode_head=dict(in_channels=[DIM] * blocks, channels=DIM * blocks))


def tiny_config(config_name: str, img_size: int = 64) -> Config:
    cfg = Config.fromfile(CONFIGS / config_name)
    cfg.merge_from_dict(dict(model=tiny_model_overrides(config_name, img_size)))
    return cfg


def write_tiny_config(path: Path, config_name: str, data_root: Path) -> Path:
    """A config file that inherits a real one, with a tiny model, whole-image test, no loader workers, and every
    size of its pipelines at TINY_SCALE (the tiny sets' images are 40-72 px)."""
    base = Config.fromfile(CONFIGS / config_name).to_dict()
    loaders = {}
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        pipeline = base[key]['dataset']['pipeline']
        scale_sizes(pipeline, TINY_SCALE)
        loaders[key] = dict(num_workers=0, persistent_workers=False,
                            dataset=dict(data_root=str(data_root), pipeline=pipeline))
    scale_sizes(base['tta_pipeline'], TINY_SCALE)
    preprocessor = base['model']['data_preprocessor']
    scale_sizes(preprocessor, TINY_SCALE)
    overrides = dict(
        model=dict(tiny_model_overrides(config_name), data_preprocessor=preprocessor,
                   test_cfg=dict(_delete_=True, mode='whole')),
        tta_pipeline=base['tta_pipeline'], **loaders,
        default_hooks=dict(logger=dict(interval=1), visualization=dict(type='SegVisualizationHook')),
    )
    lines = [f'_base_ = [{str(CONFIGS / config_name)!r}]'] + [f'{k} = {v!r}' for k, v in overrides.items()]
    path.write_text('\n'.join(lines) + '\n')
    return path


def ade20k_name(split: str, index: int) -> str:
    """ADE20K's name of an image (without suffix): ADE_train_00000001, ADE_val_00000001."""
    return f'ADE_{"train" if split == "training" else "val"}_{index:08d}'


def write_tiny_ade(root: Path, counts=(('training', 4), ('validation', 3)), seed: int = 0) -> Path:
    """Small images in ADE20K's layout and names (ADE_train_00000000.jpg): rectangles of a few classes (ADE labels
    1..6) on class 1, some 0 (ignored)."""
    rng = np.random.default_rng(seed)
    for split, count in counts:
        for i in range(count):
            h, w = rng.integers(40, 72, 2)
            label = np.ones((h, w), np.uint8)
            image = np.zeros((h, w, 3), np.uint8) + 60
            for _ in range(3):
                cls = int(rng.integers(2, 7))
                y, x = rng.integers(0, h - 8), rng.integers(0, w - 8)
                label[y:y + 12, x:x + 16] = cls
                image[y:y + 12, x:x + 16] = (cls * 40) % 256
            label[:2] = 0
            write_pair(root, 'annotations', split, ade20k_name(split, i), image, label)
    return root


def write_pair(root: Path, mask_dir: str, split: str, name: str, image: np.ndarray, mask: np.ndarray) -> None:
    """root/images/SPLIT/NAME.jpg and root/MASK_DIR/SPLIT/NAME.png (folders made as needed)."""
    for folder, suffix, pixels in (('images', '.jpg', image), (mask_dir, '.png', mask)):
        (root / folder / split).mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(root / folder / split / f'{name}{suffix}'), pixels)


def write_own_seg(root: Path, classes=OWN_CLASSES, counts=(('train', 6), ('val', 3)), classes_file: bool = True,
                  seed: int = 0) -> Path:
    """A data set in the own-data layout (images/SPLIT, masks/SPLIT, classes.txt): class 0 ('background', a class
    like the others) fills each image but for rectangles of the other classes, each drawn in its own grey; a few
    pixels are 255 (ignored)."""
    rng = np.random.default_rng(seed)
    for split, count in counts:
        for i in range(count):
            h, w = rng.integers(56, 80, 2)
            mask = np.zeros((h, w), np.uint8)
            for cls in range(1, len(classes)):
                y, x = rng.integers(0, h - 24), rng.integers(0, w - 24)
                mask[y:y + 24, x:x + 24] = cls
            image = np.stack([mask * 50 + 20] * 3, -1).astype(np.uint8)
            mask[-2:, :3] = 255
            write_pair(root, 'masks', split, f'{split}_{i}', image, mask)
    if classes_file:
        (root / 'classes.txt').write_text('# name, optional R G B\n' + '\n'.join(
            f'{name} {i * 40} 100 200' if i % 2 else name for i, name in enumerate(classes)) + '\n')
    return root


def independent_scores(pred_dir: Path, ann_dir: Path, num_classes: int = 150, zero_ignored: bool = True) -> dict:
    """mIoU / mAcc / aAcc from the saved PNGs (ADE20K values: 0 ignored, class c stored as c + 1; without
    `zero_ignored`, class c stored as c and 255 ignored)."""
    hist = np.zeros((num_classes, num_classes), np.int64)
    shift = 1 if zero_ignored else 0
    for ann in sorted(ann_dir.glob('*.png')):
        gt = cv2.imread(str(ann), cv2.IMREAD_UNCHANGED).astype(np.int64) - shift
        pred = cv2.imread(str(pred_dir / ann.name), cv2.IMREAD_UNCHANGED).astype(np.int64) - shift
        valid = (gt >= 0) & (gt < num_classes)
        hist += np.bincount(gt[valid] * num_classes + pred[valid], minlength=num_classes ** 2).reshape(hist.shape)
    tp = np.diag(hist).astype(float)
    union = hist.sum(0) + hist.sum(1) - tp
    present = union > 0
    with np.errstate(invalid='ignore', divide='ignore'):
        acc = tp / hist.sum(1)
    return {'mIoU': 100 * np.mean(tp[present] / union[present]), 'aAcc': 100 * tp.sum() / hist.sum(),
            'mAcc': 100 * np.nanmean(acc)}
