"""The LV-ViT segmentation releases (mmseg 0.x, the neck stored inside the backbone as `side_layer1..4`) load into
the suite's UperNet configs, through `init_cfg` and strict loading alike, and give the reference layout's outputs."""
from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.registry import init_default_scope
from mmengine.runner.checkpoint import load_checkpoint

import backbones.dense  # noqa: F401  (first: it lets mmseg import on mmcv-lite; registers the suite's modules)

# isort: split
from mmseg.registry import MODELS

from backbones.common.errors import CheckpointError
from backbones.dense.released_segmentors import RELEASED_SEGMENTORS, convert_mmseg0_release
from backbones.weights import url_cache_path
from helpers.commands import run_tool, succeeded
from helpers.reference_models import RefBlock, RefLVViTStem, randomize_
from helpers.seg_data import DIM, TINY_MODELS, tiny_config, tiny_model_overrides, write_tiny_ade, write_tiny_config

pytestmark = pytest.mark.slow  # tools run end to end here: make test-fast leaves this file out

init_default_scope('mmseg')
IMG = 64
NECK_OUT = (DIM, DIM, DIM, 48)  # the tiny configs' neck: levels at strides 4, 8, 16, 16


def side_layer(channels: int, out: int, scale: int) -> nn.Sequential:
    """A side layer of the reference's LV-ViT segmentation backbone (nn.Sequential, mmseg 0.x)."""
    convs = [nn.Conv2d(channels, out, 1, bias=False), nn.BatchNorm2d(out), nn.ReLU()]
    if scale == 1:
        return nn.Sequential(*convs)
    return nn.Sequential(nn.ConvTranspose2d(channels, channels, scale, scale, bias=False), nn.BatchNorm2d(channels),
                         nn.ReLU(), *convs)


class RefSegLVViT(nn.Module):
    """The reference's LV-ViT segmentation backbone, plainly: the classification model's stem and blocks, the patch
    tokens after the chosen blocks as maps (no final norm), each through its side layer."""

    def __init__(self, dim: int, depth: int, num_heads: int, stem: int, out_indices, out_channels, scales) -> None:
        super().__init__()
        self.patch_embed = RefLVViTStem(dim, stem)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, (IMG // 16) ** 2 + 1, dim))
        self.blocks = nn.ModuleList([RefBlock(dim, num_heads, 3.0, False, 1e-5, 2.0) for _ in range(depth)])  # LV-ViT-S
        self.out_indices = out_indices
        for i, (out, scale) in enumerate(zip(out_channels, scales), start=1):
            setattr(self, f'side_layer{i}', side_layer(dim, out, scale))

    def forward(self, x):
        x = self.patch_embed(x)
        B, D, h, w = x.shape
        x = torch.cat((self.cls_token.expand(B, -1, -1), x.flatten(2).transpose(1, 2)), dim=1) + self.pos_embed
        maps = []
        for i, blk in enumerate(self.blocks):
            x = blk(x)
            if i in self.out_indices:
                maps.append(x[:, 1:].transpose(1, 2).reshape(B, D, h, w))
        return [getattr(self, f'side_layer{i}')(m) for i, m in enumerate(maps, start=1)]


@pytest.fixture(scope='module')
def release(tmp_path_factory):
    """A tiny UperNet + LV-ViT written as the reference's release file, and the reference's logits on an image."""
    cfg = tiny_config('upernet_lvvit_s.py', img_size=IMG)
    kwargs = TINY_MODELS['upernet_lvvit_s.py']
    backbone = RefSegLVViT(DIM, kwargs['depth'], kwargs['num_heads'], kwargs['stem_chs'], (0, 1, 2, 3), NECK_OUT,
                           (4, 2, 1, 1))
    heads = nn.ModuleDict({key: MODELS.build({**cfg.model[key], 'norm_cfg': dict(type='BN')})
                           for key in ('decode_head', 'auxiliary_head')})
    randomize_(backbone, seed=1)
    randomize_(heads, seed=2)
    state = {**{f'backbone.{k}': v for k, v in backbone.state_dict().items()},
             **{k: v for k, v in heads.state_dict().items()}}
    path = tmp_path_factory.mktemp('release') / 'upernet_lvvit_s.pth'
    torch.save({'meta': {'mmcv_version': '1.3.0', 'CLASSES': tuple(f'c{i}' for i in range(150)), 'iter': 160000},
                'state_dict': state}, path)
    image = torch.randn(2, 3, IMG, IMG)
    with torch.no_grad():
        logits = heads['decode_head'](backbone(image))
        reference = F.interpolate(logits, size=(IMG, IMG), mode='bilinear', align_corners=False)
    return cfg, path, image, reference


def predict(model: nn.Module, image: torch.Tensor) -> torch.Tensor:
    metas = [dict(img_shape=(IMG, IMG), ori_shape=(IMG, IMG), pad_shape=(IMG, IMG))] * len(image)
    with torch.no_grad():
        return model.eval().encode_decode(image, metas)


def test_the_release_loads_strictly_into_the_upernet_config_with_the_reference_outputs(release):
    cfg, path, image, reference = release
    model = MODELS.build(cfg.model)
    load_checkpoint(model, str(path), strict=True)  # mmengine's loader, through the suite's: converted
    torch.testing.assert_close(predict(model, image), reference, rtol=1e-4, atol=1e-4)


def test_init_cfg_takes_the_release_too(release):
    cfg, path, image, reference = release
    cfg.model.init_cfg = dict(type='Pretrained', checkpoint=str(path))
    model = MODELS.build(cfg.model)
    model.init_weights()
    torch.testing.assert_close(predict(model, image), reference, rtol=1e-4, atol=1e-4)


def test_the_conversion_maps_every_side_layer_parameter():
    state = {'backbone.side_layer1.0.weight': 1, 'backbone.side_layer1.1.running_var': 2,
             'backbone.side_layer1.3.weight': 3, 'backbone.side_layer1.4.bias': 4, 'backbone.side_layer3.0.weight': 5,
             'backbone.side_layer3.1.num_batches_tracked': 6, 'backbone.blocks.0.attn.qkv.weight': 7,
             'decode_head.conv_seg.weight': 8}
    assert convert_mmseg0_release(state) == {
        'neck.levels.0.0.weight': 1, 'neck.levels.0.1.running_var': 2, 'neck.levels.0.3.conv.weight': 3,
        'neck.levels.0.3.bn.bias': 4, 'neck.levels.2.0.conv.weight': 5, 'neck.levels.2.0.bn.num_batches_tracked': 6,
        'backbone.model.blocks.0.attn.qkv.weight': 7, 'decode_head.conv_seg.weight': 8}
    with pytest.raises(CheckpointError, match='side_layer2.7.weight'):
        convert_mmseg0_release({'backbone.side_layer2.7.weight': 0, 'backbone.side_layer2.3.weight': 0})


def test_test_seg_takes_the_release_file_strictly(release, tmp_path):
    """tools/test_seg.py reads the release file itself, loading every key strictly: the same predictions and scores
    as its weights saved in this suite's layout; a release lacking a side-layer weight is refused, naming the key."""
    cfg, path, _, _ = release
    model = MODELS.build(cfg.model)
    load_checkpoint(model, str(path), strict=True)
    torch.save({'state_dict': model.state_dict()}, tmp_path / 'suite_layout.pth')
    config = write_tiny_config(tmp_path / 'tiny_upernet_lvvit.py', 'upernet_lvvit_s.py',
                               write_tiny_ade(tmp_path / 'ade'))
    reports, predictions = [], []
    for checkpoint in (path, tmp_path / 'suite_layout.pth'):
        out, preds = tmp_path / f'{checkpoint.stem}.json', tmp_path / f'pred_{checkpoint.stem}'
        succeeded(run_tool('test_seg.py', [config, checkpoint, '--out', out, '--pred-dir', preds,
                                           '--work-dir', tmp_path / 'work']))
        reports.append(json.loads(out.read_text()))
        predictions.append(np.concatenate([cv2.imread(str(p), cv2.IMREAD_UNCHANGED).ravel()
                                           for p in sorted(preds.glob('*.png'))]))
    assert reports[0] == reports[1] and np.array_equal(predictions[0], predictions[1])

    broken = torch.load(path, weights_only=True)
    del broken['state_dict']['backbone.side_layer4.0.weight']
    torch.save(broken, tmp_path / 'broken.pth')
    result = run_tool('test_seg.py', [config, tmp_path / 'broken.pth', '--work-dir', tmp_path / 'work'])
    assert result.returncode == 2 and 'neck.levels.3.0.conv.weight' in result.stderr.strip().splitlines()[-1]


def test_torch_hub_loads_the_release_from_its_cache_with_the_reference_outputs(release, tmp_path, monkeypatch):
    """hubconf.py's segmentor entry point: the release file where torch hub's cache keeps its URL's download."""
    _, path, image, reference = release
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch'))
    cache = url_cache_path(RELEASED_SEGMENTORS['upernet_lvvit_s'])
    cache.parent.mkdir(parents=True)
    cache.write_bytes(path.read_bytes())
    model = torch.hub.load(str(Path(__file__).resolve().parents[1]), 'upernet_lvvit_s', source='local',
                           cfg_options=dict(model=tiny_model_overrides('upernet_lvvit_s.py', IMG)))
    assert not model.training
    torch.testing.assert_close(predict(model, image), reference, rtol=1e-4, atol=1e-4)
