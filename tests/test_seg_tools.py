"""tools/train_seg.py, tools/test_seg.py and tools/predict_seg.py end to end on a tiny ADE20K-format set, and
mmseg's own tools."""
from __future__ import annotations

import json
import re
from pathlib import Path

import cv2

import backbones.dense  # noqa: F401  (first: it lets mmseg import on mmcv-lite; registers the suite's modules)

# isort: split
import mmseg
import numpy as np
import pytest
import torch

from helpers.commands import one_line_error, run_python, run_tool, succeeded
from helpers.seg_data import independent_scores, write_tiny_ade, write_tiny_config

pytestmark = pytest.mark.slow  # tools run end to end here: make test-fast leaves this file out


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """A tiny UperNet + LV-ViT run of 2 iterations, then resumed to 3."""
    root = tmp_path_factory.mktemp('seg')
    data = write_tiny_ade(root / 'ade')
    config = write_tiny_config(root / 'tiny_upernet_lvvit.py', 'upernet_lvvit_s.py', data)
    work = root / 'work'
    # a fresh interpreter: the notices a run prints while importing are part of what the next test reads
    result = succeeded(run_tool('train_seg.py', [config, '--work-dir', work, '--iters', '2'], fresh=True))
    (root / 'train_output.txt').write_text(result.stdout + result.stderr)
    return root, config, work, data


def test_a_run_prints_no_notice_the_user_can_do_nothing_about(trained):
    """mmcv-lite's, mmseg's and mmengine's notices that ask nothing of the user (segmentation.notices) stay out of
    the output, and the configs take reduce_zero_label from the data set, as mmseg asks."""
    from backbones.dense.silenced_warnings import HARMLESS_LOG_LINES, HARMLESS_WARNINGS
    output = (trained[0] / 'train_output.txt').read_text()
    notices = [*HARMLESS_WARNINGS, *HARMLESS_LOG_LINES, 'MultiScaleDeformableAttention', '`reduce_zero_label` will be']
    assert [notice for notice in notices if notice in output] == []
    assert 'Iter(train) [2/2]' in output  # the run did log


def test_train_refuses_to_overwrite_and_resumes(trained):
    root, config, work, _ = trained
    refused = run_tool('train_seg.py', [config, '--work-dir', work, '--iters', '3'])
    assert refused.returncode != 0 and 'add --resume' in refused.stderr
    result = succeeded(run_tool('train_seg.py', [config, '--work-dir', work, '--iters', '3', '--resume']))
    log = result.stdout + result.stderr
    assert 'resumed epoch: 0, iter: 2' in log
    assert 'Iter(train) [3/3]' in log and 'Iter(train) [1/3]' not in log
    assert (work / 'iter_3.pth').is_file()
    # once more on the finished run: it validated again and wrote a new config dump and log folder, without a word
    before = sorted((path, path.stat().st_mtime_ns) for path in work.rglob('*'))
    again = succeeded(run_tool('train_seg.py', [config, '--work-dir', work, '--iters', '3', '--resume']))
    assert again.stderr.strip().splitlines()[-1] == (f'nothing to do: {work} holds a finished run (finished.json: 3 '
                                                     f'of its 3 iterations, validated): a new run (a longer schedule, '
                                                     f'other settings) needs another --work-dir')
    assert 'Iter(' not in again.stdout + again.stderr
    assert sorted((path, path.stat().st_mtime_ns) for path in work.rglob('*')) == before


def test_a_misspelt_cfg_option_is_one_line_before_anything_is_written(trained, tmp_path):
    """mmengine's TypeError came after a 400-line config dump, with a log folder left behind."""
    _, config, _, _ = trained
    result = run_tool('train_seg.py', [config, '--work-dir', tmp_path / 'work', '--iters', '1', '--cfg-options',
                                       'train_dataloader.batch_sise=2'])
    assert one_line_error(result) == ("error: --cfg-options train_dataloader.batch_sise: train_dataloader (a data "
                                      "loader) takes no 'batch_sise'; the nearest is 'batch_size'  (--debug "
                                      'shows the traceback)')
    assert len((result.stdout + result.stderr).splitlines()) < 5 and not (tmp_path / 'work').exists()


def test_a_batch_of_one_that_upernet_cannot_train_is_refused_before_any_work(trained, tmp_path):
    """UperNet's pyramid pooling normalises 1x1 maps: one image a batch failed in the first iteration with torch's
    ValueError (after benchmark_seg's minutes of evaluation; after train_seg's log folder was written). FCN's head
    has no such layer and trains on one image."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from backbones.dense.runner import check_batch_trains, pooled_batch_norms
    _, config, _, data = trained
    work = tmp_path / 'work'
    result = run_tool('train_seg.py', [config, '--work-dir', work, '--iters', '1', '--cfg-options',
                                       'train_dataloader.batch_size=1'])
    message = one_line_error(result)
    assert len((result.stdout + result.stderr).splitlines()) < 5  # before the runner's config dump
    assert message.startswith('error: train_dataloader.batch_size 1: decode_head.psp_modules.0.1.bn (1 such layer(s)) '
                              'is a BatchNorm of a map pooled to one pixel'), message
    assert not work.exists()
    message = one_line_error(run_tool('benchmark_seg.py', ['--batch-size', '1', '--images', '1', '--iters', '1']))
    assert message.startswith('error: --batch-size 1: decode_head.psp_modules.0.1.bn'), message
    init_default_scope('mmseg')
    fcn = MODELS.build(Config.fromfile(write_tiny_config(tmp_path / 'fcn.py', 'fcn_lvvit_s.py', data)).model)
    assert pooled_batch_norms(fcn) == []
    check_batch_trains(fcn, 1, 1, 'batch')
    fcn.train()
    fcn.decode_head(fcn.extract_feat(torch.rand(1, 3, 64, 64)))  # one image trains FCN's head


@pytest.mark.parametrize('mode', ['ss', 'ms'])
def test_evaluation_matches_an_independent_computation(trained, mode):
    root, config, work, data = trained
    out, preds = root / f'{mode}.json', root / f'pred_{mode}'
    args = [config, work / 'iter_2.pth', '--out', out, '--pred-dir', preds]
    # mmseg's names: --tta is --ms; --show-dir draws each test image
    extra = ['--tta'] if mode == 'ms' else ['--show-dir', root / 'show']
    result = succeeded(run_tool('test_seg.py', [*args, *extra]))
    report = json.loads(out.read_text())
    annotations = data / 'annotations' / 'validation'
    expected = independent_scores(preds, annotations)
    for key in ('mIoU', 'aAcc', 'mAcc'):
        assert report[key] == pytest.approx(expected[key], abs=1e-6), key
    confusion = np.zeros((150, 150), np.int64)  # ADE20K's values: class + 1, 0 ignored
    for pred in sorted(preds.glob('*.png')):
        truth, predicted = read_mask(annotations / pred.name).astype(np.int64), read_mask(pred).astype(np.int64)
        np.add.at(confusion, (truth[truth > 0] - 1, predicted[truth > 0] - 1), 1)
    assert np.array_equal(report['confusion']['counts'], confusion)
    if mode == 'ss':
        check_pictures(root / 'show', preds, data)
    assert len(report['per_class']) == 150 and set(report['per_class']['wall']) == {'IoU', 'Acc'}
    labelled = set().union(*(np.unique(read_mask(ann)).tolist()
                             for ann in (data / 'annotations' / 'validation').glob('*.png')))
    names = list(report['per_class'])
    assert report['unlabelled'] == [name for i, name in enumerate(names) if i + 1 not in labelled]  # ADE: class + 1
    assert f'warning: {len(report["unlabelled"])} of 150 classes have no pixel in the ground truth' in result.stdout
    label = 'multi-scale + flip' if mode == 'ms' else 'single-scale'
    assert f'{label}: mIoU {report["mIoU"]:.2f}' in result.stdout


def check_pictures(show: Path, preds: Path, data: Path) -> None:
    """test_seg --show-dir's pictures: each validation image, its ground truth and the prediction test_seg wrote,
    drawn in ADE20K's palette as tools/visualize.py segmentation draws them."""
    from mmseg.datasets import ADE20KDataset

    from backbones.dense.semantic.pictures import read_annotation, segmentation_picture
    meta = ADE20KDataset.METAINFO
    assert sorted(p.name for p in show.iterdir()) == sorted(p.name for p in preds.glob('*.png'))
    for pred in sorted(preds.glob('*.png')):
        image = cv2.imread(str(data / 'images' / 'validation' / f'{pred.stem}.jpg'))[..., ::-1]
        truth = read_annotation(str(data / 'annotations' / 'validation' / pred.name), reduce_zero_label=True)
        picture = segmentation_picture(np.ascontiguousarray(image), read_mask(pred).astype(np.int64) - 1,
                                       meta['classes'], meta['palette'], truth)
        assert np.array_equal(cv2.imread(str(show / pred.name))[..., ::-1], picture), pred.name


def test_mmseg_stock_tools_run_the_configs(trained):
    """mmseg's own train.py and test.py run the configs unchanged; its --tta takes the config's test-time pipeline
    (the papers' multi-scale protocol), so it scores the checkpoint exactly as test_seg.py --ms does."""
    root, config, _, _ = trained
    tools = Path(mmseg.__file__).parent / '.mim' / 'tools'
    work = root / 'stock'
    succeeded(run_python([tools / 'train.py', config, '--work-dir', work, '--cfg-options', 'train_cfg.max_iters=1',
                          'train_cfg.val_interval=1', 'default_hooks.checkpoint.interval=1']))
    assert (work / 'iter_1.pth').is_file()
    result = succeeded(run_python([tools / 'test.py', config, work / 'iter_1.pth', '--work-dir', work, '--tta']))
    stock = re.findall(r'Iter\(test\) \[\d+/\d+\]\s+aAcc: ([\d.]+)\s+mIoU: ([\d.]+)\s+mAcc: ([\d.]+)',
                       result.stdout + result.stderr)[-1]
    succeeded(run_tool('test_seg.py', [config, work / 'iter_1.pth', '--ms', '--out', root / 'stock_ms.json']))
    ours = json.loads((root / 'stock_ms.json').read_text())
    assert [float(value) for value in stock] == pytest.approx([ours[key] for key in ('aAcc', 'mIoU', 'mAcc')],
                                                             abs=1e-4)


def test_a_checkpoint_that_does_not_fit_the_config_is_refused(trained, tmp_path):
    """A segmentor's checkpoint that lacks a weight of the config's model is refused naming it; an image classifier's
    is named as one, with the tools that take it."""
    root, config, work, _ = trained
    import torch

    from backbones import create_model
    classifier = create_model('lvvit_s', num_classes=10, depth=2, embed_dim=32, num_heads=2)
    torch.save({'state_dict': classifier.state_dict()}, tmp_path / 'classifier.pth')
    segmentor = torch.load(work / 'iter_2.pth', weights_only=False)
    del segmentor['state_dict']['decode_head.conv_seg.weight']
    torch.save(segmentor, tmp_path / 'incomplete.pth')
    for checkpoint, expected in (
            ('incomplete.pth', 'incomplete.pth does not fit the model of this config (it would leave weights '
                               'unloaded): 1 missing keys: decode_head.conv_seg.weight'),
            ('classifier.pth', 'classifier.pth holds an image classifier (lvvit weights, no decode head), not a '
                               'segmentor: tools/predict_cls.py and tools/eval_cls.py take it')):
        result = run_tool('test_seg.py', [config, tmp_path / checkpoint, '--work-dir', tmp_path / 'work'])
        assert result.returncode == 2 and expected in result.stderr.strip().splitlines()[-1], result.stderr[-2000:]


def test_resume_falls_back_to_the_newest_readable_checkpoint(trained, tmp_path):
    _, config, work, _ = trained
    copy = tmp_path / 'work'
    copy.mkdir()
    for name in ('iter_1.pth', 'iter_2.pth'):
        (copy / name).write_bytes((work / name).read_bytes())
    (copy / 'iter_2.pth').write_bytes((copy / 'iter_2.pth').read_bytes()[:1000])  # cut short
    (copy / 'last_checkpoint').write_text(str(copy / 'iter_2.pth'))
    (copy / '.iter_3.pth.tmp123').write_bytes(b'left by a kill')
    result = succeeded(run_tool('train_seg.py', [config, '--work-dir', copy, '--iters', '3', '--resume']))
    log = result.stdout + result.stderr
    assert f'{copy / "iter_2.pth"} cannot be read' in log and f'resumed from {copy / "iter_1.pth"}' in log
    assert 'resumed epoch: 0, iter: 1' in log and 'Iter(train) [2/3]' in log
    assert (copy / 'iter_3.pth').is_file() and not (copy / '.iter_3.pth.tmp123').exists()


def test_grad_accum_steps_makes_one_update_every_n_iterations(trained, tmp_path):
    """--iters 2 --grad-accum-steps 2: 4 iterations and 2 optimizer updates (AdamW's step count), the schedule's
    phases counted in iterations of 2 batches."""
    import torch
    from mmengine.config import Config
    _, config, _, _ = trained
    work = tmp_path / 'accumulated'
    result = succeeded(run_tool('train_seg.py', [config, '--work-dir', work, '--iters', '2',
                                                 '--grad-accum-steps', '2']))
    assert '4 iterations of 2 images, 2 accumulated per update' in result.stdout + result.stderr
    checkpoint = torch.load(work / 'iter_4.pth', map_location='cpu', weights_only=False)
    assert {int(s['step']) for s in checkpoint['optimizer']['state'].values()} == {2}
    cfg = Config.fromfile(work / Path(config).name)
    # the 2-update schedule (warm-up over update 1, decay over update 2) in iterations of 2 batches
    assert [(s['begin'], s['end']) for s in cfg.param_scheduler] == [(0, 2), (2, 4)]


def test_a_copied_work_dir_resumes_from_its_own_checkpoints(trained, tmp_path):
    """mmengine's last_checkpoint holds an absolute path: in a copy it names the original's file. The copy resumes
    from its own file of that name (the original's is damaged here, so using it would fail), and a copy whose own
    newest checkpoint is cut short falls back to its own older one, never to the original's."""
    import shutil
    _, config, work, _ = trained
    original = Path(shutil.copytree(work, tmp_path / 'original'))
    for later in original.glob('iter_[3-9]*.pth'):  # another test of this module may have resumed the run
        later.unlink()
    (original / 'finished.json').unlink()  # the run at its second iteration, as stopped there
    (original / 'last_checkpoint').write_text(str(original / 'iter_2.pth'))
    copy, cut = (Path(shutil.copytree(original, tmp_path / name)) for name in ('copy', 'cut'))
    (original / 'iter_2.pth').write_bytes(b'a new run is writing here')
    for folder in (copy, cut):
        assert (folder / 'last_checkpoint').read_text() == str(original / 'iter_2.pth')
    result = succeeded(run_tool('train_seg.py', [config, '--work-dir', copy, '--iters', '3', '--resume']))
    log = result.stdout + result.stderr
    assert f'resuming from this work dir\'s own {copy / "iter_2.pth"}' in log
    assert f'resumed from {copy / "iter_2.pth"}' in log and 'Iter(train) [3/3]' in log
    (cut / 'iter_2.pth').write_bytes((cut / 'iter_2.pth').read_bytes()[:1000])
    result = succeeded(run_tool('train_seg.py', [config, '--work-dir', cut, '--iters', '3', '--resume']))
    log = result.stdout + result.stderr
    assert f'resumed from {cut / "iter_1.pth"} instead' in log and str(original / 'iter_1.pth') not in log


def test_an_init_cfg_checkpoint_that_does_not_fit_is_refused(trained, tmp_path):
    """model.init_cfg=Pretrained (mmengine loads it non-strictly): a classification checkpoint, or a segmentor
    checkpoint missing one weight, stops the run naming the keys; the whole segmentor checkpoint trains."""
    import timm
    import torch
    _, config, work, _ = trained
    classifier = tmp_path / 'best.pth'
    torch.save({'state_dict': timm.create_model('deit_tiny_patch16_224', num_classes=3).state_dict()}, classifier)
    segmentor = torch.load(work / 'iter_2.pth', map_location='cpu', weights_only=False)
    missing_one = tmp_path / 'missing_one.pth'
    removed = 'decode_head.conv_seg.weight'
    torch.save({'state_dict': {k: v for k, v in segmentor['state_dict'].items() if k != removed}}, missing_one)
    for checkpoint, named in ((classifier, 'unexpected keys: cls_token'), (missing_one, f'1 missing keys: {removed}')):
        result = run_tool('train_seg.py', [config, '--work-dir', tmp_path / f'run_{checkpoint.stem}', '--iters', '1',
                                           '--cfg-options', 'model.init_cfg.type=Pretrained',
                                           f'model.init_cfg.checkpoint={checkpoint}'])
        assert result.returncode == 2 and f'{checkpoint} does not fit it' in result.stderr, result.stderr[-2000:]
        assert named in result.stderr and 'Traceback' not in result.stderr
    succeeded(run_tool('train_seg.py', [config, '--work-dir', tmp_path / 'run_whole', '--iters', '1', '--cfg-options',
                                        'model.init_cfg.type=Pretrained',
                                        f'model.init_cfg.checkpoint={work}/iter_2.pth']))


def read_mask(path: Path) -> np.ndarray:
    return cv2.imread(str(path), cv2.IMREAD_UNCHANGED)


def test_predict_seg_writes_test_segs_masks_single_and_multi_scale_in_each_images_size(trained, tmp_path):
    """tools/predict_seg.py on the validation images and on an image of no data set: test_seg's masks exactly, in
    the data set's label values, single-scale, multi-scale + flip and multi-scale alone; overlays of each size."""
    _, config, work, data = trained
    images = data / 'images' / 'validation'
    new = tmp_path / 'new'
    new.mkdir()
    photo = cv2.imread(str(next(images.iterdir())))
    cv2.imwrite(str(new / 'photo.png'), cv2.resize(photo, (83, 37)))  # an image of no data set, of its own size
    for mode in ([], ['--ms'], ['--ms', '--no-flip']):
        name = '_'.join(['ss', *mode])
        succeeded(run_tool('test_seg.py', [config, work / 'iter_2.pth', *mode, '--pred-dir', tmp_path / f'pred{name}',
                                           '--out', tmp_path / f'r{name}.json']))
        succeeded(run_tool('predict_seg.py', [config, work / 'iter_2.pth', images, new / 'photo.png', *mode,
                                              '--out', tmp_path / f'masks{name}', '--overlay']))
        expected = sorted((tmp_path / f'pred{name}').glob('*.png'))
        assert len(expected) == 3
        for pred in expected:
            assert np.array_equal(read_mask(tmp_path / f'masks{name}' / pred.name), read_mask(pred)), (mode, pred)
        mask = read_mask(tmp_path / f'masks{name}' / 'photo.png')
        assert mask.shape == (37, 83) and mask.min() >= 1  # ADE20K's label values: class + 1
        overlay = cv2.imread(str(tmp_path / f'masks{name}' / 'photo_overlay.png'))
        assert overlay.shape == (37, 83, 3)
