"""A segmentation data set of the user's own: its layout and classes read, a config of any class count pointed at it
with a schedule sized to it, its masks checked against its classes, ADE20K's configs refusing it; trained and
tested single- and multi-scale with the user's class names, and predicted on without the data set at hand."""
from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

import backbones.dense  # noqa: F401  (registers the suite's mmseg modules)
from backbones.common.errors import CheckpointError, DataError, UsageError
from backbones.dense.own_data import read_own_data
from backbones.dense.train import build_parser, prepare
from helpers.commands import run_tool, succeeded
from helpers.seg_data import OWN_CLASSES, independent_scores, write_own_seg, write_tiny_config

UPERNET = 'seg_configs/upernet_lvvit_s_own_data.py'


def prepared(tmp_path: Path, *argv: str, config: str = UPERNET):
    args = build_parser().parse_args([config, '--work-dir', str(tmp_path / 'work'), *argv])
    return prepare(args).cfg


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
    ('two-number colour', r'classes\.txt, line 3: \'road 40 100\' is not "name" or "name R G B": a colour is three '
                          r'whole numbers'),
    ('hex colour', r'classes\.txt, line 2: \'#ff8000\' is no colour of this format: write a colour as three whole'),
    ('comma colour', r'classes\.txt, line 2: \'40,100,200\' is no colour of this format'),
    ('grey-level masks', r'use 2 of the values 0\.\.254 \(0, 254\): grey levels or colours, not class indices 0, 1, 2'),
    ('colour masks', r'train_0\.png is RGB \(3 channels\), a colour mask: masks hold one class index per pixel in one '
                     r'channel .*convert each colour to its class index'),
])
def test_a_data_set_that_cannot_be_read_as_declared_is_named(tmp_path, damage, message):
    root = write_own_seg(tmp_path / 'own', classes_file=not damage.endswith('masks'))
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
    elif damage == 'two-number colour':
        classes.write_text('background\n\nroad 40 100\n')
    elif damage == 'hex colour':
        classes.write_text('background\nroad #ff8000\n')
    elif damage == 'comma colour':
        classes.write_text('background\nroad 40,100,200\n')
    else:  # 0/254 masks, or colour masks: not class indices
        for mask in (root / 'masks').rglob('*.png'):
            values = cv2.imread(str(mask), cv2.IMREAD_UNCHANGED)
            cv2.imwrite(str(mask), np.where(values == 0, 0, 254).astype(np.uint8) if damage == 'grey-level masks'
                        else np.stack([values * 40, values * 10, 255 - values], axis=-1).astype(np.uint8))
    with pytest.raises(DataError, match=message):
        read_own_data(root)


@pytest.mark.parametrize('classes_file', [True, False])
def test_masks_of_0_and_255_are_refused_saying_that_255_is_ignored(tmp_path, classes_file):
    """The tester's case: one foreground drawn as 255, two classes declared. 255 is the ignore index: the run would
    learn the background only, and score it 100 mIoU."""
    root = write_own_seg(tmp_path / 'own', classes_file=False)
    for mask in (root / 'masks').rglob('*.png'):
        values = cv2.imread(str(mask), cv2.IMREAD_UNCHANGED)
        cv2.imwrite(str(mask), np.where(values == 0, 0, 255).astype(np.uint8))
    if classes_file:
        (root / 'classes.txt').write_text('background\nforeground\n')
    message = (r'the masks of .*own.* hold only the values 0 and 255: 255 marks ignored pixels \(no loss or score '
               r'counts them\), not a class, so the foreground would never be learned; write class indices instead '
               r'\(0 background, 1 foreground: mask // 255\)')
    with pytest.raises(DataError, match=message):
        prepared(tmp_path, '--data-root', str(root), '--cfg-options', 'model.backbone.pretrained=None')


def test_a_byte_order_mark_is_no_part_of_the_first_name(tmp_path):
    root = write_own_seg(tmp_path / 'own')
    classes = root / 'classes.txt'
    classes.write_bytes(b'\xef\xbb\xbf' + classes.read_bytes())  # what Notepad writes
    assert read_own_data(root).classes == OWN_CLASSES


@pytest.mark.parametrize('case', ['empty val', 'own layout, ADE20K config'])
def test_a_split_folder_that_is_empty_or_absent_is_named(tmp_path, case):
    root = write_own_seg(tmp_path / 'own')
    config = UPERNET
    if case == 'empty val':
        for image in (root / 'images' / 'val').iterdir():
            image.unlink()
        message = rf'no \.jpg images in {root / "images" / "val"}$'
    else:
        config = 'seg_configs/upernet_lvvit_s.py'
        message = (rf'{root / "images" / "training"}: no such folder \(ADE20K\'s configs read its layout.*own-data '
                   rf'config, e\.g\. seg_configs/upernet_lvvit_s_own_data\.py --data-root {root} ')
    with pytest.raises(DataError, match=message):
        prepared(tmp_path, '--data-root', str(root), '--cfg-options', 'model.backbone.pretrained=None', config=config)


def test_a_class_without_ground_truth_pixels_is_said_not_scored_in_silence(caplog):
    """mmseg leaves a class absent from ground truth and prediction out of mIoU: a set whose foreground was never
    labelled scores 100. The report lists such classes and the log says what the means leave out."""
    from backbones.dense.semantic.metric import summarise_areas, unlabelled_warning
    areas = [torch.tensor(v, dtype=torch.float64) for v in ([90., 0.], [100., 0.], [100., 0.], [90., 0.])]
    report = summarise_areas(*areas, ['background', 'foreground'])  # intersect, union, predicted, labelled
    assert report['mIoU'] == 90.0 and report['per_class']['foreground'] == {'IoU': None, 'Acc': None}
    assert report['unlabelled'] == ['foreground']
    assert unlabelled_warning(report) == (
        'warning: 1 of 2 classes have no pixel in the ground truth (foreground): mAcc averages over the other 1, and '
        'mIoU leaves them out too unless they are predicted (then at 0); these scores do not measure those classes')
    labelled = summarise_areas(*[torch.tensor([90., 5.]), torch.tensor([100., 5.]), torch.tensor([95., 5.]),
                                 torch.tensor([95., 5.])], ['background', 'foreground'])
    assert labelled['unlabelled'] == [] and unlabelled_warning(labelled) is None


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
    for value in ('0', '-2', '1.5'):  # a batch of 0 sized the schedule by a division by zero
        with pytest.raises(UsageError, match=rf'train_dataloader.batch_size = {value}; it must be a whole number'):
            prepared(tmp_path, '--data-root', str(root), '--cfg-options', 'model.backbone.pretrained=None',
                     f'train_dataloader.batch_size={value}')
    (root / 'images' / 'test').mkdir()
    (root / 'masks' / 'test').mkdir()
    for split, name in (('images', 'val_0.jpg'), ('masks', 'val_0.png')):
        (root / split / 'val' / name).rename(root / split / 'test' / name)
    cfg = prepared(tmp_path, '--data-root', str(root), '--cfg-options', 'model.backbone.pretrained=None')
    assert cfg.test_dataloader.dataset.data_prefix == dict(img_path='images/test', seg_map_path='masks/test')


@pytest.mark.parametrize('iters', [[], ['--iters', '30']])
def test_the_counts_the_command_line_sets_win_over_the_schedule_sized_to_the_data(tmp_path, iters):
    """The schedule's shortening (sized to the data, or --iters) scales the checkpoint and log intervals and sets
    validation; the ones --cfg-options names keep the user's values, counted in updates as the config's are."""
    root = write_own_seg(tmp_path / 'own')
    options = ['model.backbone.pretrained=None', 'own_data.min_iters=400', 'default_hooks.checkpoint.interval=200',
               'train_cfg.val_interval=50', 'default_hooks.logger.interval=7']
    cfg = prepared(tmp_path, '--data-root', str(root), *iters, '--cfg-options', *options)
    assert cfg.train_cfg.max_iters == (30 if iters else 400)
    assert (cfg.default_hooks.checkpoint.interval, cfg.train_cfg.val_interval, cfg.default_hooks.logger.interval) == (
        200, 50, 7)
    cfg = prepared(tmp_path, '--data-root', str(root), *iters, '--grad-accum-steps', '2', '--cfg-options', *options)
    assert (cfg.default_hooks.checkpoint.interval, cfg.train_cfg.val_interval) == (400, 100)
    # the counts it does not name are still the shortening's
    cfg = prepared(tmp_path, '--data-root', str(root), *iters, '--cfg-options', *options[:3])
    assert cfg.train_cfg.val_interval == (30 if iters else 200)
    assert cfg.default_hooks.logger.interval <= 200


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


@pytest.fixture(scope='module')
def untrained(tmp_path_factory):
    """A tiny UperNet for the 5-class own set as it starts (no training: what the tools do with a checkpoint's classes
    needs no skill), saved with the classes as mmengine records a run's."""
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from backbones.dense.config import load_config
    from backbones.dense.run_data import resolve_data
    tmp = tmp_path_factory.mktemp('own_untrained')
    root = write_own_seg(tmp / 'own', counts=(('train', 2), ('val', 2)))
    config = write_tiny_config(tmp / 'tiny_own.py', 'upernet_lvvit_s_own_data.py', root)
    cfg = load_config(str(config))
    resolve_data(cfg)
    init_default_scope('mmseg')
    model = MODELS.build(cfg.model)
    meta = cfg.test_dataloader.dataset.metainfo
    torch.save({'state_dict': model.state_dict(), 'meta': {'dataset_meta': dict(classes=meta['classes'],
                                                                                palette=meta['palette'])}},
               tmp / 'seg.pth')
    return root, config, tmp / 'seg.pth'


@pytest.mark.parametrize('tool', ['test_seg', 'predict_seg', 'export'])
def test_every_tool_refuses_a_checkpoint_of_other_classes(untrained, tmp_path, tool):
    """Where a checkpoint meets a data set, their classes must be the same names: a (background, road, car, ...)
    model's masks must not be named, coloured and exported as another set's classes of the same count."""
    _, config, checkpoint = untrained
    other = write_own_seg(tmp_path / 'other', classes=('background', 'road', 'bus', 'tree', 'sky'),
                          counts=(('train', 1), ('val', 1)))
    with pytest.raises(CheckpointError, match=r'trained on 5 classes \(background, road, car, tree, sky\), the data '
                                              r'set holds 5 \(background, road, bus, tree, sky\)'):
        if tool == 'test_seg':
            from backbones.dense.test import build_parser as test_parser
            from backbones.dense.test import prepare as test_prepare
            test_prepare(test_parser().parse_args([str(config), str(checkpoint), '--data-root', str(other),
                                                   '--work-dir', str(tmp_path / 'w')]))
        elif tool == 'predict_seg':  # and tools/visualize.py: the same predictor
            from backbones.dense.predict import SegPredictor
            SegPredictor(str(config), str(checkpoint), data_root=str(other))
        else:
            from classification.digits.seg_data import EmbeddedPages
            from classification.export import main as export
            export(['segmentor', str(config), str(checkpoint), '--data-root', str(other), '--out',
                    str(tmp_path / 'exported')], fallback=EmbeddedPages)
    assert not (tmp_path / 'exported').exists()


def test_test_seg_refuses_two_images_that_would_write_one_prediction(untrained, tmp_path):
    """--pred-dir names a mask by its image's name, as predict_seg does: two of one name in two sub-folders of the
    split would write one file (4 masks for 5 images), so both refuse, naming the two."""
    _, config, checkpoint = untrained
    root = write_own_seg(tmp_path / 'own', counts=(('train', 1), ('val', 2)))
    for kind, suffix in (('images', 'jpg'), ('masks', 'png')):
        for i, folder in enumerate('ab'):
            (root / kind / 'val' / folder).mkdir()
            (root / kind / 'val' / f'val_{i}.{suffix}').rename(root / kind / 'val' / folder / f'photo.{suffix}')
    from backbones.dense.test import build_parser as test_parser
    from backbones.dense.test import prepare as test_prepare
    args = [str(config), str(checkpoint), '--data-root', str(root), '--work-dir', str(tmp_path / 'w')]
    test_prepare(test_parser().parse_args(args))  # the data set itself is fine
    a, b = (root / 'images' / 'val' / folder / 'photo.jpg' for folder in 'ab')
    with pytest.raises(UsageError, match=rf'{a} and {b} would both write {tmp_path / "pred" / "photo.png"}'):
        test_prepare(test_parser().parse_args([*args, '--pred-dir', str(tmp_path / 'pred')]))


def test_predict_seg_overlays_a_one_pixel_image_and_one_with_an_exif_orientation(untrained, tmp_path):
    """The overlay is drawn on the pixels the model read (as stored, EXIF orientation aside: a square photo tagged to
    be shown turned would otherwise be overlaid turned), and a one-pixel image is one like any other."""
    from PIL import Image

    from backbones.dense.predict import SegPredictor
    _, config, checkpoint = untrained
    photos = tmp_path / 'photos'
    photos.mkdir()
    y, x = np.mgrid[0:64, 0:64]
    stored = np.stack([x * 4, y * 3, (x + 2 * y)], axis=-1).astype(np.uint8)  # no symmetry
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(stored).save(photos / 'turned.jpg', quality=100, exif=exif.tobytes())
    Image.fromarray(np.full((1, 1, 3), 120, np.uint8)).save(photos / 'dot.png')
    result = succeeded(run_tool('predict_seg.py', [config, checkpoint, photos, '--out', tmp_path / 'masks',
                                                   '--overlay']))
    assert f'{photos / "turned.jpg"} has EXIF orientation 6: its mask fits the pixels as stored' in result.stdout
    predictor = SegPredictor(str(config), str(checkpoint))
    for image, shape in ((photos / 'dot.png', (1, 1)), (photos / 'turned.jpg', (64, 64))):
        mask = cv2.imread(str(tmp_path / 'masks' / f'{image.stem}.png'), cv2.IMREAD_UNCHANGED)
        assert mask.shape == shape and np.array_equal(mask, predictor(image))
    overlay = cv2.cvtColor(cv2.imread(str(tmp_path / 'masks' / 'turned_overlay.png')), cv2.COLOR_BGR2RGB)
    mask = cv2.imread(str(tmp_path / 'masks' / 'turned.png'), cv2.IMREAD_UNCHANGED)
    pixels = np.asarray(Image.open(photos / 'turned.jpg').convert('RGB')).astype(np.float64)  # as stored
    blend = pixels * 0.4 + np.asarray(predictor.palette, np.float64)[mask] * 0.6  # alpha 0.6 (draw_labels)
    assert np.median(np.abs(overlay - blend)) <= 1  # the class names' boxes aside
    assert np.median(np.abs(overlay - (np.rot90(pixels, -1) * 0.4 + np.asarray(predictor.palette)[mask] * 0.6))) > 5
