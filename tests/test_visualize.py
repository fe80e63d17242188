"""Pictures with known answers: attention rollout, attention distance, position similarity, token labels over a flip,
segmentation colours; the weights they draw equal the models' own; tools/visualize.py and the training pictures."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import timm
import torch
from PIL import Image

import backbones
from backbones.common.drawing import class_colours, drawable
from classification.data.augment import TrainTransform
from classification.pictures.attention import (
    attention_maps,
    attention_rollout,
    mean_attention_distance,
    patch_distances,
    position_similarity,
)
from classification.pictures.curves import read_run
from classification.pictures.token_labels import class_mosaic, token_label_figure, token_labels
from helpers.commands import run_tool, succeeded
from helpers.models import TINY_DEIT
from helpers.training_runs import assert_same_run

GRID = (3, 4)
PATCHES = GRID[0] * GRID[1]


def read_png(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert('RGB'))


def uniform_attention(tokens: int, heads: int = 2) -> torch.Tensor:
    return torch.full((1, heads, tokens, tokens), 1.0 / tokens)


# --- attention --------------------------------------------------------------------------------------------------

def test_rollout_of_identity_attention_is_one_hot_on_each_token():
    identity = torch.eye(1 + PATCHES).expand(1, 3, -1, -1)
    rollout = attention_rollout([identity] * 4)
    assert torch.equal(rollout, torch.eye(1 + PATCHES)[None])


def test_rollout_of_uniform_attention_mixes_the_residual_through_the_blocks():
    """Per block 0.5 I + 0.5 U (U uniform, U @ U = U): after L blocks 0.5^L I + (1 - 0.5^L) U."""
    n, blocks = 1 + PATCHES, 3
    rollout = attention_rollout([uniform_attention(n)] * blocks)[0]
    expected = 0.5 ** blocks * torch.eye(n) + (1 - 0.5 ** blocks) / n
    torch.testing.assert_close(rollout, expected)


def pairwise_mean_distance(grid, patch_size: float) -> float:
    """The mean distance between the centres of all ordered pairs of patches (self-pairs included)."""
    cells = [(r, c) for r in range(grid[0]) for c in range(grid[1])]
    total = sum(math.hypot(r1 - r2, c1 - c2) for r1, c1 in cells for r2, c2 in cells)
    return patch_size * total / len(cells) ** 2


def test_mean_attention_distance_known_answers():
    n = 1 + PATCHES  # a class token first: its column is left out and the rows renormalised over the patches
    self_only = torch.eye(n).expand(2, 3, -1, -1).clone()
    self_only[:, :, :, 0] = 0.3  # attention to the class token does not count
    assert torch.equal(mean_attention_distance(self_only, GRID, 16, num_prefix=1), torch.zeros(3, dtype=torch.double))
    uniform = mean_attention_distance(uniform_attention(n, heads=3), GRID, 16, num_prefix=1)
    torch.testing.assert_close(uniform, torch.full((3,), pairwise_mean_distance(GRID, 16), dtype=torch.double))
    assert patch_distances(GRID, 16)[0, -1].item() == pytest.approx(16 * math.hypot(2, 3))


def test_position_similarity_known_answers():
    torch.manual_seed(0)
    table = torch.randn(1, 1 + PATCHES, 8)
    similarity = position_similarity(table, num_prefix=1)
    assert similarity.shape == (PATCHES, PATCHES)
    torch.testing.assert_close(similarity.diagonal(), torch.ones(PATCHES, dtype=torch.double))
    torch.testing.assert_close(similarity, similarity.T)
    identical = torch.cat([torch.randn(1, 1, 8), torch.randn(1, 8).expand(1, PATCHES, 8) * 3], dim=1)
    torch.testing.assert_close(position_similarity(identical, num_prefix=1),
                               torch.ones(PATCHES, PATCHES, dtype=torch.double))


def module_weights(model: torch.nn.Module, images: torch.Tensor) -> dict:
    """The attention weights each attention module computes itself (timm's unfused path, captured where they leave
    the softmax), by module kind."""
    from timm.layers import Attention
    from timm.models.cait import ClassAttn, TalkingHeadAttn
    captured = {'self': [], 'class': []}
    hooks = []
    for module in model.modules():
        if hasattr(module, 'fused_attn'):
            module.fused_attn = False
        if isinstance(module, TalkingHeadAttn):  # per-head softmax, before the second head mixing
            hooks.append(module.proj_w.register_forward_pre_hook(
                lambda m, args: captured['self'].append(args[0].permute(0, 3, 1, 2))))
        elif isinstance(module, Attention) and not any(module is m for m in model.patch_embed.modules()):
            hooks.append(module.attn_drop.register_forward_pre_hook(lambda m, args: captured['self'].append(args[0])))
        elif isinstance(module, ClassAttn):
            hooks.append(module.attn_drop.register_forward_pre_hook(
                lambda m, args: captured['class'].append(args[0][:, :, 0])))
    with torch.no_grad():
        model.eval().forward_features(images)
    for hook in hooks:
        hook.remove()
    return captured


@pytest.mark.parametrize('name, grid', [('deit_small_patch16_224', (4, 4)), ('lvvit_s', (4, 4)),
                                        ('t2t_vit_14', (4, 4)), ('cait_xxs24_224', (4, 4))])
def test_recomputed_attention_is_the_modules_own(name, grid):
    torch.manual_seed(0)
    model = backbones.create_model(name, img_size=64, embed_dim=64, depth=2, num_heads=2)
    images = torch.randn(2, 3, 64, 64)
    maps = attention_maps(model, images)
    own = module_weights(model, images)
    assert maps.grid == grid and len(maps.blocks) == len(own['self']) == 2
    assert len(maps.class_attention) == len(own['class'])
    for ours, theirs in zip(maps.blocks + maps.class_attention, own['self'] + own['class']):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
    assert maps.num_prefix == (0 if maps.class_attention else 1)  # CaiT's class token joins after self-attention


# --- token labels and segmentations -------------------------------------------------------------------------------

def column_map(side: int, num_classes: int):
    """A dense map whose top-1 class is the column index, certain (k = 1)."""
    classes = np.broadcast_to(np.arange(side) % num_classes, (side, side))[..., None].copy()
    return np.full((side, side, 1), 10.0, np.float32), classes


@pytest.mark.parametrize('flip', [True, False])
def test_token_targets_of_a_column_map_are_mirrored_stripes_after_a_flip(flip):
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8))
    scores, classes = column_map(4, num_classes=4)
    transform = TrainTransform(64, scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=float(flip), auto_augment=None,
                               reprob=0.0)
    labels = token_labels(image, scores, classes, transform, num_classes=4, patch_size=16)
    stripes = np.broadcast_to([3, 2, 1, 0] if flip else [0, 1, 2, 3], (4, 4))
    assert np.array_equal(labels.token_classes, stripes)
    assert np.array_equal(labels.map_classes, classes[..., 0]) and np.allclose(labels.map_confidence, 1.0)
    assert (labels.token_confidence >= 0.75).all()  # RoIAlign's bilinear samples reach the neighbouring column
    colours = class_colours(4)
    overlay = class_mosaic(labels.crop, labels.token_classes, np.ones((4, 4)), colours)
    for column in range(4):  # each 16 px column of the picture is its class colour, exactly
        assert (overlay[:, 16 * column:16 * (column + 1)] == colours[stripes[0, column]]).all()


def test_a_token_label_picture_of_an_undecodable_file_name_is_drawn():
    """A Latin-1 name on a UTF-8 file system (surrogate escapes in Python) once stopped train_cls after its first
    epoch at the default --pictures 4: matplotlib refuses the title; the name is drawn with U+FFFD instead."""
    image = Image.fromarray(np.zeros((32, 32, 3), np.uint8))
    scores, classes = column_map(2, num_classes=2)
    transform = TrainTransform(32, scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=0.0, auto_augment=None, reprob=0.0)
    labels = token_labels(image, scores, classes, transform, num_classes=2, patch_size=16)
    name = os.fsdecode(b'caf\xe9')
    picture = token_label_figure(labels, [name, 'n002'], f'train/{name}/{name}.JPEG')
    assert picture.ndim == 3 and picture.shape[2] == 3
    assert drawable(name) == 'caf\ufffd'


def test_segmentation_overlay_pixels_are_the_palette_colours_of_the_prediction():
    from backbones.dense.pictures import HEADER
    from backbones.dense.semantic.pictures import segmentation_picture
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (20, 30, 3), dtype=np.uint8)
    prediction = rng.integers(0, 3, (20, 30))
    prediction[:4] = 255  # not drawn: the image shows through
    palette = [(200, 10, 10), (10, 200, 10), (10, 10, 200)]
    picture = segmentation_picture(image, prediction, ['a', 'b', 'c'], palette, alpha=1.0, with_labels=False,
                                   scale=1)
    panel = picture[HEADER:HEADER + 20, -30:]
    expected = np.where(prediction[..., None] == 255, image, np.array(palette + [(0, 0, 0)])[prediction.clip(0, 3)])
    # (the ignored rows show the image itself: mmseg alone would paint them black at alpha 1)
    assert np.array_equal(panel, expected)
    assert np.array_equal(picture[HEADER:HEADER + 20, :30], image)


@pytest.mark.parametrize('count', [10, 20, 150])
def test_class_colours_are_distinct(count):
    assert len({tuple(c) for c in class_colours(count)}) == count


# --- curves ------------------------------------------------------------------------------------------------------

def test_curves_read_classification_and_resumed_mmengine_logs(tmp_path):
    cls_run = tmp_path / 'cls'
    cls_run.mkdir()
    (cls_run / 'log.jsonl').write_text('\n'.join(json.dumps(r) for r in [
        {'epoch': 1, 'train_loss': 2.0, 'lr': 1e-3, 'top1': 10.0},
        {'epoch': 2, 'train_loss': 1.5, 'lr': 5e-4, 'top1': 30.0, 'ema_top1': 25.0}]) + '\n')
    run = read_run(cls_run)
    assert run.x_label == 'epoch' and run.series['loss'] == ([1.0, 2.0], [2.0, 1.5])
    assert run.series['top1'] == ([1.0, 2.0], [10.0, 30.0]) and run.series['ema_top1'] == ([2.0], [25.0])
    seg_run = tmp_path / 'seg'
    for start, records in (('20260101_000000', [{'loss': 3.0, 'lr': 0.1, 'step': 1}, {'loss': 2.0, 'step': 2},
                                                 {'mIoU': 5.0, 'step': 2}]),
                           ('20260101_010000', [{'loss': 1.9, 'step': 2}, {'loss': 1.0, 'step': 3},
                                                {'mIoU': 9.0, 'step': 3}])):  # resumed from iteration 1
        (seg_run / start / 'vis_data').mkdir(parents=True)
        (seg_run / start / 'vis_data' / 'scalars.json').write_text('\n'.join(map(json.dumps, records)))
    run = read_run(seg_run)
    assert run.x_label == 'iteration' and run.series['loss'] == ([1.0, 2.0, 3.0], [3.0, 1.9, 1.0])
    assert run.series['mIoU'] == ([2.0, 3.0], [5.0, 9.0])


# --- the tool ----------------------------------------------------------------------------------------------------

def test_attention_tool_numbers_of_a_model_whose_attention_is_uniform(tmp_path):
    """Queries and keys zeroed: every attention is uniform, so the rollout is uniform over the patches and every
    head's mean distance is the mean pairwise patch distance; the checkpoint's weights are the ones drawn."""
    model = timm.create_model('deit_small_patch16_224', img_size=64, embed_dim=32, depth=2, num_heads=2)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[:64] = 0
            block.attn.qkv.bias[:64] = 0
    torch.save(model.state_dict(), tmp_path / 'uniform.pth')
    image = tmp_path / 'image.png'
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (80, 80, 3), dtype=np.uint8)).save(image)
    succeeded(run_tool('visualize.py', ['attention', *TINY_DEIT, '--img-size', '64', '--checkpoint',
                                        tmp_path / 'uniform.pth', '--image', image, '--out', tmp_path / 'a.png',
                                        '--json', tmp_path / 'a.json']))
    values = json.loads((tmp_path / 'a.json').read_text())
    assert values['grid'] == [4, 4] and values['patch_size'] == 16
    np.testing.assert_allclose(values['rollout'], np.full((4, 4), 0.75 / 17), rtol=1e-5)
    np.testing.assert_allclose(values['mean_attention_distance'], np.full((2, 2), pairwise_mean_distance((4, 4), 16)),
                               rtol=1e-5)
    expected = position_similarity(model.pos_embed.detach(), num_prefix=1)
    np.testing.assert_allclose(values['position_similarity'], expected.numpy(), atol=1e-6)
    assert read_png(tmp_path / 'a.png').shape[1] > 600


@pytest.mark.slow
def test_token_labels_tool_draws_the_seeded_augmentation(labeled_images, tmp_path):
    data, labels = labeled_images
    image = sorted((data / 'train').rglob('*.png'))[0]

    def draw(name: str, *extra) -> np.ndarray:
        succeeded(run_tool('visualize.py', ['token-labels', '--data-dir', data, '--token-label-dir', labels,
                                            '--image', image, '--img-size', '64', '--out', tmp_path / name, *extra]))
        return read_png(tmp_path / name)

    first, again, other = draw('a.png'), draw('b.png'), draw('c.png', '--seed', '1')
    assert np.array_equal(first, again) and not np.array_equal(first, other)
    outside = run_tool('visualize.py', ['token-labels', '--data-dir', data, '--token-label-dir', labels, '--image',
                                        tmp_path / 'a.png', '--out', tmp_path / 'd.png'])
    assert outside.returncode != 0 and f'{tmp_path / "a.png"} is not inside {data}' in outside.stderr


@pytest.mark.slow
def test_token_labels_tool_refuses_a_store_of_another_data_set(labeled_images, tmp_path):
    """--data-dir of one set and --token-label-dir of another: refused like training refuses it (class list, every
    image covered), not drawn with another image's map."""
    from helpers.cls_data import make_image_folder
    _, labels = labeled_images
    other = make_image_folder(tmp_path / 'other', per_class={'train': 9, 'val': 1})
    result = run_tool('visualize.py', ['token-labels', '--data-dir', other, '--token-label-dir', labels, '--out',
                                       tmp_path / 'x.png'])
    assert result.returncode != 0 and 'have no token labels' in result.stderr and 'n001_8' in result.stderr
    assert not (tmp_path / 'x.png').exists()


def test_token_labels_tool_refuses_a_randaugment_string_training_would_refuse(tmp_path):
    """timm reads rand-zz as its default RandAugment: the picture would not show the augmentation asked for."""
    result = run_tool('visualize.py', ['token-labels', '--data-dir', tmp_path, '--token-label-dir', tmp_path,
                                       '--auto-augment', 'rand-zz', '--out', tmp_path / 'x.png'])
    assert result.returncode == 2 and "not a RandAugment string like rand-m9-mstd0.5-inc1: 'rand-zz'" in result.stderr


@pytest.mark.slow
def test_segmentation_tool_draws_test_seg_predictions(tmp_path):
    """The prediction panel is the palette colours of what tools/test_seg.py predicts for the image."""
    from mmseg.datasets import ADE20KDataset

    from backbones.dense.semantic.pictures import segmentation_picture  # first: lets mmseg import on mmcv-lite
    from helpers.seg_data import write_tiny_ade, write_tiny_config
    data = write_tiny_ade(tmp_path / 'ade', counts=(('training', 2), ('validation', 2)))
    config = write_tiny_config(tmp_path / 'tiny.py', 'upernet_lvvit_s.py', data)
    work = tmp_path / 'work'
    succeeded(run_tool('train_seg.py', [config, '--work-dir', work, '--iters', '1', '--pictures', '1']))
    assert [p.name for p in (work.glob('*/vis_data/vis_image/*'))] == ['val_ADE_val_00000000.jpg_1.png']
    succeeded(run_tool('test_seg.py', [config, work / 'iter_1.pth', '--pred-dir', tmp_path / 'pred',
                                       '--out', tmp_path / 'r.json']))
    name = 'ADE_val_00000001'
    succeeded(run_tool('visualize.py', ['segmentation', config, work / 'iter_1.pth', '--image',
                                        data / 'images' / 'validation' / f'{name}.jpg', '--alpha', '1', '--no-labels',
                                        '--out', tmp_path / 's.png', '--report', tmp_path / 'r.json']))
    image = cv2.cvtColor(cv2.imread(str(data / 'images' / 'validation' / f'{name}.jpg')), cv2.COLOR_BGR2RGB)
    prediction = cv2.imread(str(tmp_path / 'pred' / f'{name}.png'), cv2.IMREAD_UNCHANGED).astype(np.int64) - 1
    truth = cv2.imread(str(data / 'annotations' / 'validation' / f'{name}.png'), cv2.IMREAD_UNCHANGED).astype(int)
    meta = ADE20KDataset.METAINFO
    expected = segmentation_picture(image, prediction, meta['classes'], meta['palette'],
                                    np.where(truth == 0, 255, truth - 1), alpha=1.0, with_labels=False)
    picture = read_png(tmp_path / 's.png')
    assert np.array_equal(picture[:expected.shape[0], :expected.shape[1]], expected)
    assert picture.shape[0] > expected.shape[0]  # the report's IoU bars below


@pytest.fixture(scope='module')
def seg_model(tmp_path_factory):
    """A tiny ADE20K set, its UperNet + LV-ViT config, and a checkpoint of that model's weights."""
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    import backbones.dense  # noqa: F401  (registers the suite's mmseg modules)
    from backbones.dense.config import load_config
    from helpers.seg_data import write_tiny_ade, write_tiny_config
    tmp = tmp_path_factory.mktemp('seg_picture')
    data = write_tiny_ade(tmp / 'ade', counts=(('training', 1), ('validation', 2)))
    config = write_tiny_config(tmp / 'tiny.py', 'upernet_lvvit_s.py', data)
    cfg = load_config(str(config))
    init_default_scope('mmseg')
    cfg.model.backbone.pretrained = None
    torch.save({'state_dict': MODELS.build(cfg.model).state_dict()}, tmp / 'model.pth')
    return data, config, tmp / 'model.pth'


@pytest.mark.slow
def test_segmentation_picture_inputs_that_cannot_be_drawn_are_named(seg_model, tmp_path):
    """A checkpoint of another model, a missing or truncated image, a damaged report or one of other classes: each a
    one-line error naming the file (OpenCV would draw a truncated JPEG grey)."""
    from backbones.common.errors import CheckpointError, DataError
    from backbones.common.images import ImageReadError
    from classification.digits.seg_data import EmbeddedPages
    from classification.visualize import main
    data, config, checkpoint = seg_model
    image = data / 'images' / 'validation' / 'ADE_val_00000000.jpg'

    def draw(*extra, weights=checkpoint):
        return main(['segmentation', str(config), str(weights), '--out', str(tmp_path / 's.png'),
                     *map(str, extra)], fallback=EmbeddedPages)

    torch.save({'state_dict': timm.create_model('resnet10t').state_dict()}, tmp_path / 'resnet.pth')
    with pytest.raises(CheckpointError, match=r'resnet.pth does not fit the model of this config: \d+ missing keys'):
        draw(weights=tmp_path / 'resnet.pth')
    with pytest.raises(ImageReadError, match='nowhere.jpg'):
        draw('--image', tmp_path / 'nowhere.jpg')
    cut = tmp_path / 'cut.jpg'
    cut.write_bytes(image.read_bytes()[:len(image.read_bytes()) // 2])
    with pytest.raises(ImageReadError, match='cut.jpg'):
        draw('--image', cut)
    (tmp_path / 'damaged.json').write_text('{"mIoU": 4')
    with pytest.raises(DataError, match='damaged.json: not a readable test_seg.py report'):
        draw('--report', tmp_path / 'damaged.json')
    (tmp_path / 'metrics.json').write_text(json.dumps({'top1': 80.0, 'top5': 95.0}))
    with pytest.raises(DataError, match='metrics.json: not a test_seg.py report'):
        draw('--report', tmp_path / 'metrics.json')
    (tmp_path / 'voc.json').write_text(json.dumps({'mIoU': 1.0, 'aAcc': 2.0, 'mAcc': 3.0, 'per_class': {
        'background': {'IoU': 1.0, 'Acc': 1.0}, 'aeroplane': {'IoU': 1.0, 'Acc': 1.0}}}))
    with pytest.raises(DataError, match=r'voc.json: a report on 2 classes \(background, aeroplane, ...\), not on this '
                                        r'data set\'s 150 \(wall, building'):
        draw('--report', tmp_path / 'voc.json')
    assert not (tmp_path / 's.png').exists()
    assert draw('--image', image) == tmp_path / 's.png'


@pytest.mark.slow
def test_curves_tool_refuses_a_folder_without_logs(tmp_path):
    result = run_tool('visualize.py', ['curves', tmp_path, '--out', tmp_path / 'c.png'])
    assert result.returncode != 0 and f'{tmp_path}: no log.jsonl' in result.stderr


# --- pictures during training ----------------------------------------------------------------------------------

def tensorboard_images(output: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(output / 'tensorboard'), size_guidance={'images': 0})
    events.Reload()
    return {tag: [e.step for e in events.Images(tag)] for tag in events.Tags()['images']}


@pytest.mark.slow
def test_token_label_pictures_go_to_tensorboard_without_changing_the_run(labeled_images, tmp_path):
    data, labels = labeled_images
    common = [*TINY_DEIT, '--data-dir', data, '--token-label-dir', labels, '--token-labeling', '--img-size', '32',
              '--batch-size', '4', '--epochs', '2', '--warmup-epochs', '1', '--workers', '0', '--device', 'cpu']
    succeeded(run_tool('train_cls.py', [*common, '--output', tmp_path / 'drawn', '--pictures', '2']))
    succeeded(run_tool('train_cls.py', [*common, '--output', tmp_path / 'plain', '--pictures', '0']))
    assert tensorboard_images(tmp_path / 'drawn') == {'token_labels/0': [1, 2], 'token_labels/1': [1, 2]}
    assert tensorboard_images(tmp_path / 'plain') == {}
    assert_same_run(tmp_path / 'drawn', tmp_path / 'plain', epochs=2)  # drawing left the random streams alone
