"""Helpers for the detection and depth tests: a tiny COCO-format set and a tiny NYU-layout set, and tiny versions of
the real detector and depth configs over them."""
from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
from mmengine.config import Config
from pycocotools import mask as mask_utils

from backbones.dense.tta import tta_scales
from helpers.commands import ROOT
from helpers.seg_data import DIM, TINY_MODELS

CONFIGS = ROOT / 'seg_configs'
CATEGORIES = {3: 'cat', 17: 'dog', 42: 'bird'}  # ids not contiguous, as a set of one's own may have them
SIZE = (64, 48)  # width, height of the tiny images


def rle_text(mask: np.ndarray) -> dict:
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    return dict(size=list(rle['size']), counts=rle['counts'].decode('ascii'))


def uncompressed_rle(mask: np.ndarray) -> dict:
    """COCO's uncompressed RLE: run lengths in column-major order, starting with a run of zeros."""
    flat = mask.astype(np.uint8).flatten(order='F')
    changes = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]])))
    counts = np.diff(np.concatenate([[0], changes]))
    return dict(size=list(mask.shape), counts=[int(c) for c in counts])


def instance(mask: np.ndarray, image_id: int, category: int, number: int, kind: str) -> dict:
    """A COCO annotation of `mask`, its segmentation a polygon (rectangles), compressed or uncompressed RLE."""
    ys, xs = np.nonzero(mask)
    x1, y1, x2, y2 = xs.min(), ys.min(), xs.max() + 1, ys.max() + 1
    if kind == 'polygon':
        segmentation = [[float(v) for v in (x1, y1, x2, y1, x2, y2, x1, y2)]]
    else:
        segmentation = rle_text(mask) if kind == 'rle' else uncompressed_rle(mask)
    return dict(id=number, image_id=image_id, category_id=category, iscrowd=0, area=float(mask.sum()),
                bbox=[float(x1), float(y1), float(x2 - x1), float(y2 - y1)], segmentation=segmentation)


def write_tiny_coco(root: Path, counts=(('train', 6), ('val', 3)), seed: int = 0) -> Path:
    """COCO's layout for a set of one's own: root/annotations/instances_SPLIT.json and root/SPLIT/NAME.jpg. Each
    image holds up to two objects per category, drawn in the category's grey (rectangles as polygons, ellipses as
    compressed or uncompressed RLE); the last training image holds none, and the first holds a crowd region."""
    rng = np.random.default_rng(seed)
    width, height = SIZE
    for split, count in counts:
        (root / split).mkdir(parents=True, exist_ok=True)
        content = dict(images=[], annotations=[],
                       categories=[dict(id=cid, name=name) for cid, name in CATEGORIES.items()])
        for i in range(count):
            image = np.full((height, width, 3), 30, np.uint8)
            image_id = 100 + i
            objects = 0 if (split == 'train' and i == count - 1) else int(rng.integers(1, 4))
            for n in range(objects):
                category = list(CATEGORIES)[int(rng.integers(len(CATEGORIES)))]
                grey = 80 + 60 * list(CATEGORIES).index(category)
                mask = np.zeros((height, width), np.uint8)
                w, h = int(rng.integers(12, 24)), int(rng.integers(12, 24))
                x, y = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
                kind = ('polygon', 'rle', 'counts')[n % 3]
                if kind == 'polygon':
                    mask[y:y + h, x:x + w] = 1
                else:
                    cv2.ellipse(mask, (x + w // 2, y + h // 2), (w // 2, h // 2), 0, 0, 360, 1, -1)
                image[mask > 0] = grey
                content['annotations'].append(instance(mask, image_id, category, len(content['annotations']) + 1,
                                                       kind))
            if split == 'train' and i == 0:
                crowd = np.zeros((height, width), np.uint8)
                crowd[:6, :10] = 1
                content['annotations'].append(dict(instance(crowd, image_id, 3, len(content['annotations']) + 1,
                                                            'rle'), iscrowd=1))
            name = f'{split}_{i:03d}.jpg'
            cv2.imwrite(str(root / split / name), image)
            content['images'].append(dict(id=image_id, file_name=name, width=width, height=height))
        (root / 'annotations').mkdir(exist_ok=True)
        (root / 'annotations' / f'instances_{split}.json').write_text(json.dumps(content))
    return root


def linked_coco(coco_set: Path, folder: Path, annotations: dict[str, dict]) -> Path:
    """A COCO-format set at `folder` holding `coco_set`'s images (its split folders linked) and the annotation files
    `annotations` gives (split -> the file's content; a split it leaves out has no file)."""
    (folder / 'annotations').mkdir(parents=True)
    for split in ('train', 'val'):
        (folder / split).symlink_to(coco_set / split)
    for split, content in annotations.items():
        (folder / 'annotations' / f'instances_{split}.json').write_text(json.dumps(content))
    return folder


def write_tiny_nyu(root: Path, counts=(('train', 6), ('test', 3)), seed: int = 0) -> Path:
    """NYU-v2's layout (images/SPLIT/NAME.jpg, annotations/SPLIT/NAME.png in 16-bit millimetres): a ground getting
    nearer towards the bottom and a few boxes whose depth follows their grey; a strip without measurement (0)."""
    rng = np.random.default_rng(seed)
    width, height = SIZE
    for split, count in counts:
        for folder in ('images', 'annotations'):
            (root / folder / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            image = np.full((height, width, 3), 40, np.uint8)
            depth = np.repeat(np.linspace(6000, 3000, height)[:, None], width, 1)
            for _ in range(2):
                grey = int(rng.integers(80, 250))
                x, y = int(rng.integers(0, width - 16)), int(rng.integers(0, height - 16))
                image[y:y + 16, x:x + 16] = grey
                depth[y:y + 16, x:x + 16] = 500 + 8 * grey
            depth[:, :3] = 0
            cv2.imwrite(str(root / 'images' / split / f'{split}_{i:03d}.jpg'), image)
            cv2.imwrite(str(root / 'annotations' / split / f'{split}_{i:03d}.png'), depth.astype(np.uint16))
    return root


TINY_DETECTOR = dict(neck=dict(in_channels=DIM, out_channels=16), fc_channels=32, head_convs=1,
                     roi_heads=dict(batch_size_per_image=16),
                     rpn=dict(pre_nms_top_n=dict(training=50, testing=50), post_nms_top_n=dict(training=20,
                                                                                               testing=20)))
TINY_DEPTH = dict(neck=dict(in_channels=DIM, out_channels=(16, 16, 16, 16)),
                  decode_head=dict(in_channels=[16, 16, 16, 16], channels=16))


def is_detector(config_name: str) -> bool:
    """Whether a config of seg_configs builds a detector (Mask R-CNN or Cascade Mask R-CNN)."""
    return 'maskrcnn' in config_name


def tiny_dense_overrides(config_name: str, family: str = 'upernet_lvvit_s.py') -> dict:
    """A config's `model` overrides for a 4-block, 32-wide backbone of `family` (a key of TINY_MODELS) and small
    heads."""
    detector = is_detector(config_name)
    blocks = 1 if detector or config_name.startswith('depth_linear_') else 4
    backbone = dict(model_kwargs=TINY_MODELS[family], out_indices=tuple(range(4 - blocks, 4)), img_size=64,
                    pretrained=None)
    if family != 'upernet_lvvit_s.py':
        backbone['model_name'] = Config.fromfile(CONFIGS / family).model.backbone.model_name
    if config_name.startswith('depth_linear'):  # each block's patch and class tokens into the linear head
        return dict(backbone=backbone, decode_head=dict(in_channels=[2 * DIM] * blocks))
    return dict(backbone=backbone, **(TINY_DETECTOR if detector else TINY_DEPTH))


def config_model(config_name: str) -> dict:
    """The `model` of a real config with the tiny backbone and heads of `tiny_dense_overrides`."""
    cfg = Config.fromfile(CONFIGS / config_name)
    cfg.merge_from_dict(dict(model=tiny_dense_overrides(config_name)))
    return cfg.model.to_dict()


def write_tiny_dense_config(path: Path, config_name: str, data_root: Path, family: str = 'upernet_lvvit_s.py') -> Path:
    """A config file inheriting a real detector or depth config, with a tiny model of `family`'s backbone, no
    loader workers, and its pipelines' sizes fitted to the tiny images (the test-time augmentation's scales at the
    config's ratios of them); the detector's set is COCO-format with splits train and val."""
    base = Config.fromfile(CONFIGS / config_name).to_dict()
    test_scale = next(step['scale'] for step in base['test_dataloader']['dataset']['pipeline']
                      if step['type'] == 'Resize')
    for step in tta_scales(base['tta_pipeline']):
        ratio = step['scale'][1] / test_scale[1]
        step['scale'] = (round(SIZE[0] * ratio), round(SIZE[1] * ratio))
    loaders = {}
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        pipeline = base[key]['dataset']['pipeline']
        for step in pipeline:
            if step['type'] == 'LargeScaleJitter':
                step.update(size=SIZE, scale_range=(0.8, 1.2))
            elif step['type'] == 'Resize':
                step['scale'] = SIZE
            elif step['type'] == 'RandomCrop':
                step['crop_size'] = (40, 40)
        dataset = dict(data_root=str(data_root), pipeline=pipeline)
        if is_detector(config_name):
            split = 'train' if key == 'train_dataloader' else 'val'
            dataset.update(ann_file=f'annotations/instances_{split}.json', data_prefix=dict(img_path=f'{split}/'))
        loaders[key] = dict(num_workers=0, persistent_workers=False, dataset=dataset)
    overrides = dict(model=tiny_dense_overrides(config_name, family), **loaders, tta_pipeline=base['tta_pipeline'],
                     default_hooks=dict(logger=dict(interval=1)))
    if not is_detector(config_name):
        overrides.update(val_evaluator=dict(crop_type=None), test_evaluator=dict(crop_type=None))
    lines = [f'_base_ = [{str(CONFIGS / config_name)!r}]'] + [f'{k} = {v!r}' for k, v in overrides.items()]
    path.write_text('\n'.join(lines) + '\n')
    return path
