"""The mmcv-lite compatibility module: active only without compiled ops, and then mmseg's FCN/UperNet work."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from backbones.dense import mmcv_compat
from helpers.commands import ROOT

# The module on its own, without the dense package (whose import uses it and then imports mmseg's models).
MODULE = ROOT / 'backbones' / 'dense' / 'mmcv_compat.py'
LOAD_ALONE = f'''
import importlib.util
_spec = importlib.util.spec_from_file_location('mmcv_compat', {str(MODULE)!r})
mmcv_compat = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mmcv_compat)
'''


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-W', 'always', '-c', textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300)


def test_mmseg_needs_the_module_on_mmcv_lite():
    result = run_python('''
        import importlib.util
        assert importlib.util.find_spec('mmcv._ext') is None, 'this check needs mmcv-lite'
        import mmseg.models
    ''')
    assert result.returncode != 0 and "No module named 'mmcv._ext'" in result.stderr


@pytest.mark.slow
def test_without_compiled_ops_mmseg_heads_import_and_run():
    result = run_python(LOAD_ALONE + textwrap.dedent('''
        import torch
        assert mmcv_compat.ensure_mmseg_importable() is True
        import mmseg.models
        from mmseg.registry import MODELS
        head = MODELS.build(dict(type='UPerHead', in_channels=[8, 8, 8, 8], in_index=[0, 1, 2, 3], channels=8,
                                 pool_scales=(1, 2), num_classes=3, norm_cfg=dict(type='BN')))
        fcn = MODELS.build(dict(type='FCNHead', in_channels=8, channels=8, num_classes=3, in_index=2,
                                norm_cfg=dict(type='BN')))
        feats = [torch.randn(2, 8, s, s) for s in (16, 8, 4, 4)]
        assert head(feats).shape == (2, 3, 16, 16) and fcn(feats).shape == (2, 3, 4, 4)
        try:
            from mmcv.ops import CrissCrossAttention
        except ModuleNotFoundError as exc:
            assert 'CrissCrossAttention' in str(exc)
        else:
            raise AssertionError('a compiled op was offered')
        print('ok')
    '''))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == 'ok'
    assert 'MultiScaleDeformableAttention' not in result.stderr  # mmcv-lite's import warning, which asks nothing


def test_with_compiled_ops_it_stays_out_of_the_way():
    """Full mmcv is simulated by making `mmcv._ext` findable: nothing may be replaced then."""
    result = run_python(textwrap.dedent('''
        import importlib.machinery, sys, types
        class FakeExtFinder:
            def find_spec(self, name, path=None, target=None):
                if name == 'mmcv._ext':
                    return importlib.machinery.ModuleSpec(name, loader=None)
                return None
        sys.meta_path.insert(0, FakeExtFinder())
        sentinel = types.ModuleType('mmcv.ops')
        sys.modules['mmcv.ops'] = sentinel
    ''') + LOAD_ALONE + textwrap.dedent('''
        assert mmcv_compat.compiled_ops_available()
        assert mmcv_compat.ensure_mmseg_importable() is False
        assert sys.modules['mmcv.ops'] is sentinel
        print('ok')
    '''))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == 'ok'


def test_point_sample_is_bilinear_sampling_at_normalised_points():
    mmcv_compat.ensure_mmseg_importable()
    from mmcv.ops import point_sample
    image = torch.arange(16.0).view(1, 1, 4, 4)
    # Pixel centres of (row 1, col 2) and (row 3, col 0) in [0, 1] coordinates (align_corners=False).
    points = torch.tensor([[[2.5 / 4, 1.5 / 4], [0.5 / 4, 3.5 / 4]]])
    assert torch.allclose(point_sample(image, points), torch.tensor([[[6.0, 12.0]]]))


def test_sigmoid_focal_loss_matches_mmseg_python_version():
    from mmseg.models.losses.focal_loss import py_sigmoid_focal_loss
    torch.manual_seed(0)
    logits = torch.randn(12, 5)
    target = torch.randint(0, 6, (12,))  # 5 = "no class"
    one_hot = F.one_hot(target, 6)[:, :5].float()
    ours = mmcv_compat.sigmoid_focal_loss(logits, target, 2.0, 0.25, None, 'none')
    theirs = py_sigmoid_focal_loss(logits, one_hot, gamma=2.0, alpha=0.25, reduction='none')
    assert torch.allclose(ours, theirs, atol=1e-6)
    assert torch.allclose(mmcv_compat.sigmoid_focal_loss(logits, target), theirs.sum() / 12, atol=1e-6)
    weight = torch.rand(5)
    weighted = mmcv_compat.sigmoid_focal_loss(logits, target, 2.0, 0.25, weight, 'none')
    row_weight = torch.where(target < 5, weight[target.clamp(max=4)], torch.ones(12))
    assert torch.allclose(weighted, theirs * row_weight[:, None], atol=1e-6)
