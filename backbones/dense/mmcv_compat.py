"""Let mmsegmentation 1.2.2 import on mmcv-lite, the pure-Python build of mmcv (docs/setup.md).

mmseg 1.2.2 imports two compiled ops from `mmcv.ops` at import time without a guard (`point_sample`,
`sigmoid_focal_loss`). `ensure_mmseg_importable()`, only where mmcv's compiled extension is missing, registers a
stand-in `mmcv.ops` with those two in plain PyTorch; asking it for any other op raises ModuleNotFoundError naming the
op, which mmseg's guarded imports handle. Import it before `mmseg.models`: the suite's segmentation code does."""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F


def compiled_ops_available() -> bool:
    """True when mmcv's compiled extension (full mmcv, not mmcv-lite) is installed."""
    return importlib.util.find_spec('mmcv._ext') is not None


def sigmoid_focal_loss(input: torch.Tensor, target: torch.Tensor, gamma: float = 2.0, alpha: float = 0.25,
                       weight: torch.Tensor | None = None, reduction: str = 'mean') -> torch.Tensor:
    """PyTorch form of mmcv's compiled op (`target`: class indices, C meaning "no class"): per element
    -alpha_t (1 - p_t)^gamma log p_t, times `weight[target]` per row when given; 'mean' divides by N."""
    one_hot = F.one_hot(target, input.size(1) + 1)[:, :-1].type_as(input)
    prob = input.sigmoid()
    p_t = prob * one_hot + (1 - prob) * (1 - one_hot)
    alpha_t = alpha * one_hot + (1 - alpha) * (1 - one_hot)
    loss = alpha_t * (1 - p_t).pow(gamma) * F.binary_cross_entropy_with_logits(input, one_hot, reduction='none')
    if weight is not None:
        loss = loss * torch.cat([weight, weight.new_ones(1)])[target].unsqueeze(1)
    if reduction == 'mean':
        return loss.sum() / input.size(0)
    return loss.sum() if reduction == 'sum' else loss


class _LiteOps(types.ModuleType):
    """`mmcv.ops` for mmcv-lite: the pure ops above; every compiled op is reported as missing."""

    def __getattr__(self, name: str):
        if name.startswith('__'):
            raise AttributeError(name)
        raise ModuleNotFoundError(
            f'mmcv.ops.{name} needs mmcv\'s compiled ops, which mmcv-lite lacks; install full mmcv '
            '(pip install --no-build-isolation mmcv==2.1.0) to use it', name='mmcv._ext')


def _mmcv_point_sample():
    """mmcv's own point_sample (pure PyTorch), loaded from its file without mmcv/ops/__init__.py."""
    import mmcv
    path = Path(mmcv.__file__).parent / 'ops' / 'point_sample.py'
    spec = importlib.util.spec_from_file_location('mmcv.ops.point_sample', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.point_sample


def ensure_mmseg_importable() -> bool:
    """Install the stand-in `mmcv.ops` if mmcv's compiled ops are missing; return whether it is in use."""
    if isinstance(sys.modules.get('mmcv.ops'), _LiteOps):
        return True
    if compiled_ops_available():
        return False
    import mmcv
    ops = _LiteOps('mmcv.ops', __doc__)
    ops.point_sample = _mmcv_point_sample()
    ops.sigmoid_focal_loss = sigmoid_focal_loss
    sys.modules['mmcv.ops'] = ops
    mmcv.ops = ops
    # mmcv's transformer bricks warn at import that mmcv-lite has no MultiScaleDeformableAttention; no model of the
    # suite uses it, so that warning is silenced (it told the user nothing to do)
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message='Fail to import ``MultiScaleDeformableAttention``')
        importlib.import_module('mmcv.cnn.bricks.transformer')
    return True
