"""A segmentation data set of the user's own: its layout and classes read, a config of any class count pointed at it
with a schedule sized to it, its masks checked against its classes, ADE20K's configs refusing it; trained and
tested single- and multi-scale with the user's class names, and predicted on without the data set at hand."""
from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

import segmentation  # noqa: F401  (registers the suite's mmseg modules)
from common.errors import CheckpointError, DataError
from helpers.commands import run_tool, succeeded
from helpers.seg_data import OWN_CLASSES, independent_scores, write_own_seg, write_tiny_config
from segmentation.own_data import read_own_data
from segmentation.train import build_parser, prepare

UPERNET = 'seg_configs/upernet_lvvit_s_own_data.py'


def prepared(tmp_path: Path, *argv: str, config: str = UPERNET):
    args = build_parser().parse_args([config, '--work-dir', str(tmp_path / 'work'), *argv])
    return prepare(args)


def with_ade20k_folder_names(root: Path) -> Path:
    """The own-data set at `root` in ADE20K's folders: images/training, annotations/validation, ..."""
    (root / 'masks').rename(root / 'annotations')
    for kind in ('images', 'annotations'):
        for split, name in (('train', 'training'), ('val', 'validation')):
            (root / kind / split).rename(root / kind / name)
    return root


def test_the_classes_file_names_the_classes_and_their_colours(tmp_path):
    data = read_own_data(write_own_seg(tmp_path / 'own'))
    assert data.classes == OWN_CLASSES and data.img_suffix == '.jpg'
    assert data.palette[1] == [40, 100, 200] and data.palette[3] == [120, 100, 200]  # the file's colours
    assert len(data.palette) == 5 and all(len(c) == 3 for c in data.palette)
    assert data.splits == {'train': ('images/train', 'masks/train'), 'val': ('images/val', 'masks/val')}


def test_without_a_classes_file_the_masks_are_counted(tmp_path):
    root = write_own_seg(tmp_path / 'own', classes_file=False)
    with_ade20k_folder_names(root)  # read too
    data = read_own_data(root)
    assert data.classes == ('class 0', 'class 1', 'class 2', 'class 3', 'class 4')
    assert data.splits['val'] == ('images/validation', 'annotations/validation')


@pytest.mark.parametrize('damage, message', [
    ('no val', r'no images/val or images/validation folder'),
    ('two suffixes', r'images of 2 suffixes .*train_0\.png.*one suffix per data set'),
    ('named twice', r'classes\.txt: classes named twice: car'),
    ('bad colour', r'classes\.txt, line 3: colour 40 100 300 is not three values 0-255'),
    ('one class', r'classes\.txt: 1 class\(es\); a segmentation data set needs at least 2'),
    ('binary masks', r'use 2 of the values 0\.\.254 \(0, 254\): masks hold class indices .* write .*classes\.txt'),
])
def test_a_data_set_that_cannot_be_read_as_declared_is_named(tmp_path, damage, message):
    root = write_own_seg(tmp_path / 'own', classes_file=damage != 'binary masks')
    classes = root / 'classes.txt'
    if damage == 'no val':
        (root / 'images' / 'val').rename(root / 'images' / 'check')
    elif damage == 'two suffixes':
        image = root / 'images' / 'train' / 'train_0.jpg'
        cv2.imwrite(str(image.with_suffix('.png')), cv2.imread(str(image)))
        image.unlink()
    elif damage == 'named twice':
        classes.write_text('background\nroad\ncar\ncar\n')
    elif damage == 'bad colour':
        classes.write_text('background\n\nroad 40 100 300\n')
    elif damage == 'one class':
        classes.write_text('# only one\nbackground\n')
    else:  # 0/254 masks: colours, not class indices
        for mask in (root / 'masks').rglob('*.png'):
            values = cv2.imread(str(mask), cv2.IMREAD_UNCHANGED)
            cv2.imwrite(str(mask), np.where(values == 0, 0, 254).astype(np.uint8))
    with pytest.raises(DataError, match=message):
        read_own_data(root)


def test_an_own_data_config_takes_the_classes_and_a_schedule_sized_to_the_data(tmp_path):
    root = write_own_seg(tmp_path / 'own')  # 6 training images
    cfg = prepared(tmp_path, '--data-root', str(root), '--cfg-options', 'model.backbone.pretrained=None',
                   'own_data.min_iters=10', 'train_dataloader.batch_size=2')
    assert cfg.model.decode_head.num_classes == cfg.model.auxiliary_head.num_classes == 5
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        dataset = cfg[loader].dataset
        assert dataset.metainfo['classes'] == OWN_CLASSES and dataset.reduce_zero_label is False
    assert cfg.train_dataloader.dataset.data_prefix == dict(img_path='images/train', seg_map_path='masks/train')
    assert cfg.test_dataloader.dataset.data_prefix == dict(img_path='images/val', seg_map_path='masks/val')
    epochs = cfg.own_data.epochs
    assert cfg.train_cfg.max_iters == -(-epochs * 6 // 2)  # epochs x images / batch, rounded up
    assert cfg.train_cfg.val_interval == cfg.default_hooks.checkpoint.interval < cfg.train_cfg.max_iters
    # accumulation: the same passes over the data in a third of the updates, each update 3 iterations
    cfg = prepared(tmp_path, '--data-root', str(root), '--grad-accum-steps', '3', '--cfg-options',
                   'model.backbone.pretrained=None', 'own_data.min_iters=10', 'train_dataloader.batch_size=2')
    assert cfg.train_cfg.max_iters == 3 * -(-epochs * 6 // 6)
    cfg = prepared(tmp_path, '--data-root', str(root), '--cfg-options', 'model.backbone.pretrained=None')
    assert cfg.train_cfg.max_iters == cfg.own_data.min_iters  # a small set takes the floor
    cfg = prepared(tmp_path, '--data-root', str(root), '--iters', '7', '--cfg-options',
                   'model.backbone.pretrained=None')
    assert cfg.train_cfg.max_iters == 7  # --iters wins
    (root / 'images' / 'test').mkdir()
    (root / 'masks' / 'test').mkdir()
    for split, name in (('images', 'val_0.jpg'), ('masks', 'val_0.png')):
        (root / split / 'val' / name).rename(root / split / 'test' / name)
    cfg = prepared(tmp_path, '--data-root', str(root), '--cfg-options', 'model.backbone.pretrained=None')
    assert cfg.test_dataloader.dataset.data_prefix == dict(img_path='images/test', seg_map_path='masks/test')


def test_a_mask_value_beyond_the_declared_classes_is_named(tmp_path):
    root = write_own_seg(tmp_path / 'own')
    mask = root / 'masks' / 'val' / 'val_1.png'
    values = cv2.imread(str(mask), cv2.IMREAD_UNCHANGED)
    values[0, 0] = 7
    cv2.imwrite(str(mask), values)
    with pytest.raises(DataError, match=r'val_1\.png has label values 7 beyond the 5 classes \(valid: 0..4, 255'):
        prepared(tmp_path, '--data-root', str(root), '--cfg-options', 'model.backbone.pretrained=None')


def test_an_ade20k_config_refuses_a_data_set_of_other_classes(tmp_path):
    """The issue's case: 5-class masks under an ADE20K config trained values 1-4 as wall, building, sky, floor and
    never learned class 0, with an mIoU at the end."""
    root = with_ade20k_folder_names(write_own_seg(tmp_path / 'own'))
    with pytest.raises(DataError, match=r"not ADE20K's \(e\.g\. train_0\.jpg.*own-data config.*"
                                        r"upernet_lvvit_s_own_data\.py --data-root"):
        prepared(tmp_path, '--data-root', str(root), '--cfg-options', 'model.backbone.pretrained=None',
                 config='seg_configs/upernet_lvvit_s.py')


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """A tiny UperNet trained on a 5-class set of its own (class 0 a real class) by tools/train_seg.py."""
    tmp = tmp_path_factory.mktemp('own_seg')
    root = write_own_seg(tmp / 'own', counts=(('train', 8), ('val', 4)))
    config = write_tiny_config(tmp / 'tiny_own.py', 'upernet_lvvit_s_own_data.py', root)
    work = tmp / 'work'
    succeeded(run_tool('train_seg.py', [config, '--work-dir', work, '--iters', '60', '--pictures', '0',
                                        '--cfg-options', 'train_dataloader.batch_size=4',
                                        'optim_wrapper.optimizer.lr=0.002']))
    return root, config, work / 'iter_60.pth'


@pytest.mark.slow
@pytest.mark.parametrize('mode', ['ss', 'ms'])
def test_test_seg_scores_the_users_classes(trained, tmp_path, mode):
    """The report names the user's classes, class 0 among them, and its scores are the saved masks' (an
    independent count over the PNGs, value v being class v)."""
    root, config, checkpoint = trained
    succeeded(run_tool('test_seg.py', [config, checkpoint, '--out', tmp_path / 'r.json', '--pred-dir',
                                       tmp_path / 'pred', *(['--ms'] if mode == 'ms' else [])]))
    report = json.loads((tmp_path / 'r.json').read_text())
    assert list(report['per_class']) == list(OWN_CLASSES)
    assert report['per_class']['background']['IoU'] > 50  # class 0 is learned, not ignored
    expected = independent_scores(tmp_path / 'pred', root / 'masks' / 'val', num_classes=5, zero_ignored=False)
    for key in ('mIoU', 'aAcc', 'mAcc'):
        assert report[key] == pytest.approx(expected[key], abs=1e-6), key


@pytest.mark.slow
def test_predict_seg_needs_only_the_checkpoint_for_the_classes(trained, tmp_path):
    """New images, no data set: the masks are test_seg's predictions, in the classes the checkpoint records."""
    root, config, checkpoint = trained
    succeeded(run_tool('test_seg.py', [config, checkpoint, '--pred-dir', tmp_path / 'pred']))
    images = tmp_path / 'photos'
    images.mkdir()
    for image in (root / 'images' / 'val').iterdir():
        image.rename(images / image.name)  # the data set is gone; its images are new images now
    succeeded(run_tool('predict_seg.py', [config, checkpoint, images, '--out', tmp_path / 'masks', '--overlay']))
    for mask in sorted((tmp_path / 'pred').glob('*.png')):
        assert np.array_equal(cv2.imread(str(tmp_path / 'masks' / mask.name), cv2.IMREAD_UNCHANGED),
                              cv2.imread(str(mask), cv2.IMREAD_UNCHANGED)), mask.name
    assert len(list((tmp_path / 'masks').glob('*_overlay.png'))) == 4


@pytest.mark.slow
def test_test_seg_refuses_a_checkpoint_of_other_classes(trained, tmp_path):
    root, config, checkpoint = trained
    other = write_own_seg(tmp_path / 'other', classes=('background', 'road', 'bus', 'tree', 'sky'))
    with pytest.raises(CheckpointError, match=r'trained on 5 classes \(background, road, car, tree, sky\), the data '
                                              r'set holds 5 \(background, road, bus, tree, sky\)'):
        from segmentation.test import build_parser as test_parser, prepare as test_prepare
        test_prepare(test_parser().parse_args([str(config), str(checkpoint), '--data-root', str(other),
                                               '--work-dir', str(tmp_path / 'w')]))
