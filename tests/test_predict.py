"""Predictions on new images: tools/predict_cls.py names the classes tools/eval_cls.py scores, by the checkpoint's own
names (ImageNet's for an official release); tools/predict_seg.py's bad input (its masks against test_seg's are in
test_seg_tools.py, beside a trained segmentor)."""
from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import timm
import torch

from backbones.common.errors import CheckpointError
from classification.evaluate import main as eval_cls
from classification.predict import ClassPredictor
from helpers.cls_data import CLASSES
from helpers.commands import run_tool, succeeded
from helpers.models import TINY_DEIT, damaged_copy

TINY_KWARGS = dict(embed_dim=32, depth=2, num_heads=2)


@pytest.fixture(scope='module')
def classifier(tiny_deit):
    """An image folder and a two-epoch DeiT run on it (its last.pth records the three class names)."""
    return tiny_deit


def val_images(data: Path) -> list[Path]:
    return sorted((data / 'val').glob('*/*'))


def test_top1_of_the_predictions_is_eval_cls_top1(classifier):
    data, checkpoint = classifier
    metrics = eval_cls([*TINY_DEIT, '--checkpoint', str(checkpoint), '--data-dir', str(data), '--img-size', '32',
                        '--workers', '0'])
    predictor = ClassPredictor('deit_small_patch16_224', str(checkpoint), img_size=32, model_kwargs=TINY_KWARGS)
    results = predictor(val_images(data), k=3)
    hits = [r['top'][0]['class'] == Path(r['image']).parent.name for r in results]
    assert 100 * np.mean(hits) == pytest.approx(metrics['top1'])
    for result in results:
        top = result['top']
        assert [e['class'] for e in top] == [CLASSES[e['index']] for e in top]  # the checkpoint's names
        assert sorted({e['class'] for e in top}) == sorted(CLASSES)
        probabilities = [e['probability'] for e in top]
        assert probabilities == sorted(probabilities, reverse=True) and sum(probabilities) == pytest.approx(1)


def test_eval_and_predict_default_to_the_size_the_checkpoint_was_trained_at(classifier, caplog):
    """The run (at 32 px) records the preprocessing it validated with; eval_cls and predict_cls without --img-size
    take it, the trained or the EMA weights alike (the model's own 224 px gave chance accuracy on the digits), and
    another size is said in one line."""
    data, checkpoint = classifier
    recorded = torch.load(checkpoint, weights_only=True)['args']['data_config']
    assert tuple(recorded['input_size']) == (3, 32, 32)
    common = [*TINY_DEIT, '--checkpoint', str(checkpoint), '--data-dir', str(data), '--workers', '0']
    for weights in ([], ['--use-ema']):
        default, explicit = eval_cls([*common, *weights]), eval_cls([*common, *weights, '--img-size', '32'])
        assert (default['img_size'], default['crop_pct']) == (32, recorded['crop_pct'])
        assert default['top1'] == explicit['top1'] and default['top5'] == explicit['top5']
    images = val_images(data)
    by_default = ClassPredictor('deit_small_patch16_224', str(checkpoint), model_kwargs=TINY_KWARGS)
    at_32 = ClassPredictor('deit_small_patch16_224', str(checkpoint), img_size=32, model_kwargs=TINY_KWARGS)
    assert torch.equal(torch.cat(list(by_default.probabilities(images))), torch.cat(list(at_32.probabilities(images))))
    with caplog.at_level('WARNING', logger='vit_dense'):
        ClassPredictor('deit_small_patch16_224', str(checkpoint), img_size=48, model_kwargs=TINY_KWARGS)
    assert caplog.text.count(f'{checkpoint} was trained at 32 px; it runs at 48 px here') == 1


def test_nan_logits_are_refused_not_scored(classifier, tmp_path):
    """Weights that give NaN logits (a head bias here) would still give an argmax: eval_cls printed a top-1 near
    chance, predict_cls 'nan%'. Both refuse in one line naming the checkpoint."""
    data, checkpoint = classifier
    state = torch.load(checkpoint, weights_only=True)
    state['state_dict']['head.bias'][1] = float('nan')
    torch.save(state, tmp_path / 'nan.pth')
    with pytest.raises(CheckpointError, match=rf'{tmp_path / "nan.pth"}: the model gives NaN or infinite logits'):
        eval_cls([*TINY_DEIT, '--checkpoint', str(tmp_path / 'nan.pth'), '--data-dir', str(data), '--workers', '0'])
    result = run_tool('predict_cls.py', [*TINY_DEIT, '--checkpoint', tmp_path / 'nan.pth', val_images(data)[0]])
    assert result.returncode != 0 and 'nan%' not in result.stdout
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f'error: {tmp_path / "nan.pth"}: the model gives NaN or infinite logits for 1 of 1 images')


def test_a_checkpoint_damaged_after_saving_is_named_by_eval_cls_and_predict_cls(classifier, tmp_path):
    """A byte flipped in the file after it was written (torch.load reads it without a word): each tool stops with one
    line naming the file, before any number."""
    data, checkpoint = classifier
    damaged = damaged_copy(checkpoint, tmp_path / 'damaged.pth')
    for tool, args in (('eval_cls.py', ['--data-dir', data, '--workers', '0']),
                       ('predict_cls.py', [val_images(data)[0]])):
        result = run_tool(tool, [*TINY_DEIT, '--checkpoint', damaged, *args])
        assert result.returncode != 0 and 'top1' not in result.stdout and '%' not in result.stdout, tool
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f'error: {damaged}: damaged: ') and 'does not match the checksum (CRC-32)' in line


def test_the_tool_writes_what_the_predictor_gives(classifier, tmp_path):
    data, checkpoint = classifier
    folder = data / 'val' / CLASSES[1]
    succeeded(run_tool('predict_cls.py', [*TINY_DEIT, '--checkpoint', checkpoint, folder, '--img-size', '32',
                                          '--topk', '2', '--json', tmp_path / 'p.json']))
    written = json.loads((tmp_path / 'p.json').read_text())
    expected = ClassPredictor('deit_small_patch16_224', str(checkpoint), img_size=32,
                              model_kwargs=TINY_KWARGS)(sorted(folder.iterdir()), k=2)
    assert [r['image'] for r in written] == [r['image'] for r in expected]
    for got, want in zip(written, expected):
        assert [e['class'] for e in got['top']] == [e['class'] for e in want['top']]
        assert [e['probability'] for e in got['top']] == pytest.approx([e['probability'] for e in want['top']],
                                                                        abs=1e-5)


def test_an_official_release_is_named_with_imagenets_classes(tmp_path):
    torch.manual_seed(0)
    model = timm.create_model('deit_small_patch16_224', num_classes=1000, img_size=32, **TINY_KWARGS)
    torch.save(model.state_dict(), tmp_path / 'release.pth')
    image = tmp_path / 'photo.png'
    cv2.imwrite(str(image), np.full((40, 50, 3), 90, np.uint8))
    predictor = ClassPredictor('deit_small_patch16_224', str(tmp_path / 'release.pth'), img_size=32,
                               model_kwargs=TINY_KWARGS)
    assert predictor.classes[0] == 'n01440764' and predictor.descriptions[0] == 'tench, Tinca tinca'
    (result,) = predictor([image], k=5)
    assert len(result['top']) == 5
    for entry in result['top']:
        assert entry['class'] == predictor.classes[entry['index']]
        assert entry['description'] == timm.data.ImageNetInfo().index_to_description(entry['index'])


def test_predict_cls_names_a_missing_image_and_an_empty_folder(classifier, tmp_path):
    _, checkpoint = classifier
    result = run_tool('predict_cls.py', [*TINY_DEIT, '--checkpoint', checkpoint, tmp_path / 'absent.jpg'])
    assert result.returncode == 2 and f'{tmp_path / "absent.jpg"}: no such image file or folder' in result.stderr
    (tmp_path / 'empty').mkdir()
    result = run_tool('predict_cls.py', [*TINY_DEIT, '--checkpoint', checkpoint, tmp_path / 'empty'])
    assert result.returncode == 2 and f'{tmp_path / "empty"}: a folder without images' in result.stderr


def test_predict_seg_refuses_two_images_that_would_write_one_mask(tmp_path):
    (tmp_path / 'a').mkdir()
    (tmp_path / 'b').mkdir()
    for folder in ('a', 'b'):
        cv2.imwrite(str(tmp_path / folder / 'x.jpg'), np.zeros((8, 8, 3), np.uint8))
    result = run_tool('predict_seg.py', ['seg_configs/upernet_lvvit_s.py', tmp_path / 'none.pth', tmp_path / 'a',
                                         tmp_path / 'b', '--out', tmp_path / 'out'])
    assert result.returncode == 2 and f'{tmp_path / "a" / "x.jpg"} and {tmp_path / "b" / "x.jpg"} would both write' \
        in result.stderr
    assert not (tmp_path / 'out').exists()


def test_predict_seg_names_a_classification_checkpoint(classifier, tmp_path):
    """A classifier's checkpoint is named as one, with the tools that take it (not asked for a data set, then
    refused for every key of the segmentor)."""
    _, checkpoint = classifier
    cv2.imwrite(str(tmp_path / 'x.jpg'), np.zeros((8, 8, 3), np.uint8))
    result = run_tool('predict_seg.py', ['seg_configs/upernet_lvvit_s_own_data.py', checkpoint, tmp_path / 'x.jpg',
                                         '--out', tmp_path / 'out'])
    assert result.returncode == 2 and f'error: {checkpoint} holds an image classifier (vit weights, no decode head), ' \
        'not a segmentor: tools/predict_cls.py and tools/eval_cls.py take it' in result.stderr
    assert 'Traceback' not in result.stderr and not (tmp_path / 'out').exists()


@pytest.mark.parametrize('case', ['gif', 'no gpu'])
def test_predict_seg_names_an_image_opencv_cannot_read_and_a_missing_gpu(tmp_path, case):
    from PIL import Image
    image = tmp_path / ('x.gif' if case == 'gif' else 'x.png')
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(image)
    if case == 'no gpu' and torch.cuda.is_available():
        pytest.skip('a GPU is here')
    result = run_tool('predict_seg.py', ['seg_configs/upernet_lvvit_s.py', tmp_path / 'none.pth', image, '--out',
                                         tmp_path / 'out', *(['--device', 'cuda'] if case == 'no gpu' else [])])
    expected = (f'{image}: OpenCV, the segmentation pipeline\'s decoder, does not read this format' if case == 'gif'
                else '--device cuda: no GPU is visible to PyTorch here')
    assert result.returncode == 2 and f'error: {expected}' in result.stderr and 'Traceback' not in result.stderr
    assert not (tmp_path / 'out').exists()
