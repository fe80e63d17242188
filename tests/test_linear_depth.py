"""DINOv2's depth protocols on a frozen encoder (seg_configs/depth_linear*.py, depth_frozen*.py;
backbones/dense/depth/head.py LinearDepthHead) checked against their definitions computed here another way: each
chosen block's patch tokens beside its class token (no final norm), upsampled 4x and concatenated, a 1x1 convolution
to 256 scores, their "linear" distribution (relu + 0.1, normalised) over 256 bins evenly spaced from 0.001 m to
max_depth; and a linear config trained, tested and used to predict through the tools."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.registry import init_default_scope

import backbones.dense  # noqa: F401  (first: it lets mmseg import on mmcv-lite; registers the suite's modules)

# isort: split
from mmseg.registry import MODELS

from backbones import create_model
from backbones.common.errors import UsageError
from backbones.dense.backbone import TokenBackbone
from helpers.commands import run_tool, succeeded
from helpers.dense_data import write_tiny_dense_config, write_tiny_nyu
from helpers.models import hooked_block_outputs
from helpers.seg_data import CONFIGS, TINY_MODELS

TINY = TINY_MODELS['upernet_lvvit_s.py']
LINEAR_DEPTH = sorted(path.name for path in CONFIGS.glob('depth_linear*.py'))
FROZEN_DPT = sorted(path.name for path in CONFIGS.glob('depth_frozen*.py'))


@pytest.fixture(autouse=True, scope='module')
def mmseg_scope():
    init_default_scope('mmseg')


@pytest.mark.parametrize('blocks', [[3], [0, 1, 2, 3]])  # "lin. 1" and "lin. 4"
def test_the_linear_depth_head_is_dinov2s_classification_over_depth_bins(blocks):
    torch.manual_seed(0)
    classifier = create_model('lvvit_s', img_size=64, num_classes=0, **TINY).eval()
    backbone = TokenBackbone('lvvit_s', out_indices=blocks, img_size=64, frozen=True, class_token=True,
                             model_kwargs=TINY)
    backbone.model.load_state_dict(classifier.state_dict(), strict=False)
    dim = TINY['embed_dim']
    head = MODELS.build(dict(type='LinearDepthHead', in_channels=[2 * dim] * len(blocks), max_depth=80.0)).eval()
    images = torch.randn(2, 3, 64, 64)

    features = []
    for tokens in hooked_block_outputs(classifier, images, blocks):  # (B, 1 + 16, D): the class token, then 4x4 patches
        patches = tokens[:, 1:].transpose(1, 2).reshape(2, dim, 4, 4)
        joined = torch.cat([patches, tokens[:, :1].transpose(1, 2)[..., None].expand(2, dim, 4, 4)], 1)
        features.append(F.interpolate(joined, size=(16, 16), mode='bilinear', align_corners=False))
    with torch.no_grad():
        scores = F.conv2d(torch.cat(features, 1), head.depth_layer.weight, head.depth_layer.bias).numpy()
    weights = np.maximum(scores, 0) + 0.1
    weights /= weights.sum(1, keepdims=True)
    bins = 0.001 + np.arange(256) * (80.0 - 0.001) / 255
    expected = (weights * bins[None, :, None, None]).sum(1, keepdims=True)
    with torch.no_grad():
        depth = head(list(backbone(images)))
    assert depth.shape == (2, 1, 16, 16)  # stride 4: the maps' stride 16 upsampled 4 times
    np.testing.assert_allclose(depth.numpy(), expected, rtol=1e-5)
    assert 0.001 <= depth.min() and depth.max() <= 80.0


@pytest.mark.parametrize('model_name, kwargs', [
    ('cait_s24_224', TINY_MODELS['upernet_cait_s24.py']),  # its class token joins after the blocks
    ('vit_medium_patch16_gap_256', TINY_MODELS['upernet_deit_s.py']),  # no class token
    ('vit_medium_patch16_reg1_gap_256', TINY_MODELS['upernet_deit_s.py'])])  # a register, but no class token
def test_a_model_whose_blocks_carry_no_class_token_is_refused_when_built(model_name, kwargs):
    with pytest.raises(UsageError, match=f'the blocks of {model_name} carry no class token'):
        TokenBackbone(model_name, out_indices=(1,), img_size=64, class_token=True, model_kwargs=kwargs)


def test_a_model_without_a_norm_over_its_tokens_is_refused_a_final_norm():
    """EVA-02's and BEiT's norm is over the pooled feature (`fc_norm`), which the dense backbone drops."""
    with pytest.raises(UsageError, match='eva02_small_patch14_224 has no final norm over its tokens'):
        TokenBackbone('eva02_small_patch14_224', out_indices=(1,), img_size=64, final_norm=True,
                      model_kwargs=TINY_MODELS['upernet_deit_s.py'])


def test_the_class_token_of_a_model_with_registers_is_its_first_prefix_token():
    """DINOv2's register models: [class token, 4 registers, patches]; the joined token is the class token."""
    torch.manual_seed(0)
    kwargs = TINY_MODELS['upernet_dinov2_s.py']
    name = 'vit_small_patch14_reg4_dinov2'
    classifier = create_model(name, img_size=56, num_classes=0, dynamic_img_size=True, **kwargs).eval()
    backbone = TokenBackbone(name, out_indices=(3,), img_size=56, class_token=True, model_kwargs=kwargs)
    backbone.model.load_state_dict(classifier.state_dict(), strict=False)
    images = torch.randn(2, 3, 56, 56)  # 4 x 4 patches of 14 px
    tokens = hooked_block_outputs(classifier, images, [3])[0]
    with torch.no_grad():
        joined = backbone(images)[0]
    dim = kwargs['embed_dim']
    torch.testing.assert_close(joined[:, dim:], tokens[:, 0, :, None, None].expand(2, dim, *joined.shape[-2:]))


@pytest.mark.parametrize('config', LINEAR_DEPTH + FROZEN_DPT)
def test_every_frozen_depth_config_is_dinov2s_protocol(config):
    cfg = Config.fromfile(CONFIGS / config)
    backbone, head = cfg.model.backbone, cfg.model.decode_head
    assert backbone.frozen is True and backbone.drop_path_rate == 0 and not backbone.get('final_norm')
    top = 80.0 if 'kitti' in config else 10.0
    assert head.max_depth == top
    if config in FROZEN_DPT:  # "DPT": the fine-tuning configs' neck and fusion head on the frozen encoder
        assert cfg.model.neck.type == 'TokenPyramidNeck' and head.type == 'DepthFusionHead'
        return
    blocks = (3, 7, 11, 15) if config.startswith('depth_linear4') else (15,)
    assert backbone.class_token is True and tuple(backbone.out_indices) == blocks
    assert cfg.model.get('neck') is None
    assert (head.type, head.n_bins, head.upsample, head.min_depth) == ('LinearDepthHead', 256, 4, 1e-3)
    assert head.in_channels == [2 * 384] * len(blocks)


@pytest.mark.slow  # tools run end to end
def test_a_linear_depth_config_trains_tests_and_predicts_through_the_tools(tmp_path):
    data = write_tiny_nyu(tmp_path / 'nyu')
    config = write_tiny_dense_config(tmp_path / 'lin4.py', 'depth_linear4_lvvit_s.py', data)
    succeeded(run_tool('train_seg.py', [config, '--work-dir', tmp_path / 'work', '--iters', '2']))
    checkpoint = tmp_path / 'work' / 'iter_2.pth'
    state = torch.load(checkpoint, weights_only=False)['state_dict']
    assert state['decode_head.depth_layer.weight'].shape == (256, 4 * 2 * 32, 1, 1)
    succeeded(run_tool('test_seg.py', [config, checkpoint, '--out', tmp_path / 'scores.json', '--work-dir',
                                       tmp_path / 'test']))
    scores = json.loads((tmp_path / 'scores.json').read_text())
    assert scores['abs_rel'] > 0 and scores['rmse'] > 0
    image = sorted((data / 'images' / 'test').glob('*.jpg'))[0]
    succeeded(run_tool('predict_seg.py', [config, checkpoint, image, '--out', tmp_path / 'depth']))
    assert any((tmp_path / 'depth').iterdir())
