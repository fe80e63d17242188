"""DINOv2's linear segmentation of frozen features (seg_configs/linear_*.py, backbones/dense/semantic/linear_head.py)
checked against its definition, computed here another way: the frozen backbone's chosen blocks through the model's
final norm, concatenated ("+ms": the last four, in order), a batch norm and a 1x1 convolution, logits upsampled
bilinearly to the image; DINOv2's schedule and test scales in every linear config. And Pascal VOC 2012 in its
published layout (backbones/dense/semantic/pascal.py): palette PNGs read as class indices, refusals in one line, the
embedded pages written in it, a linear config trained and tested on it through the tools."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.registry import init_default_scope
from PIL import Image

import backbones.dense  # noqa: F401  (first: it lets mmseg import on mmcv-lite; registers the suite's modules)

# isort: split
from mmseg.registry import DATASETS, MODELS

from backbones import create_model
from backbones.common.errors import DataError, UsageError
from backbones.dense.backbone import TokenBackbone
from backbones.dense.data_check import check_dataset
from backbones.dense.layouts import SmallDenseData, layout_of
from backbones.dense.semantic.pascal import VOC_PALETTE, PascalVOCLayout
from backbones.dense.tasks import TASKS
from helpers.commands import run_tool, succeeded
from helpers.models import hooked_block_outputs
from helpers.seg_data import CONFIGS, TINY_MODELS, tiny_config, write_tiny_config

TINY = TINY_MODELS['upernet_lvvit_s.py']
LINEAR_CONFIGS = sorted(path.name for path in CONFIGS.glob('linear_*.py'))
DINOV2_RATIOS = [1.0, 1.32, 1.73, 2.28, 3.0]  # its "+ms" test: these times the single-scale size, each mirrored
SEMANTIC = TASKS['semantic']
SIZE = (40, 32)  # width, height of the VOC fixtures' images


@pytest.fixture(autouse=True, scope='module')
def mmseg_scope():
    init_default_scope('mmseg')


def normed_block_outputs(model: torch.nn.Module, images: torch.Tensor, blocks: list[int]) -> list[torch.Tensor]:
    """The model's final norm of the outputs of `blocks` (hooks on the classifier's own forward), patch tokens as
    (B, D, h, w) maps."""
    side = images.shape[-1] // 16
    with torch.no_grad():
        return [model.norm(out)[:, -side * side:].transpose(1, 2).reshape(len(images), -1, side, side)
                for out in hooked_block_outputs(model, images, blocks)]


@pytest.mark.parametrize('blocks', [[3], [0, 1, 2, 3]])  # "lin.": the last block; "+ms": the last four
def test_the_linear_head_is_a_batch_norm_and_a_1x1_convolution_of_the_final_normed_blocks(blocks):
    torch.manual_seed(0)
    classifier = create_model('lvvit_s', img_size=64, num_classes=0, **TINY).eval()
    backbone = TokenBackbone('lvvit_s', out_indices=blocks, img_size=64, frozen=True, final_norm=True,
                             model_kwargs=TINY)
    backbone.model.load_state_dict(classifier.state_dict(), strict=False)
    dim = TINY['embed_dim'] * len(blocks)
    head = MODELS.build(dict(type='LinearHead', in_channels=[TINY['embed_dim']] * len(blocks),
                             in_index=list(range(len(blocks))), channels=dim, num_classes=5, dropout_ratio=0)).eval()
    bn = head.bn
    bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2), bn.weight.data.uniform_(0.5, 2)
    images = torch.randn(2, 3, 64, 64)

    maps = backbone(images)
    expected_maps = normed_block_outputs(classifier, images, blocks)
    assert len(maps) == len(blocks)
    for got, want in zip(maps, expected_maps):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    features = torch.cat(expected_maps, 1)  # concatenated in the blocks' order
    normalised = ((features - bn.running_mean[:, None, None]) / torch.sqrt(bn.running_var[:, None, None] + bn.eps)
                  * bn.weight[:, None, None] + bn.bias[:, None, None])
    conv = head.conv_seg
    logits = torch.einsum('kc,bchw->bkhw', conv.weight[:, :, 0, 0], normalised) + conv.bias[:, None, None]
    with torch.no_grad():
        torch.testing.assert_close(head(list(maps)), logits, rtol=1e-5, atol=1e-5)
    assert head.dropout is None  # no dropout before the linear layer


def test_the_segmentors_logits_are_the_heads_upsampled_bilinearly_to_the_image():
    cfg = tiny_config('linear_lvvit_s.py')
    cfg.model.test_cfg = dict(mode='whole')
    model = MODELS.build(cfg.model).eval()
    from mmseg.structures import SegDataSample

    images = [torch.randint(0, 255, (3, 70, 90), dtype=torch.uint8)]
    samples = [SegDataSample(metainfo=dict(img_shape=(70, 90), ori_shape=(70, 90)))]
    data = model.data_preprocessor(dict(inputs=images, data_samples=samples), training=False)
    with torch.no_grad():
        logits = model.decode_head(model.backbone(data['inputs']))
        result = model.predict(**data)[0]
    assert logits.shape[-2:] == (5, 6)  # stride 16 of the 70x90 image
    upsampled = F.interpolate(logits, size=(70, 90), mode='bilinear', align_corners=False)[0]
    torch.testing.assert_close(result.seg_logits.data, upsampled)


@pytest.mark.parametrize('config', LINEAR_CONFIGS)
def test_every_linear_config_is_dinov2s_protocol(config):
    cfg = Config.fromfile(CONFIGS / config)
    backbone, head = cfg.model.backbone, cfg.model.decode_head
    depth = 12 if 'dinov2' in config else 16
    blocks = 4 if config.startswith('linear_ms') else 1
    assert backbone.frozen is True and backbone.final_norm is True and backbone.drop_path_rate == 0
    assert tuple(backbone.out_indices) == tuple(range(depth - blocks, depth))
    assert cfg.model.get('neck') is None and cfg.model.get('auxiliary_head') is None
    assert head.type == 'LinearHead' and head.dropout_ratio == 0 and head.in_index == list(range(blocks))
    assert head.channels == sum(head.in_channels) == 384 * blocks
    assert cfg.optim_wrapper.optimizer == dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=1e-4)
    assert cfg.train_cfg.max_iters == 40000
    warmup, decay = cfg.param_scheduler
    assert (warmup.type, warmup.start_factor, warmup.end) == ('LinearLR', 1e-6, 1500)
    assert (decay.type, decay.power, decay.eta_min, decay.end) == ('PolyLR', 1.0, 0.0, 40000)
    if blocks == 4:  # +ms: DINOv2's ratios of the single-scale size, each with its mirror image
        single = next(step['scale'] for step in cfg.test_dataloader.dataset.pipeline if step['type'] == 'Resize')
        tta = next(step for step in cfg.tta_pipeline if step['type'] == 'TestTimeAug')
        assert [step['scale'] for step in tta['transforms'][0]] == [
            (int(single[0] * r), int(single[1] * r)) for r in DINOV2_RATIOS]
        assert cfg.tta_model.flip is True


def test_a_linear_head_with_a_hidden_width_is_refused():
    with pytest.raises(UsageError, match='channels must be the sum of in_channels, 64, got 32'):
        MODELS.build(dict(type='LinearHead', in_channels=[32, 32], in_index=[0, 1], channels=32, num_classes=3))


VOC_NAMES = ['2007_000032', '2007_000039']


def write_palette_mask(path: Path, values: np.ndarray) -> None:
    """A mask as VOC publishes it: a palette PNG whose indices are the classes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mask = Image.fromarray(values.astype(np.uint8), mode='P')
    mask.putpalette(VOC_PALETTE)
    mask.save(path)


def voc_mask(seed: int) -> np.ndarray:
    """Background, a square of one of the 20 classes and its 255 boundary."""
    rng = np.random.default_rng(seed)
    mask = np.zeros(SIZE[::-1], np.uint8)
    mask[8:24, 10:30] = 255
    mask[10:22, 12:28] = rng.integers(1, 21)
    return mask


def write_voc(root: Path, splits=(('train', VOC_NAMES), ('val', VOC_NAMES[:1]))) -> Path:
    rng = np.random.default_rng(0)
    for split, names in splits:
        for i, name in enumerate(names):
            mask = voc_mask(i)
            image = np.where(mask[..., None] == 0, 40, 200).astype(np.uint8) + rng.integers(0, 20, (*mask.shape, 3))
            (root / 'JPEGImages').mkdir(parents=True, exist_ok=True)
            Image.fromarray(image.astype(np.uint8)).save(root / 'JPEGImages' / f'{name}.jpg', quality=95)
            write_palette_mask(root / 'SegmentationClass' / f'{name}.png', mask)
        split_file = root / 'ImageSets' / 'Segmentation' / f'{split}.txt'
        split_file.parent.mkdir(parents=True, exist_ok=True)
        split_file.write_text(''.join(f'{name}\n' for name in names))
    return root


def voc_dataset(root: Path, config: str = 'linear_lvvit_s_pascal_voc12.py') -> dict:
    """The training set of a VOC config, read from `root`."""
    dataset = Config.fromfile(CONFIGS / config).train_dataloader.dataset.to_dict()
    return {**dataset, 'data_root': str(root)}


def test_voc_palette_masks_load_as_their_class_indices(tmp_path):
    dataset = voc_dataset(write_voc(tmp_path))
    assert isinstance(layout_of(dataset), PascalVOCLayout)
    assert check_dataset(dataset, SEMANTIC) == ([0, 1], [])
    built = DATASETS.build({**dataset, 'pipeline': [dict(type='LoadAnnotations')]})
    assert len(built.metainfo['classes']) == 21 and built.metainfo['classes'][0] == 'background'
    for i in range(2):
        assert np.array_equal(built[i]['gt_seg_map'], voc_mask(i))  # indices as stored, 255 kept as ignored


def refusal(dataset: dict) -> str:
    with pytest.raises(DataError) as error:
        check_dataset(dataset, SEMANTIC)
    assert '\n' not in str(error.value)
    return str(error.value)


def test_voc_refusals_name_the_file_and_the_layout(tmp_path):
    root = write_voc(tmp_path)
    dataset = voc_dataset(root)
    mask = root / 'SegmentationClass' / f'{VOC_NAMES[1]}.png'
    write_palette_mask(mask, np.full(SIZE[::-1], 21))
    assert f'annotation {mask} has label values 21 beyond the 21 classes' in refusal(dataset)
    mask.unlink()
    assert f'1 of 2 images have no annotation, e.g. {root}/JPEGImages/{VOC_NAMES[1]}.jpg' in refusal(dataset)
    (root / 'ImageSets' / 'Segmentation' / 'train.txt').unlink()
    message = refusal(dataset)
    assert message.startswith(f'{root}/ImageSets/Segmentation/train.txt: no such split file (Pascal VOC 2012\'s '
                              'layout: JPEGImages/*.jpg, SegmentationClass/*.png')
    assert 'VOCtrainval_11-May-2012.tar' in message


@pytest.mark.parametrize('config', ['linear_lvvit_s_pascal_voc12.py', 'linear_lvvit_s_pascal_voc12_aug.py'])
def test_the_pages_written_in_voc_layout_read_back_as_the_pages(tmp_path, config):
    root = tmp_path / 'pages'
    rng = np.random.default_rng(1)
    for split, count in (('training', 3), ('validation', 2)):
        for i in range(count):
            (root / 'images' / split).mkdir(parents=True, exist_ok=True)
            (root / 'annotations' / split).mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (*SIZE[::-1], 3), dtype=np.uint8)).save(
                root / 'images' / split / f'page_{split}_{i}.jpg')
            Image.fromarray(rng.integers(0, 4, SIZE[::-1]).astype(np.uint8)).save(
                root / 'annotations' / split / f'page_{split}_{i}.png')
    (root / 'READY').write_text('pages v1\n')
    pages = SmallDenseData(root, ('background', 'one', 'two'), ((0, 0, 0), (255, 0, 0), (0, 255, 0)), SIZE, 0.5,
                           (1.0, 1.0), (1.0,), 1000, mirrored=False)
    cfg = Config.fromfile(CONFIGS / config)
    SEMANTIC.use_small_data(cfg, pages)
    for loader, split in (('train_dataloader', 'training'), ('val_dataloader', 'validation')):
        dataset = cfg[loader].dataset.to_dict()
        assert isinstance(layout_of(dataset), PascalVOCLayout)
        assert check_dataset(dataset, SEMANTIC)[1] == []
        built = DATASETS.build({**dataset, 'pipeline': [dict(type='LoadAnnotations')]})
        assert len(built) == len(list((root / 'images' / split).glob('*.jpg')))  # every page, VOC's or SBD's part
        for i in range(len(built)):
            entry = built.get_data_info(i)
            with Image.open(entry['seg_map_path']) as written:  # SBD's part: grayscale class indices
                sbd = 'SegmentationClassAug' in entry['seg_map_path']
                assert (written.mode, written.getpalette() and written.getpalette()[:9]) == \
                    (('L', None) if sbd else ('P', VOC_PALETTE[:9]))
            page = np.asarray(Image.open(root / 'annotations' / split / Path(entry['seg_map_path']).name))
            assert np.array_equal(built[i]['gt_seg_map'], np.where(page == 0, 255, page.astype(int) - 1))


SBD_NAMES = ['2008_000002', '2008_000003', '2007_000032']  # the last also in VOC's train.txt, with a mask of its own


def write_sbd(root: Path) -> Path:
    """SBD's part as mmseg's voc_aug.py writes it beside VOC's: JPEGs, class-index masks (grayscale, no boundary) in
    SegmentationClassAug, and aug.txt listing the SBD images in neither VOC split."""
    for i, name in enumerate(SBD_NAMES):
        Image.fromarray(np.full((*SIZE[::-1], 3), 90 + 40 * i, np.uint8)).save(root / 'JPEGImages' / f'{name}.jpg')
        (root / 'SegmentationClassAug').mkdir(exist_ok=True)
        Image.fromarray(np.full(SIZE[::-1], 3 + i, np.uint8), mode='L').save(
            root / 'SegmentationClassAug' / f'{name}.png')
    (root / 'ImageSets' / 'Segmentation' / 'aug.txt').write_text(''.join(f'{name}\n' for name in SBD_NAMES[:2]))
    return root


def test_the_sbd_training_set_is_vocs_images_with_vocs_masks_then_sbds_with_theirs(tmp_path):
    root = write_sbd(write_voc(tmp_path))
    dataset = voc_dataset(root, 'linear_lvvit_s_pascal_voc12_aug.py')
    assert type(layout_of(dataset)).__name__ == 'PascalVOCAugLayout'
    assert check_dataset(dataset, SEMANTIC)[1] == []
    built = DATASETS.build({**dataset, 'pipeline': [dict(type='LoadAnnotations')]})
    assert [Path(built.get_data_info(i)['img_path']).stem for i in range(len(built))] == VOC_NAMES + SBD_NAMES[:2]
    for i in range(2):  # 2007_000032's own VOC mask, not the one SBD has for it
        assert np.array_equal(built[i]['gt_seg_map'], voc_mask(i))
    for i in range(2):
        assert np.array_equal(built[2 + i]['gt_seg_map'], np.full(SIZE[::-1], 3 + i))
    val = Config.fromfile(CONFIGS / 'linear_lvvit_s_pascal_voc12_aug.py').val_dataloader.dataset
    assert val.type == 'PascalVOCIdsDataset' and val.ann_file == 'ImageSets/Segmentation/val.txt'


def test_sbd_refusals_name_the_file_and_mmsegs_converter(tmp_path):
    root = write_sbd(write_voc(tmp_path))
    dataset = voc_dataset(root, 'linear_lvvit_s_pascal_voc12_aug.py')
    split = root / 'ImageSets' / 'Segmentation' / 'aug.txt'
    split.write_text(''.join(f'{name}\n' for name in SBD_NAMES))
    with pytest.raises(DataError, match=f'{split} lists 1 image.* of .*train.txt too, e.g. 2007_000032: each would '
                                        'be trained on twice'):
        DATASETS.build({**dataset, 'pipeline': []})
    (root / 'SegmentationClassAug' / f'{SBD_NAMES[1]}.png').unlink()
    assert f'no annotation, e.g. {root}/JPEGImages/{SBD_NAMES[1]}.jpg' in refusal(dataset)
    split.unlink()
    message = refusal(dataset)
    assert message.startswith(f'{split}: no such split file') and 'voc_aug.py' in message
    shutil.rmtree(root / 'SegmentationClassAug')
    assert refusal(dataset).startswith(f'{root}/SegmentationClassAug: no such folder')


@pytest.mark.slow  # two tool runs
def test_a_linear_config_trains_on_voc_with_a_frozen_backbone_and_tests_through_the_tools(tmp_path):
    root = write_voc(tmp_path / 'voc')
    config = write_tiny_config(tmp_path / 'tiny.py', 'linear_lvvit_s_pascal_voc12.py', root)
    work = tmp_path / 'work'
    succeeded(run_tool('train_seg.py', [config, '--work-dir', work, '--iters', '2']))
    checkpoint = work / 'iter_2.pth'
    state = torch.load(checkpoint, weights_only=False)['state_dict']
    assert 'backbone.model.norm.weight' in state and not any(key.startswith('neck.') for key in state)
    result = run_tool('test_seg.py', [config, checkpoint, '--work-dir', tmp_path / 'test'])
    succeeded(result)
    assert 'mIoU' in result.stdout + result.stderr
