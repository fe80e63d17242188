"""tools/export.py: a classification checkpoint as safetensors + timm's config.json (and torch.export's program) that
timm and torch load to the suite's own eval model, with one weight set chosen the same way in every loader."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat

import onnxruntime
import pytest
import timm
import torch
from PIL import Image

import backbones  # noqa: F401  (the suite's models in timm's registry)
from backbones.common.errors import CheckpointError, CheckpointReadError, UsageError
from backbones.common.exporting import EXPORTED_PROGRAM, MARKER, ONNX_MODEL, WEIGHTS
from backbones.token_head import TOKEN_HEAD
from classification.digits.seg_data import EmbeddedPages
from classification.export import export_classifier, main
from classification.models import build_eval_model, create_classifier
from classification.predict import ClassPredictor
from helpers.cls_data import CLASSES, textured_jpegs
from helpers.commands import run_tool, succeeded
from helpers.models import damaged_copy


def export(argv: list[str]):
    """tools/export.py, as the tool calls it."""
    return main(argv, fallback=EmbeddedPages)


TINY_KWARGS = dict(embed_dim=32, depth=2, num_heads=2)
DEIT = 'deit_small_patch16_224'


@pytest.fixture(scope='module')
def checkpoint_with_ema(tiny_deit, tmp_path_factory):
    """A DeiT run's checkpoint (three named classes) as written before the EMA rule: its trained weights as
    `state_dict`, with an EMA copy that differs from them."""
    tmp = tmp_path_factory.mktemp('export')
    checkpoint = torch.load(tiny_deit[1], weights_only=False)
    checkpoint['state_dict'] = checkpoint.pop('state_dict_trained', checkpoint['state_dict'])
    del checkpoint['weights']
    checkpoint['state_dict_ema'] = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v
                                    for k, v in checkpoint['state_dict'].items()}
    torch.save(checkpoint, tmp / 'with_ema.pth')
    return tmp / 'with_ema.pth'


def images(count: int = 3) -> torch.Tensor:
    return torch.randn(count, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def suite_outputs(checkpoint, use_ema: bool, name: str = DEIT, **kwargs) -> torch.Tensor:
    model = build_eval_model(name, str(checkpoint), len(CLASSES), 32, use_ema, kwargs or TINY_KWARGS)
    with torch.no_grad():
        return model(images())


@pytest.mark.parametrize('use_ema', [False, True])
def test_timm_loads_the_export_to_the_suites_model(checkpoint_with_ema, tmp_path, use_ema):
    out = export_classifier(DEIT, str(checkpoint_with_ema), tmp_path / 'deit', use_ema=use_ema,
                            img_size=32, model_kwargs=TINY_KWARGS)
    expected = suite_outputs(checkpoint_with_ema, use_ema)
    assert not torch.allclose(expected, suite_outputs(checkpoint_with_ema, not use_ema))  # two models in one file
    model = timm.create_model(f'local-dir:{out}', pretrained=True).eval()
    # by name, as docs/export.md shows it: the preprocessing in the overlay, or timm's transforms feed 224 px
    config = json.loads((out / 'config.json').read_text())
    by_file = timm.create_model(DEIT, pretrained=True, pretrained_cfg_overlay=dict(
        file=str(out / WEIGHTS), num_classes=len(CLASSES), input_size=tuple(config['pretrained_cfg']['input_size']),
        crop_pct=config['pretrained_cfg']['crop_pct']), num_classes=len(CLASSES), img_size=32, **TINY_KWARGS).eval()
    assert timm.data.resolve_data_config({}, model=by_file)['input_size'] == (3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(images()), expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(by_file(images()), expected, rtol=1e-5, atol=1e-6)
    assert config['label_names'] == list(CLASSES) and config['suite_weights'] == ('ema' if use_ema else 'trained')
    assert config['architecture'] == DEIT and config['model_args']['img_size'] in (32, [32, 32])


def timm_probabilities(folder, image) -> torch.Tensor:
    """An image's class probabilities as a timm user gets them from an export folder: its model, and its
    preprocessing from config.json through timm's resolve_data_config and create_transform."""
    model = timm.create_model(f'local-dir:{folder}', pretrained=True).eval()
    transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))
    with Image.open(image) as img, torch.no_grad():
        return model(transform(img.convert('RGB'))[None])[0].softmax(-1)


@pytest.mark.parametrize('use_ema', [False, True])
def test_the_export_is_at_the_trained_size_and_timms_preprocessing_predicts_as_the_suite(checkpoint_with_ema,
                                                                                       tmp_path, use_ema, caplog):
    """The run trained at 32 px: without --img-size the export is at 32 px and config.json says so, with the crop,
    interpolation, mean, std and class names, so timm's own preprocessing feeds the exported model what
    predict_cls feeds the suite's model (the architecture's 224 px fed it another input). --img-size still wins,
    said in one line."""
    out = export_classifier(DEIT, str(checkpoint_with_ema), tmp_path / 'deit', use_ema=use_ema,
                            model_kwargs=TINY_KWARGS)
    config = json.loads((out / 'config.json').read_text())
    predictor = ClassPredictor(DEIT, str(checkpoint_with_ema), use_ema=use_ema, model_kwargs=TINY_KWARGS)
    cfg = config['pretrained_cfg']
    assert cfg['input_size'] == [3, 32, 32] and config['model_args']['img_size'] in (32, [32, 32])
    assert cfg['num_classes'] == config['num_classes'] == len(CLASSES)
    assert [cfg['crop_pct'], cfg['interpolation'], cfg['mean'], cfg['std']] == [
        predictor.data_config['crop_pct'], predictor.data_config['interpolation'],
        list(predictor.data_config['mean']), list(predictor.data_config['std'])]
    (image,) = textured_jpegs(tmp_path, [(61, 45)])  # resized and cropped by the eval transform
    (result,) = predictor([image], k=len(CLASSES))
    suite = torch.tensor([e['probability'] for e in sorted(result['top'], key=lambda e: e['index'])])
    torch.testing.assert_close(timm_probabilities(out, image), suite, rtol=1e-5, atol=1e-6)
    assert timm.create_model(f'local-dir:{out}').pretrained_cfg['label_names'] == list(CLASSES)
    with caplog.at_level('WARNING', logger='vit_dense'):
        out = export_classifier(DEIT, str(checkpoint_with_ema), tmp_path / 'at48', use_ema=use_ema, img_size=48,
                                model_kwargs=TINY_KWARGS)
    assert caplog.text.count(f'{checkpoint_with_ema} was trained at 32 px; it runs at 48 px here') == 1
    assert json.loads((out / 'config.json').read_text())['pretrained_cfg']['input_size'] == [3, 48, 48]
    at_48 = ClassPredictor(DEIT, str(checkpoint_with_ema), img_size=48, use_ema=use_ema, model_kwargs=TINY_KWARGS)
    (result,) = at_48([image], k=len(CLASSES))
    suite = torch.tensor([e['probability'] for e in sorted(result['top'], key=lambda e: e['index'])])
    torch.testing.assert_close(timm_probabilities(out, image), suite, rtol=1e-5, atol=1e-6)


def tree(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob('*'))}


def test_export_writes_only_into_a_new_or_empty_folder_or_its_own(checkpoint_with_ema, tmp_path):
    """A Hugging Face model folder (config.json, README.md, a sub-folder) was taken for an earlier export and
    replaced whole. Only a folder the export marked as its own is replaced; anything else is one line naming it."""
    hf = tmp_path / 'hf_model'
    (hf / 'onnx').mkdir(parents=True)
    (hf / 'config.json').write_text('{"architecture": "vit_base_patch16_224"}')
    (hf / 'README.md').write_text('my model card')
    (hf / 'onnx' / 'model.onnx').write_bytes(b'weights')
    before = tree(hf)
    args = ['classifier', DEIT, '--checkpoint', str(checkpoint_with_ema), '--model-kwargs',
            *(f'{k}={v}' for k, v in TINY_KWARGS.items())]
    result = run_tool('export.py', [*args, '--out', hf])
    assert result.returncode == 2 and result.stderr.strip().splitlines()[0].startswith(
        f'error: --out {hf} exists and is not an export folder of this suite (no {MARKER})')
    assert tree(hf) == before and sorted(p.name for p in tmp_path.iterdir()) == ['hf_model']
    (tmp_path / 'empty').mkdir()
    for _ in range(2):  # an empty folder, then the export it holds
        out = export([*args, '--out', str(tmp_path / 'empty')])
    marker = json.loads((out / MARKER).read_text())
    assert marker['export'] == 'classifier' and marker['checkpoint'] == str(checkpoint_with_ema)
    assert marker['files'][WEIGHTS] == hashlib.sha256((out / WEIGHTS).read_bytes()).hexdigest()
    assert sorted(marker['files']) == sorted(p.name for p in out.iterdir() if p.name != MARKER)
    mask = os.umask(0)
    os.umask(mask)  # the folder and its files readable as any the user makes (mkdtemp's folder is private)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~mask
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o666 & ~mask}
    # an earlier export the user added files to is not replaced (they would be deleted with it)
    (out / 'my_notes.txt').write_text('results of the run')
    (out / 'sub').mkdir()
    before = tree(out)
    with pytest.raises(UsageError, match=rf'--out {out} is an earlier export with files it did not write '
                                         rf'\(my_notes.txt, sub/\)'):
        export([*args, '--out', str(out)])
    assert tree(out) == before
    shutil.rmtree(out / 'sub')
    (out / 'my_notes.txt').unlink()
    # nor is an export of another kind
    with pytest.raises(UsageError, match=rf'--out {out} holds a classifier export, which this segmentor export '):
        export(['segmentor', 'seg_configs/fcn_lvvit_s.py', str(checkpoint_with_ema), '--out', str(out)])


def test_a_damaged_checkpoint_or_export_is_named_first(checkpoint_with_ema, tmp_path):
    """A checkpoint damaged after saving: the export names the file as the cause (not its own output check) and
    writes nothing; an exported safetensors file damaged later is named when the suite reads it."""
    damaged = damaged_copy(checkpoint_with_ema, tmp_path / 'damaged.pth')
    args = [DEIT, '--model-kwargs', *(f'{k}={v}' for k, v in TINY_KWARGS.items())]
    result = run_tool('export.py', ['classifier', *args, '--checkpoint', damaged, '--out', tmp_path / 'x'])
    (line,) = result.stderr.strip().splitlines()
    assert result.returncode == 2 and line.startswith(f'error: {damaged}: damaged: ') and 'CRC-32' in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ['damaged.pth']
    out = export(['classifier', *args, '--checkpoint', str(checkpoint_with_ema), '--out', str(tmp_path / 'x')])
    weights = damaged_safetensors(out / WEIGHTS)
    with pytest.raises(CheckpointReadError, match=rf'{weights}: damaged: its bytes do not match the SHA-256'):
        ClassPredictor(DEIT, str(weights), model_kwargs=TINY_KWARGS)


def damaged_safetensors(path):
    """`path` with the last byte of its tensor data flipped (safetensors files hold no checksum)."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x7F
    path.write_bytes(bytes(data))
    return path


def test_timm_reads_the_raw_checkpoint_as_the_ema_model_and_the_export_says_which(checkpoint_with_ema, tmp_path):
    """"One file, two models" in a checkpoint from before the EMA rule: timm's loader takes its EMA copy, the suite's
    loaders its `state_dict`, the trained weights; an export holds one set and names it. (The rule's checkpoints hold
    one model for both: test_train_cls.)"""
    model = timm.create_model(DEIT, num_classes=len(CLASSES), img_size=32, **TINY_KWARGS).eval()
    timm.models.load_checkpoint(model, str(checkpoint_with_ema))
    with torch.no_grad():
        torch.testing.assert_close(model(images()), suite_outputs(checkpoint_with_ema, True))
    out = export_classifier(DEIT, str(checkpoint_with_ema), tmp_path / 'deit', img_size=32, model_kwargs=TINY_KWARGS)
    from_export = timm.create_model(f'local-dir:{out}', pretrained=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(from_export(images()), suite_outputs(checkpoint_with_ema, False))


def test_lvvit_with_its_token_head_and_torch_export(tmp_path):
    """LV-ViT trained with token labeling: its eval rule (class token plus the tokens' best) is in the model, so
    timm's rebuilt model and torch.export's program give its outputs, the program at any batch size."""
    kwargs = dict(embed_dim=32, depth=2, num_heads=2, stem_chs=8)
    model = create_classifier('lvvit_s', len(CLASSES), 32, token_labeling=True, **kwargs)
    state = model.model.state_dict() if hasattr(model, 'model') else model.state_dict()
    assert any(k.startswith(f'{TOKEN_HEAD}.') for k in state)
    torch.save({'state_dict': state, 'args': {'classes': CLASSES}}, tmp_path / 'lvvit.pth')
    succeeded(run_tool('export.py', ['classifier', 'lvvit_s', '--checkpoint', tmp_path / 'lvvit.pth', '--out',
                                     tmp_path / 'lv', '--img-size', '32', '--torch-export', '--onnx', '--model-kwargs',
                                     *(f'{k}={v}' for k, v in kwargs.items())]))
    expected = suite_outputs(tmp_path / 'lvvit.pth', False, 'lvvit_s', **kwargs)
    rebuilt = timm.create_model(f'local-dir:{tmp_path / "lv"}', pretrained=True).eval()
    program = torch.export.load(tmp_path / 'lv' / EXPORTED_PROGRAM).module()
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(images()), expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(program(images()), expected, rtol=1e-4, atol=1e-5)
        session = onnxruntime.InferenceSession(str(tmp_path / 'lv' / ONNX_MODEL))
        torch.testing.assert_close(torch.from_numpy(session.run(None, {'images': images(4).numpy()})[0]),
                                   build_eval_model('lvvit_s', str(tmp_path / 'lvvit.pth'), len(CLASSES), 32, False,
                                                    kwargs)(images(4)), rtol=1e-4, atol=1e-4)
        larger = build_eval_model('lvvit_s', str(tmp_path / 'lvvit.pth'), len(CLASSES), 32, False, kwargs)(images(5))
        torch.testing.assert_close(program(images(5)), larger, rtol=1e-4, atol=1e-5)


def test_a_token_head_timm_cannot_rebuild_is_refused(tmp_path):
    """DeiT trained with token labeling predicts through the suite's wrapper (class token plus the token head's best):
    timm would rebuild a plain DeiT that ignores the token head."""
    model = create_classifier(DEIT, len(CLASSES), 32, token_labeling=True, **TINY_KWARGS)
    torch.save({'state_dict': model.model.state_dict()}, tmp_path / 'deit_tl.pth')
    with pytest.raises(UsageError, match='predicts through the suite.s token-head wrapper, which timm cannot rebuild'):
        export(['classifier', DEIT, '--checkpoint', str(tmp_path / 'deit_tl.pth'), '--out', str(tmp_path / 'x'),
                '--img-size', '32', '--model-kwargs', *(f'{k}={v}' for k, v in TINY_KWARGS.items())])
    assert not (tmp_path / 'x').exists() and [p.name for p in tmp_path.iterdir()] == ['deit_tl.pth']


def test_bad_input_is_one_line_and_writes_nothing(checkpoint_with_ema, tmp_path):
    (tmp_path / 'taken').mkdir()
    (tmp_path / 'taken' / 'notes.txt').write_text('mine')
    with pytest.raises(UsageError, match='taken exists and is not an export folder'):
        export(['classifier', DEIT, '--checkpoint', str(checkpoint_with_ema), '--out', str(tmp_path / 'taken')])
    with pytest.raises(CheckpointReadError, match='absent.pth'):
        export(['classifier', DEIT, '--checkpoint', str(tmp_path / 'absent.pth'), '--out', str(tmp_path / 'x')])
    assert sorted(p.name for p in tmp_path.iterdir()) == ['taken']


def test_a_missing_segmentor_checkpoint_is_named_before_any_work(tmp_path):
    """Nothing is written (the embedded pages an ADE20K config falls back to included) for a checkpoint not there."""
    with pytest.raises(CheckpointError, match=f'{tmp_path / "absent.pth"}: checkpoint file not found'):
        export(['segmentor', 'seg_configs/upernet_lvvit_s.py', str(tmp_path / 'absent.pth'), '--out',
                str(tmp_path / 'x'), '--digits-seg-dir', str(tmp_path / 'pages')])
    assert list(tmp_path.iterdir()) == []
    (tmp_path / 'work').mkdir()  # a work dir given for its checkpoint
    with pytest.raises(CheckpointError, match=f'{tmp_path / "work"}: a folder, not a checkpoint file'):
        export(['segmentor', 'seg_configs/upernet_lvvit_s.py', str(tmp_path / 'work'), '--out', str(tmp_path / 'x'),
                '--digits-seg-dir', str(tmp_path / 'pages')])


def test_a_segmentor_export_is_mmsegs_forward_and_gives_predict_segs_masks(tmp_path):
    """The exported window forward is mmseg's encode_decode, in torch.export's program, in onnxruntime and rebuilt from
    the safetensors + config.py; on an image of the window's size, the argmax of the ONNX logits over the pixels
    normalised as export.json says is predict_seg's mask."""
    import cv2
    import numpy as np
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from backbones.dense.config import load_config
    from backbones.dense.export import segmentor_from
    from backbones.dense.predict import SegPredictor
    from helpers.seg_data import write_tiny_ade, write_tiny_config
    data = write_tiny_ade(tmp_path / 'ade', counts=(('training', 1), ('validation', 1)))
    config = write_tiny_config(tmp_path / 'tiny.py', 'upernet_lvvit_s.py', data)
    cfg = load_config(str(config))
    init_default_scope('mmseg')
    cfg.model.backbone.pretrained = None
    model = MODELS.build(cfg.model).eval()
    torch.save({'state_dict': model.state_dict()}, tmp_path / 'seg.pth')
    out = tmp_path / 'exported'
    succeeded(run_tool('export.py', ['segmentor', config, tmp_path / 'seg.pth', '--out', out, '--torch-export',
                                     '--onnx']))
    described = json.loads((out / 'export.json').read_text())
    assert described['input']['size'] == [64, 64] and len(described['classes']) == 150
    x = torch.randn(3, 3, 64, 64)
    with torch.no_grad():
        expected = model.encode_decode(x, [dict(img_shape=(64, 64), ori_shape=(64, 64), pad_shape=(64, 64))] * 3)
        torch.testing.assert_close(torch.export.load(out / EXPORTED_PROGRAM).module()(x), expected,
                                   rtol=1e-4, atol=1e-4)
        rebuilt = segmentor_from(out)
        torch.testing.assert_close(rebuilt.encode_decode(x, [dict(img_shape=(64, 64))] * 3), expected)
        # a folder exported before the suite's packages moved (0.2.0) names the former `segmentation` in its config's
        # custom_imports, and carries no marker: it loads to the same segmentor
        before_move = tmp_path / 'before_move'
        before_move.mkdir()
        for name in (WEIGHTS, 'config.py', 'export.json'):
            (before_move / name).write_bytes((out / name).read_bytes())
        config_text = (before_move / 'config.py').read_text()
        assert "'backbones.dense'" in config_text
        (before_move / 'config.py').write_text(config_text.replace("'backbones.dense'", "'segmentation'"))
        torch.testing.assert_close(segmentor_from(before_move).encode_decode(x, [dict(img_shape=(64, 64))] * 3),
                                   expected)
    session = onnxruntime.InferenceSession(str(out / ONNX_MODEL))
    torch.testing.assert_close(torch.from_numpy(session.run(None, {'images': x.numpy()})[0]), expected,
                               rtol=1e-4, atol=1e-4)
    rng = np.random.default_rng(0)
    image = tmp_path / 'new.png'
    cv2.imwrite(str(image), rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    pixels = cv2.cvtColor(cv2.imread(str(image)), cv2.COLOR_BGR2RGB).astype(np.float32)
    normalised = (pixels - described['input']['mean']) / described['input']['std']
    logits = session.run(None, {'images': normalised.transpose(2, 0, 1)[None].astype(np.float32)})[0]
    assert np.array_equal(logits[0].argmax(0), SegPredictor(str(config), str(tmp_path / 'seg.pth'))(image))
    # any height and width of whole patches: a new image of another size, whole, gives predict_seg's mask
    succeeded(run_tool('export.py', ['segmentor', config, tmp_path / 'seg.pth', '--out', tmp_path / 'any',
                                     '--torch-export', '--dynamic-size']))
    cv2.imwrite(str(image), rng.integers(0, 256, (64, 128, 3), dtype=np.uint8))  # kept whole by the test resize
    pixels = cv2.cvtColor(cv2.imread(str(image)), cv2.COLOR_BGR2RGB).astype(np.float32)
    normalised = ((pixels - described['input']['mean']) / described['input']['std']).transpose(2, 0, 1)[None]
    mask = SegPredictor(str(config), str(tmp_path / 'seg.pth'))(image)
    program = torch.export.load(tmp_path / 'any' / EXPORTED_PROGRAM).module()
    assert np.array_equal(program(torch.from_numpy(normalised.astype(np.float32)))[0].argmax(0).numpy(), mask)
    # the folder is marked as the suite's, with its files' checksums: its weights damaged later are named
    assert json.loads((out / MARKER).read_text())['export'] == 'segmentor'
    damaged_safetensors(out / WEIGHTS)
    with pytest.raises(CheckpointReadError, match=rf'{out / WEIGHTS}: damaged: its bytes do not match the SHA-256'):
        segmentor_from(out)


# ---- a detector exported whole: its best K detections with static shapes


def random_tiny_detector(root, config_name: str):
    """A tiny detector of `config_name`'s kind with random weights on the tiny COCO-format set (three categories),
    its config and a checkpoint of it."""
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from backbones.dense.config import load_config
    from helpers.dense_data import write_tiny_coco, write_tiny_dense_config
    data = write_tiny_coco(root / 'coco')
    config = write_tiny_dense_config(root / 'tiny.py', config_name, data)
    cfg = load_config(str(config))
    cfg.model.num_classes = 3
    init_default_scope('mmseg')
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).eval()
    torch.save({'state_dict': model.state_dict()}, root / 'detector.pth')
    return config, root / 'detector.pth', model, data


@pytest.fixture(scope='module')
def random_detector(tmp_path_factory):
    """A tiny Mask R-CNN with random weights. Its random box head scores each class about 1/4, so every proposal
    gives candidates above the score threshold and NMS has boxes of one class to suppress."""
    return random_tiny_detector(tmp_path_factory.mktemp('detector'), 'maskrcnn_lvvit_s_own_data.py')


def detector_input(model, data, count: int = 1, sizes=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Images of the tiny COCO set resized to `sizes` (height, width; default 64x64, a size the detector takes whole:
    multiples of 32), RGB, normalised as the config's data preprocessor (and export.json) say, each at the top left
    of a 64x64 input padded with zeros; and their sizes (count, 2), the exported detector's `image_sizes`."""
    import cv2
    paths = sorted((data / 'val').glob('*.jpg'))[:count]
    sizes = torch.tensor(sizes or [(64, 64)] * count)
    images = torch.zeros(count, 3, 64, 64)
    for number, (path, (height, width)) in enumerate(zip(paths, sizes.tolist())):
        pixels = cv2.resize(cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB), (width, height))
        mean, std = (value.reshape(3, 1, 1) for value in (model.data_preprocessor.mean, model.data_preprocessor.std))
        normalised = (torch.from_numpy(pixels).permute(2, 0, 1).float() - mean) / std
        images[number, :, :height, :width] = normalised
    return images, sizes


def predicted(model, images: torch.Tensor, sizes: torch.Tensor) -> list:
    """The model's own `predict` of the images (img_shape and ori_shape their `sizes`, the batch padded)."""
    from mmengine.structures import BaseDataElement
    samples = [BaseDataElement(metainfo=dict(img_shape=size, ori_shape=size)) for size in map(tuple, sizes.tolist())]
    with torch.no_grad():
        return [sample.pred_instances for sample in model(images, samples, mode='predict')]


def raw_detections(model, images: torch.Tensor, sizes: torch.Tensor) -> list[dict]:
    """The RoI heads' detections before `predicted`: boxes, scores, labels (from 1), masks (N, 1, 28, 28)."""
    from torchvision.models.detection.image_list import ImageList
    with torch.no_grad():
        features = model.extract_feat(images)
        listed = ImageList(images, [tuple(size) for size in sizes.tolist()])
        proposals, _ = model.rpn(listed, features)
        return model.roi_heads(features, proposals, listed.image_sizes)[0]


def assert_the_models_detections(outputs, model, images: torch.Tensor, sizes: torch.Tensor, top_k: int) -> None:
    """Exported outputs (boxes, scores, labels, masks) are the model's predict of each image padded to `top_k`: the
    same detections in the same order within 1e-4, masks the pasted probabilities (predict's boolean masks where they
    are 0.5 or more) on the image's pixels and zero on the rest of the input, the rest padding (label -1, zeros)."""
    from torchvision.models.detection.roi_heads import paste_masks_in_image
    boxes, scores, labels, masks = (torch.as_tensor(o) for o in outputs)
    assert boxes.shape == (len(images), top_k, 4) and masks.shape == (len(images), top_k, *images.shape[-2:])
    for number, (found, raw) in enumerate(zip(predicted(model, images, sizes), raw_detections(model, images, sizes))):
        height, width = sizes[number].tolist()
        count = min(len(found.scores), top_k)
        torch.testing.assert_close(boxes[number, :count], found.bboxes[:count], rtol=0, atol=1e-4)
        torch.testing.assert_close(scores[number, :count], found.scores[:count], rtol=0, atol=1e-4)
        assert torch.equal(labels[number, :count], found.labels[:count])
        inside = masks[number, :count, :height, :width]
        probabilities = paste_masks_in_image(raw['masks'][:count], raw['boxes'][:count], (height, width))
        torch.testing.assert_close(inside, probabilities[:, 0], rtol=0, atol=1e-4)
        outside = torch.ones(masks.shape[-2:], dtype=torch.bool)
        outside[:height, :width] = False
        assert not masks[number, :count][:, outside].any()
        clear = (inside - 0.5).abs() > 1e-4
        assert torch.equal((inside >= 0.5)[clear], found.masks[:count][clear])
        assert (labels[number, count:] == -1).all() and not boxes[number, count:].any()
        assert not scores[number, count:].any() and not masks[number, count:].any()


def test_the_static_detector_gives_the_models_detections_in_order_nms_included(random_detector):
    """On an image of the tiny COCO set: the static inference equals predict, padded to K = 100 (more than the
    60 class candidates of its 20 proposals) and cut to K = 5. The image has many detections, and the RoI heads'
    NMS removes some of them (without it, more are left): an export that skipped NMS, or ordered its detections
    otherwise, would fail."""
    from backbones.dense.instances.static_detection import StaticMaskRCNN
    _, _, model, data = random_detector
    images, sizes = detector_input(model, data)
    found = predicted(model, images, sizes)[0]
    assert len(found.scores) >= 10 and len(set(found.labels.tolist())) == 3
    nms_thresh = model.roi_heads.nms_thresh
    try:
        model.roi_heads.nms_thresh = 1.0  # no IoU is above 1: nothing suppressed
        assert len(predicted(model, images, sizes)[0].scores) > len(found.scores)
    finally:
        model.roi_heads.nms_thresh = nms_thresh
    for top_k in (100, 5):
        with torch.no_grad():
            outputs = StaticMaskRCNN(model, top_k).eval()(images, sizes)
        assert_the_models_detections(outputs, model, images, sizes, top_k)


def test_an_image_smaller_than_the_input_gets_the_models_test_of_it(random_detector):
    """Images of 40x64 and 64x24 at the top left of 64x64 inputs, their sizes given: the model's predict of them
    (proposals and boxes clipped to the image, masks on its pixels). Without their sizes (the input's, as the export
    took before), the detections are the padded input's, another answer."""
    from backbones.dense.instances.static_detection import StaticMaskRCNN
    _, _, model, data = random_detector
    images, sizes = detector_input(model, data, 2, [(40, 64), (64, 24)])
    network = StaticMaskRCNN(model, 20).eval()
    with torch.no_grad():
        assert_the_models_detections(network(images, sizes), model, images, sizes, 20)
        boxes = network(images, torch.tensor([[64, 64], [64, 64]]))[0]
    assert boxes[0, :, 3].max() > 40 and boxes[1, :, 2].max() > 24  # boxes reach into the padding


def test_the_static_cascade_gives_the_models_detections(tmp_path):
    """A tiny Cascade Mask R-CNN with random weights: its static inference (three stages chained on clipped boxes,
    their mean probabilities) equals its predict, padded to K = 100 and cut to K = 5."""
    _, _, model, data = random_tiny_detector(tmp_path, 'cascade_maskrcnn_lvvit_s.py')
    images, sizes = detector_input(model, data, 2, [(64, 64), (48, 56)])
    assert len(predicted(model, images, sizes)[0].scores) >= 5
    for top_k in (100, 5):
        with torch.no_grad():
            outputs = model.static_network(model, top_k).eval()(images, sizes)
        assert_the_models_detections(outputs, model, images, sizes, top_k)


def test_the_static_paste_is_torchvisions():
    """Masks pasted with static shapes equal torchvision's `paste_masks_in_image` (integer crops and a resize per
    box): boxes inside, across the image's edges (torchvision's paste fails on boxes wholly outside it to the left
    or top, which the detector's clipped boxes never are), fractional, thinner than a pixel, on its right edge."""
    from torchvision.models.detection.roi_heads import paste_masks_in_image

    from backbones.dense.instances.static_detection import pasted
    generator = torch.Generator().manual_seed(2)
    corners = torch.rand(40, 2, generator=generator) * torch.tensor([70.0, 54.0]) - 10
    sides = torch.rand(40, 2, generator=generator) * 40 + 11
    boxes = torch.cat([corners, corners + sides], dim=1)
    boxes[0] = torch.tensor([10.0, 10.0, 10.3, 30.0])  # thinner than a pixel
    boxes[1] = torch.tensor([64.0, 5.0, 64.0, 20.0])  # clipped to the right edge: no width
    boxes[2] = torch.tensor([0.0, 0.0, 64.0, 48.0])  # the whole image
    masks = torch.rand(40, 28, 28, generator=generator)
    expected = paste_masks_in_image(masks[:, None], boxes, (48, 64))[:, 0]
    got = pasted(masks, boxes, (48, 64))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert expected[2].min() > 0 and expected[0].any() and (expected > 0).sum((1, 2)).unique().numel() > 20


def test_nms_over_a_batch_keeps_what_torchvision_keeps_per_image():
    """One `nms` call over three images' candidates, per group, among the valid ones: what torchvision's
    `batched_nms` keeps of each image's valid candidates."""
    from torchvision.ops import batched_nms

    from backbones.dense.instances.static_detection import nms_kept
    generator = torch.Generator().manual_seed(3)
    corners = torch.rand(3, 300, 2, generator=generator) * 60
    boxes = torch.cat([corners, corners + 4 + torch.rand(3, 300, 2, generator=generator) * 20], dim=-1)
    scores = torch.rand(3, 300, generator=generator)
    groups = torch.randint(0, 4, (3, 300), generator=generator)
    valid = torch.rand(3, 300, generator=generator) > 0.2
    kept = nms_kept(boxes, scores, groups, valid, 0.5)
    for image in range(3):
        index = valid[image].nonzero()[:, 0]
        expected = torch.zeros(300, dtype=torch.bool)
        expected[index[batched_nms(boxes[image, index], scores[image, index], groups[image, index], 0.5)]] = True
        assert torch.equal(kept[image], expected)
        assert 0 < expected.sum() < valid[image].sum()  # some suppressed


@pytest.mark.slow  # the tool end to end, both exports checked in its own process
def test_a_whole_detector_export_in_onnx_and_torch_export_gives_the_models_detections(random_detector, tmp_path):
    """tools/export.py segmentor on a detector: by default the whole detector; its ONNX (onnxruntime) and
    torch.export files give the model's predict on images of the tiny COCO set, at batch sizes 1 and 2; export.json
    says what the outputs are and what padding looks like (--pyramid-only: test_instances_and_depth)."""
    config, checkpoint, model, data = random_detector
    out = tmp_path / 'whole'
    succeeded(run_tool('export.py', ['segmentor', config, checkpoint, '--out', out, '--size', '64', '64', '--onnx',
                                     '--torch-export', '--top-k', '20']))
    described = json.loads((out / 'export.json').read_text())
    assert described['network'] == 'detector' and described['top_k'] == 20
    assert described['outputs'] == ['boxes', 'scores', 'labels', 'masks'] and 'label -1' in described['padding']
    assert described['inputs'] == ['images', 'image_sizes'] and 'top left' in described['image_sizes']
    assert described['classes'] == ['cat', 'dog', 'bird'] and described['input']['size'] == [64, 64]
    session = onnxruntime.InferenceSession(str(out / ONNX_MODEL))
    program = torch.export.load(out / EXPORTED_PROGRAM).module()
    for count, sizes in ((1, None), (2, [(64, 64), (40, 56)])):
        images, sizes = detector_input(model, data, count, sizes)
        assert [o.name for o in session.get_outputs()] == described['outputs']
        inputs = {'images': images.numpy(), 'image_sizes': sizes.numpy()}
        assert_the_models_detections(session.run(None, inputs), model, images, sizes, 20)
        with torch.no_grad():
            assert_the_models_detections(program(images, sizes), model, images, sizes, 20)


def test_a_top_k_above_the_detections_the_detector_can_give_is_refused(random_detector, tmp_path):
    """The tiny detector gives at most 60 detections (20 proposals x 3 classes): --top-k 61 is refused in one line,
    nothing written (a --top-k of 100000 made 100000 masks of the input's size, almost all padding); 60 exports."""
    config, checkpoint, _, _ = random_detector
    base = ['segmentor', str(config), str(checkpoint), '--size', '64', '64']
    with pytest.raises(UsageError, match=r'^--top-k 61: the detector gives at most 60 detections an image \(its '
                                         r'RPN.s 20 proposals x 3 classes\); give 60 or fewer$'):
        export([*base, '--out', str(tmp_path / 'x'), '--top-k', '61'])
    assert not (tmp_path / 'x').exists()
    export([*base, '--out', str(tmp_path / 'y'), '--top-k', '60'])
    assert json.loads((tmp_path / 'y' / 'export.json').read_text())['top_k'] == 60


@pytest.mark.slow  # the tool run once for its one-line error
def test_a_detectors_export_options_are_refused_in_one_line_before_any_work(random_detector, tmp_path, capsys):
    """--top-k 0, --top-k with --pyramid-only, either on a segmentor's config, --dynamic-size for the whole
    detector: one line each, nothing written."""
    from helpers.commands import one_line_error
    config, checkpoint, _, _ = random_detector
    base = ['segmentor', str(config), str(checkpoint), '--out', str(tmp_path / 'x'), '--size', '64', '64']
    with pytest.raises(SystemExit):
        export([*base, '--top-k', '0'])
    assert 'argument --top-k: ' in capsys.readouterr().err.strip().splitlines()[-1]
    assert one_line_error(run_tool('export.py', [*base, '--top-k', '5', '--pyramid-only'])).startswith(
        'error: --top-k: the number of detections of a whole detector\'s export; --pyramid-only exports no detections')
    with pytest.raises(UsageError, match='--dynamic-size: a whole detector is exported at one input size'):
        export([*base, '--torch-export', '--dynamic-size'])
    for option in (['--top-k', '5'], ['--pyramid-only']):
        with pytest.raises(UsageError, match=rf'{option[0]}: an option of a detector.s export; '
                                             r'seg_configs/upernet_lvvit_s.py is a semantic segmentation config'):
            export(['segmentor', 'seg_configs/upernet_lvvit_s.py', str(checkpoint), '--out', str(tmp_path / 'x'),
                    '--digits-seg-dir', str(tmp_path / 'pages'), *option])
    assert sorted(p.name for p in tmp_path.iterdir()) == []
