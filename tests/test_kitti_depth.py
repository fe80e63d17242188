"""KITTI depth (Eigen split, Garg crop, 80 m cap): a tiny KITTI tree in the exact formats (raw PNGs by date and
drive, 16-bit ground truth of 1/256 m with zeros, BTS's split files with `None` entries) read through the config's
own pipeline, the Garg-cropped metric against a count by hand, the layout's one-line refusals, the embedded pages
written in KITTI's layout, and train_seg on that fallback."""
from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmseg.registry import DATASETS
from PIL import Image

import backbones.dense  # noqa: F401  (registration)
from backbones.common.errors import DataError, UsageError
from backbones.dense.data_check import check_dataset
from backbones.dense.depth.kitti import (
    SCAN_ROW_EVERY,
    SMALL_SCENE_SCALE,
    KittiLayout,
    prediction_name,
    read_split_file,
)
from backbones.dense.depth.metric import DepthReport
from backbones.dense.layouts import SmallDenseData, layout_of
from backbones.dense.tasks import task_of
from helpers.commands import ROOT, run_tool, succeeded
from helpers.dense_data import TINY_DEPTH
from helpers.seg_data import TINY_MODELS

CONFIG = ROOT / 'seg_configs' / 'depth_lvvit_s_kitti.py'
DRIVE = '2011_09_26_drive_0002_sync'
SIZE = (96, 32)  # width, height of the tiny frames (KITTI's are 1242x375)
FRAMES = ('0000000069', '0000000054', '0000000075', '0000000042')
NO_TRUTH = '0000000075'  # the frame the test split lists with None (as BTS's file lists it)


def frame_depth(index: int) -> np.ndarray:
    """A frame's ground truth in KITTI's units (1/256 m): sparse rows of points, 0 elsewhere, values up to 100 m."""
    rng = np.random.default_rng(index)
    units = rng.integers(1, 100 * 256, (SIZE[1], SIZE[0])).astype(np.uint16)
    units[rng.random(units.shape) > 0.3] = 0
    return units


def image_line(frame: str, with_date: bool = True) -> str:
    return f'{"2011_09_26/" if with_date else ""}{DRIVE}/image_02/data/{frame}.png'


def depth_line(frame: str) -> str:
    return f'{DRIVE}/proj_depth/groundtruth/image_02/{frame}.png'


@pytest.fixture(scope='module')
def kitti_set(tmp_path_factory) -> Path:
    """data/kitti in its layout: input/DATE/DRIVE/image_02/data/*.png, gt_depth/DRIVE/proj_depth/groundtruth/
    image_02/*.png (16-bit, 1/256 m, 0 = none) and BTS's split files; the test split's third frame has no ground
    truth (None, its file absent) and its second line is written without the date folder, as some copies are."""
    root = tmp_path_factory.mktemp('kitti')
    rng = np.random.default_rng(0)
    images, truth = root / 'input' / '2011_09_26' / DRIVE / 'image_02' / 'data', root / 'gt_depth' / depth_line('x')
    images.mkdir(parents=True)
    truth.parent.mkdir(parents=True)
    for index, frame in enumerate(FRAMES):
        cv2.imwrite(str(images / f'{frame}.png'), rng.integers(0, 256, (SIZE[1], SIZE[0], 3), dtype=np.uint8))
        if frame != NO_TRUTH:
            cv2.imwrite(str(truth.parent / f'{frame}.png'), frame_depth(index))
    test_lines = [f'{image_line(f, with_date=i != 1)} {depth_line(f) if f != NO_TRUTH else "None"} 721.5377'
                  for i, f in enumerate(FRAMES)]
    (root / 'eigen_test_files_with_gt.txt').write_text('\n'.join(test_lines) + '\n')
    (root / 'eigen_train_files_with_gt.txt').write_text(
        '\n'.join(f'{image_line(f)} {depth_line(f)} 721.5377' for f in FRAMES if f != NO_TRUTH) + '\n')
    return root


def kitti_dataset_cfg(root: Path, loader: str = 'test_dataloader') -> dict:
    """The KITTI config's own data set of `loader`, under `root`."""
    cfg = Config.fromfile(CONFIG)
    return {**cfg[loader].dataset.to_dict(), 'data_root': str(root)}


def test_the_split_file_is_read_in_btss_form(kitti_set, tmp_path):
    entries = read_split_file(kitti_set / 'eigen_test_files_with_gt.txt')
    assert [e.image for e in entries] == [image_line(f) for f in FRAMES]  # the date folder added where left out
    assert [e.depth for e in entries] == [None if f == NO_TRUTH else depth_line(f) for f in FRAMES]
    assert {e.focal for e in entries} == {721.5377}
    bad = tmp_path / 'split.txt'
    for line, said in (('2011_09_26/2011_09_26_drive_0002_sync 69 l', 'Monodepth2-style'),
                       (f'{image_line("0000000069")} {depth_line("0000000069")}', '2 field(s)'),
                       (f'{image_line("0000000069")} {depth_line("0000000069")} far', "'far' is not a number"),
                       # another frame's ground truth, and an image scored twice
                       (f'{image_line("0000000069")} {depth_line("0000000042")} 721.5377',
                        f'the depth map {depth_line("0000000042")} is not of the image {image_line("0000000069")}'),
                       (f'{image_line("0000000069")} {depth_line("0000000069").replace("image_02", "image_03")} 7',
                        'is not of the image'),
                       (f'{image_line("0000000054", with_date=False)} None 721.5377',
                        f'the image {image_line("0000000054")} is listed again (first on line 1)')):
        bad.write_text(f'{image_line("0000000054")} None 721.5377\n\n{line}\n')
        with pytest.raises(DataError, match=f'{re.escape(str(bad))}:3: .*{re.escape(said)}'):
            read_split_file(bad)
    bad.write_bytes(b'\xff\xfe' + image_line('0000000054').encode('utf-16-le'))
    with pytest.raises(DataError, match=f'^{re.escape(str(bad))} is not a text file'):
        read_split_file(bad)


def test_depth_is_read_in_metres_exactly_and_frames_without_ground_truth_are_named(kitti_set, caplog):
    """Through the config's own test pipeline: every depth value is its 16-bit unit / 256 exactly, zeros stay 0;
    the None entry is left out, and the log counts and names it."""
    init_default_scope('mmseg')
    with caplog.at_level(logging.INFO, logger='vit_dense'):
        dataset = DATASETS.build(kitti_dataset_cfg(kitti_set))
    assert len(dataset) == 3 and dataset.without_ground_truth == [image_line(NO_TRUTH)]
    assert f'1 of 4 entries have no ground truth (None) and are left out, 3 used: {image_line(NO_TRUTH)}' in caplog.text
    for position, index in enumerate(i for i, f in enumerate(FRAMES) if f != NO_TRUTH):
        sample = dataset[position]['data_samples']
        assert sample.img_path.endswith(image_line(FRAMES[index]))
        assert sample.pred_name == f'{DRIVE}_{FRAMES[index]}'  # its predicted map's name: frames repeat per drive
        depth = sample.gt_depth_map.data[0].numpy()
        assert np.array_equal(depth, frame_depth(index).astype(np.float64) / 256)


def test_each_listed_frame_has_its_own_prediction_name():
    """test_seg --pred-dir writes each frame as NAME.png: the right camera's frame (BTS's training file lists
    image_03 too) named as the left camera's would overwrite it."""
    left, right = image_line(FRAMES[0]), image_line(FRAMES[0]).replace('image_02', 'image_03')
    assert prediction_name(left) == f'{DRIVE}_{FRAMES[0]}'
    assert prediction_name(right) == f'{DRIVE}_image_03_{FRAMES[0]}'
    assert prediction_name('scans/a/0001.png') == 'scans_a_0001'


def hand_scores(truth: np.ndarray, predicted: np.ndarray, rows: slice, cols: slice) -> dict[str, float]:
    """The depth papers' figures over the pixels of the crop (rows, cols) with depth in (0.001, 80) m, by hand, as
    BTS's evaluation computes them (`compute_errors`: the prediction clipped to 0.001 .. 80 m first; SILog
    100 sqrt(mean d^2 - mean(d)^2), the KITTI benchmark's); and mmseg's SILog, sqrt(mean d^2 - 0.5 mean(d)^2)."""
    window = np.zeros(truth.shape, bool)
    window[rows, cols] = True
    keep = window & (truth > 1e-3) & (truth < 80)
    g, p = truth[keep], np.clip(predicted[keep], 1e-3, 80)
    ratio = np.maximum(g / p, p / g)
    d = np.log(p) - np.log(g)
    return dict(d1=np.mean(ratio < 1.25), abs_rel=np.mean(np.abs(p - g) / g), sq_rel=np.mean((p - g) ** 2 / g),
                rmse=np.sqrt(np.mean((p - g) ** 2)), rmse_log=np.sqrt(np.mean((np.log(p) - np.log(g)) ** 2)),
                log10=np.mean(np.abs(np.log10(p) - np.log10(g))),
                silog=100 * np.sqrt(np.mean(d ** 2) - np.mean(d) ** 2),
                silog_mmseg=np.sqrt(np.mean(d ** 2) - 0.5 * np.mean(d) ** 2))


def test_the_garg_crop_scores_what_a_count_by_hand_on_the_crop_gives():
    """A 50x100 map: Garg's crop is rows 20..48 and columns 3..95 (int(0.4081 x 50) .. int(0.9919 x 50), ...);
    zeros, depths of 80 m and beyond, and everything outside the crop (made wildly wrong) count for nothing."""
    rng = np.random.default_rng(1)
    truth = rng.uniform(2, 70, (50, 100))
    truth[rng.random(truth.shape) < 0.6] = 0  # sparse: most pixels measured nothing
    truth[25, 10:20] = 80.0
    truth[30, 10:20] = 95.5
    predicted = truth * rng.uniform(0.7, 1.3, truth.shape) + (truth == 0) * 5.0
    predicted[21, :] = 0.0  # no logarithm: BTS clips to 0.001 m first (mmseg's scores were infinite)
    predicted[22, :] = 120.0  # beyond the 80 m scored: clipped to it (a quarter of the map's pixels go past it)
    outside = np.ones(truth.shape, bool)
    outside[20:49, 3:96] = False
    predicted[outside] = 1000.0
    metric = DepthReport(min_depth_eval=1e-3, max_depth_eval=80.0, crop_type='garg_crop')
    metric.process({}, [dict(img_path='0000000001.png', pred_depth_map=dict(data=torch.from_numpy(predicted)[None]),
                             gt_depth_map=dict(data=torch.from_numpy(truth)[None]))])
    scores = metric.compute_metrics(metric.results)
    expected = hand_scores(truth, predicted, slice(20, 49), slice(3, 96))
    for name, value in expected.items():
        assert scores[name] == pytest.approx(value, rel=1e-6), name  # mmseg's deltas: float32 counts
    uncropped = DepthReport(min_depth_eval=1e-3, max_depth_eval=80.0)
    uncropped.process({}, [dict(img_path='1.png', pred_depth_map=dict(data=torch.from_numpy(predicted)[None]),
                                gt_depth_map=dict(data=torch.from_numpy(truth)[None]))])
    whole = hand_scores(truth, predicted, slice(None), slice(None))['abs_rel']
    assert uncropped.compute_metrics(uncropped.results)['abs_rel'] == pytest.approx(whole, rel=1e-6)
    assert whole > 4 * scores['abs_rel']  # the crop did it
    with pytest.raises(UsageError, match="crop_type is one of None, nyu_crop, garg_crop; got 'kitti'"):
        DepthReport(crop_type='kitti')


def copied(kitti_set: Path, tmp_path: Path) -> Path:
    return shutil.copytree(kitti_set, tmp_path / 'kitti')


def test_what_the_layout_lacks_is_named_in_one_line(kitti_set, tmp_path):
    root = copied(kitti_set, tmp_path)
    shutil.rmtree(root / 'gt_depth')
    (root / 'eigen_test_files_with_gt.txt').unlink()
    dataset_cfg = kitti_dataset_cfg(root)
    assert isinstance(layout_of(dataset_cfg), KittiLayout)
    with pytest.raises(DataError) as refused:
        check_dataset(dataset_cfg, task_of(Config.fromfile(CONFIG)))
    message = str(refused.value)
    assert '\n' not in message and f'the split file (BTS\'s eigen_*_files_with_gt.txt) {root}/eigen_test_' in message
    assert f'the ground truth\'s folder (data_depth_annotated\'s train/ and val/ drives together) {root}/gt_depth' \
        in message and 'input' not in message


def test_an_absent_8_bit_or_wrongly_sized_depth_map_is_refused_naming_it(kitti_set, tmp_path):
    """A listed depth map that is not there, one of 8 bits (read as 0 .. 1 m) and one of another size than its
    image: the data check names each file, in one line, before any training."""
    root = copied(kitti_set, tmp_path)
    truth = root / 'gt_depth' / DRIVE / 'proj_depth' / 'groundtruth' / 'image_02'
    (truth / f'{FRAMES[0]}.png').unlink()
    Image.new('L', SIZE, 30).save(truth / f'{FRAMES[1]}.png')
    cv2.imwrite(str(truth / f'{FRAMES[3]}.png'), np.ones((SIZE[1], SIZE[0] + 2), np.uint16))
    with pytest.raises(DataError) as refused:
        check_dataset(kitti_dataset_cfg(root), task_of(Config.fromfile(CONFIG)))
    message = str(refused.value)
    assert '\n' not in message and message.startswith(f'3 of 3 images in {root}/input cannot be used')
    assert f'has no depth map {truth}/{FRAMES[0]}.png' in message
    assert f'depth map {truth}/{FRAMES[1]}.png is L (1 channel(s) of 8 bits)' in message
    assert f'its depth map {truth}/{FRAMES[3]}.png is {SIZE[0] + 2}x{SIZE[1]}' in message


@pytest.fixture(scope='module')
def pages(tmp_path_factory) -> SmallDenseData:
    """A few pages in the tasks' shared layout (images/SPLIT/NAME.jpg, depth/SPLIT/NAME.png in millimetres, 0 on
    some pixels), as the embedded pages are."""
    root = tmp_path_factory.mktemp('pages') / 'digits_seg'
    rng = np.random.default_rng(2)
    for split, count in (('training', 2), ('validation', 3)):
        for folder in ('images', 'depth'):
            (root / folder / split).mkdir(parents=True)
        for i in range(count):
            cv2.imwrite(str(root / 'images' / split / f'page_{i}.jpg'), rng.integers(0, 256, (24, 36, 3), np.uint8))
            millimetres = rng.integers(1000, 6000, (24, 36)).astype(np.uint16)
            millimetres[rng.random(millimetres.shape) < 0.1] = 0
            cv2.imwrite(str(root / 'depth' / split / f'page_{i}.png'), millimetres)
    return SmallDenseData(root, ('background',), ((0, 0, 0),), (36, 24), 1.0, (1.0, 1.0), (1.0,), 1000, False)


def test_the_pages_written_in_kittis_layout_read_back_sparse_as_lidar(pages, caplog):
    """Each page a frame of a fake drive (its PNG the page's pixels), its depth in 1/256 m on scan lines (every
    third row, some of their pixels): the page's, SMALL_SCENE_SCALE times as far, within half a unit where kept, 0
    elsewhere; the test
    split's first frame has no ground truth, as the Eigen test has such frames, and is named."""
    layout = KittiLayout()
    dataset_cfg = kitti_dataset_cfg(Path('data/kitti'))
    with caplog.at_level(logging.INFO, logger='vit_dense'):
        layout.use_small(dataset_cfg, pages, 'validation')
        init_default_scope('mmseg')
        dataset = DATASETS.build(dataset_cfg)
    root = layout.small_root(pages)
    assert dataset_cfg['data_root'] == str(root) == str(pages.root) + '_kitti'
    frame = '2011_09_26/2011_09_26_drive_0002_sync/image_02/data/0000000000.png'
    assert dataset.without_ground_truth == [frame] and f'left out, 2 used: {frame}' in caplog.text
    kept = []
    for position, page in enumerate(('page_1', 'page_2')):
        sample = dataset[position]['data_samples']
        stored = Path(sample.depth_map_path)
        assert stored == root / 'gt_depth' / f'2011_09_26_drive_0002_sync/proj_depth/groundtruth/image_02/' \
                                             f'{position + 1:010d}.png'
        assert Image.open(stored).mode in ('I;16', 'I')
        image = cv2.imread(str(Path(sample.img_path)))
        assert np.array_equal(image, cv2.imread(str(pages.root / 'images' / 'validation' / f'{page}.jpg')))
        page_depth = cv2.imread(str(pages.root / 'depth' / 'validation' / f'{page}.png'), cv2.IMREAD_UNCHANGED)
        metres = page_depth / 1000 * SMALL_SCENE_SCALE
        depth = sample.gt_depth_map.data[0].numpy()
        measured = depth > 0
        assert np.abs(depth[measured] - metres[measured]).max() <= 0.5 / 256
        assert not (measured & (metres == 0)).any()
        rows = np.flatnonzero(measured.any(axis=1))
        assert len(set(rows % SCAN_ROW_EVERY)) == 1  # scan lines
        kept.append(measured.mean())
    assert 0.05 < np.mean(kept) < 0.2
    before = (root / 'READY').stat().st_mtime_ns
    layout.use_small(dataset_cfg, pages, 'training')  # written once
    assert (root / 'READY').stat().st_mtime_ns == before and dataset_cfg['ann_file'] == 'eigen_train_files_with_gt.txt'


def tiny_kitti_config(path: Path) -> Path:
    """depth_lvvit_s_kitti.py with a tiny backbone and heads, no ImageNet weights, no loader workers; its data
    root data/kitti, not on disk here."""
    model = dict(backbone=dict(model_kwargs=TINY_MODELS['upernet_lvvit_s.py'], out_indices=(0, 1, 2, 3), img_size=64,
                               pretrained=None), **TINY_DEPTH)
    lines = [f'_base_ = [{str(CONFIG)!r}]', f'model = {model!r}',
             'train_dataloader = dict(num_workers=0, persistent_workers=False, batch_size=2)',
             'val_dataloader = dict(num_workers=0, persistent_workers=False)', 'test_dataloader = val_dataloader']
    path.write_text('\n'.join(lines) + '\n')
    return path


def garg_scores_of_saved(pred_dir: Path, root: Path) -> dict[str, float]:
    """AbsRel, RMSE and delta < 1.25 of the saved predictions (DRIVE_FRAME.png, 1/256 m) against the test split's
    ground truth, per frame over its pixels in Garg's crop with depth in (0.001, 80) m, averaged over the frames."""
    per_frame = []
    for entry in read_split_file(root / 'eigen_test_files_with_gt.txt'):
        if entry.depth is None:
            continue
        truth = cv2.imread(str(root / 'gt_depth' / entry.depth), cv2.IMREAD_UNCHANGED).astype(np.float64) / 256
        drive, frame = entry.depth.split('/')[0], Path(entry.depth).name
        predicted = cv2.imread(str(pred_dir / f'{drive}_{frame}'), cv2.IMREAD_UNCHANGED).astype(np.float64) / 256
        height, width = truth.shape
        crop = np.zeros(truth.shape, bool)
        crop[int(0.40810811 * height):int(0.99189189 * height), int(0.03594771 * width):int(0.96405229 * width)] = 1
        valid = crop & (truth > 1e-3) & (truth < 80)
        t, p = truth[valid], predicted[valid]
        per_frame.append(dict(abs_rel=np.mean(np.abs(p - t) / t), rmse=np.sqrt(np.mean((p - t) ** 2)),
                              d1=np.mean(np.maximum(t / p, p / t) < 1.25)))
    return {key: float(np.mean([frame[key] for frame in per_frame])) for key in per_frame[0]}


@pytest.mark.slow  # tools run end to end
@pytest.mark.skipif((ROOT / 'data' / 'kitti').is_dir(), reason='KITTI is on disk: no fallback to test')
def test_train_seg_learns_on_the_pages_written_in_kittis_layout_and_test_seg_scores_the_garg_crop(tmp_path):
    """train_seg on the KITTI config without KITTI: the pages in KITTI's layout stand in, read by KITTIDepthDataset
    in 1/256 m; the test split's frames without ground truth are named. test_seg's scores equal a count over the
    predictions it saved (one per frame, DRIVE_FRAME.png) on Garg's crop up to 80 m."""
    config = tiny_kitti_config(tmp_path / 'tiny_kitti.py')
    pages_dir = tmp_path / 'digits_seg'
    result = succeeded(run_tool('train_seg.py', [config, '--iters', 2, '--work-dir', tmp_path / 'work',
                                                 '--digits-seg-dir', pages_dir]))
    log = result.stdout + result.stderr
    assert 'KITTI depth (Eigen split) not found at data/kitti' in log
    written = tmp_path / 'digits_seg_kitti'
    assert f'{written}/eigen_test_files_with_gt.txt: 10 of 160 entries have no ground truth (None)' in log
    out, preds = tmp_path / 'depth.json', tmp_path / 'preds'
    succeeded(run_tool('test_seg.py', [config, tmp_path / 'work' / 'iter_2.pth', '--out', out, '--pred-dir', preds,
                                       '--digits-seg-dir', pages_dir]))
    report = json.loads(out.read_text())
    assert report['images'] == 150 and report['left_out'] == 0 and len(list(preds.glob('*.png'))) == 150
    expected = garg_scores_of_saved(preds, written)
    # the PNGs hold 1/256 m: the saved depth is within 1/512 m of the scored one
    assert report['abs_rel'] == pytest.approx(expected['abs_rel'], rel=1e-3)
    assert report['rmse'] == pytest.approx(expected['rmse'], abs=2e-3)
    assert report['d1'] == pytest.approx(expected['d1'], abs=0.01)
