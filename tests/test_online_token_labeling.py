"""Online token labeling (the paper's Table 4): the annotator's map of each batch gives the token targets. They are
the targets a store the same annotator made for the same crops gives, to the store's fp16."""
from __future__ import annotations

import json

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from backbones.common.distributed import DistInfo
from classification.data.augment import CropGeometry, identity_geometry
from classification.recipes import recipe_for
from classification.token_labeling.annotate import generate_token_labels
from classification.token_labeling.label_store import TokenLabelStore
from classification.train import main
from classification.training_pieces import TeacherSpec, build_teacher, make_objective

SIZE, CLASSES, TOPK = 48, 6, 5
ANNOTATOR_KWARGS = {'output_stride': 16}  # a 3x3 map at 48 px, the student's token grid


@pytest.fixture(scope='module')
def crops(tmp_path_factory):
    """Twelve 48 px 'crops' (smooth random pictures) as an ImageNet-layout folder, and a random resnet10t."""
    root = tmp_path_factory.mktemp('online')
    rng = np.random.default_rng(0)
    pixels = {}
    for i in range(12):
        small = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
        picture = np.asarray(Image.fromarray(small).resize((SIZE, SIZE), Image.BILINEAR))
        path = root / 'data' / 'train' / f'c{i % CLASSES}' / f'{i:02d}.png'
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(picture).save(path)
        pixels[path.relative_to(root / 'data').as_posix()] = picture
    torch.manual_seed(0)
    torch.save(timm.create_model('resnet10t', num_classes=CLASSES, **ANNOTATOR_KWARGS).state_dict(),
               root / 'annotator.pth')
    return root, pixels


def test_online_targets_are_the_offline_targets_of_a_store_made_for_the_same_crops(crops):
    root, pixels = crops
    generate_token_labels(root / 'data', 'resnet10t', root / 'store', DistInfo(),
                          checkpoint=str(root / 'annotator.pth'), img_size=SIZE, topk=TOPK, workers=0,
                          model_kwargs=ANNOTATOR_KWARGS)
    store = TokenLabelStore(root / 'store')
    recipe = recipe_for('lvvit_s', data_values={'img_size': SIZE})
    data_cfg = {'mean': IMAGENET_DEFAULT_MEAN, 'std': IMAGENET_DEFAULT_STD}
    annotator = build_teacher(TeacherSpec('resnet10t', str(root / 'annotator.pth'), ANNOTATOR_KWARGS), CLASSES,
                              recipe, data_cfg, DistInfo())
    objective = make_objective(recipe, CLASSES, annotator)
    names = sorted(pixels)
    images = torch.stack([torch.tensor(pixels[name]).permute(2, 0, 1).float() / 255 for name in names])
    mean, std = (torch.tensor(values).view(3, 1, 1) for values in (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD))
    images = (images - mean) / std
    same, maps = objective.prepare(images, torch.zeros(len(names), dtype=torch.long))
    assert same is images and maps.scores.shape == (len(names), 3, 3, TOPK)
    online_cls, online_tokens = objective.online_targets(maps, (3, 3))

    rows = [store.row_of(name) for name in names]
    scores, classes = zip(*(store.read(row) for row in rows))
    geometry = CropGeometry(*(t.expand(len(names), *t.shape) for t in identity_geometry()))
    offline_cls, offline_tokens = objective.token_builder(
        torch.from_numpy(np.stack(scores)), torch.from_numpy(np.stack(classes)), geometry, (3, 3),
        torch.from_numpy(np.stack([store.extent(row) for row in rows])))
    assert online_tokens.shape == (len(names), 3, 3, CLASSES)
    torch.testing.assert_close(online_tokens, offline_tokens, atol=2e-3, rtol=0)  # the store keeps fp16 logits
    torch.testing.assert_close(online_cls, offline_cls, atol=2e-3, rtol=0)
    assert (online_tokens.argmax(-1) == offline_tokens.argmax(-1)).float().mean() > 0.95
    assert online_tokens.std(dim=(1, 2)).mean() > 1e-3  # the tokens differ: a map, not one label per image


def test_training_with_an_online_annotator_reads_no_store(crops, tmp_path):
    root, _ = crops
    val = root / 'data' / 'val'
    if not val.exists():
        for folder in (root / 'data' / 'train').iterdir():
            (val / folder.name).mkdir(parents=True)
            next(folder.glob('*.png')).link_to(val / folder.name / 'v.png')
    out = tmp_path / 'run'
    metrics = main(['lvvit_t', '--data-dir', str(root / 'data'), '--teacher', 'resnet10t', '--teacher-checkpoint',
                    str(root / 'annotator.pth'), '--teacher-kwargs', 'output_stride=16', '--img-size', str(SIZE),
                    '--epochs', '1', '--batch-size', '4', '--workers', '0', '--device', 'cpu', '--output', str(out),
                    '--model-kwargs', 'depth=1'])
    assert metrics['online_token_labeling'] and metrics['token_labeling'] and metrics['teacher'] == 'resnet10t'
    settings = json.loads((out / 'metrics.json').read_text())
    assert settings['online_token_labeling']


def test_an_annotator_with_fewer_classes_than_the_top_k_gives_all_of_them(crops):
    root, _ = crops
    recipe = recipe_for('lvvit_s', data_values={'img_size': SIZE})
    annotator = build_teacher(TeacherSpec('resnet10t', str(root / 'annotator.pth'), ANNOTATOR_KWARGS), CLASSES,
                              recipe, {'mean': IMAGENET_DEFAULT_MEAN, 'std': IMAGENET_DEFAULT_STD}, DistInfo())
    scores, classes = annotator.dense_map(torch.zeros(2, 3, SIZE, SIZE), topk=CLASSES + 4)
    assert scores.shape == (2, 3, 3, CLASSES) and (classes.sort(dim=-1).values == torch.arange(CLASSES)).all()
