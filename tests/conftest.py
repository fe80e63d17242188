from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict

import pytest
import torch

import backbones  # noqa: F401  (registers the models)

# The tools' functions are imported by module name (`from model_info import main`), under plain `pytest` too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'tools'))


def save_release(path: Path, state_dict: Dict[str, torch.Tensor], layout: str) -> Path:
    """Write `state_dict` the way a family's official release file holds it."""
    prefixed = {f'module.{k}': v for k, v in state_dict.items()}
    if layout == 'timm_train':  # LV-ViT, T2T-ViT: timm training checkpoint, DDP prefix, EMA copy, args
        obj = {'epoch': 299, 'arch': 'x', 'state_dict': prefixed, 'state_dict_ema': dict(state_dict),
               'optimizer': {'state': {}, 'param_groups': [{'lr': 1e-3, 'params': [0, 1]}]},
               'version': 2, 'args': argparse.Namespace(model='x', lr=1e-3), 'metric': 83.3}
    elif layout == 'deit':  # DeiT / CaiT: {'model': ...} with the DDP prefix
        obj = {'model': prefixed}
    elif layout == 'plain':  # timm hub / our exports
        obj = dict(state_dict)
    else:
        raise ValueError(layout)
    torch.save(obj, path)
    return path


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
