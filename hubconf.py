"""torch.hub's entry points: every classifier of the suite's four families (ViT and DeiT, T2T-ViT, CaiT, LV-ViT) at
its published sizes with its released ImageNet weights, and the released LV-ViT UperNet segmentors (ADE20K).

    torch.hub.list('OWNER/REPO')                                     # the names
    model = torch.hub.load('OWNER/REPO', 'lvvit_s')                  # LV-ViT-S, 83.3% top-1 (224 px)
    model = torch.hub.load('OWNER/REPO', 'lvvit_m', tag='tl_in1k_448')
    segmentor = torch.hub.load('OWNER/REPO', 'upernet_lvvit_m')      # mmseg's EncoderDecoder, 150 ADE20K classes

Weights are downloaded once into torch hub's cache (docs/models.md); in a checkout, `torch.hub.load('.', NAME,
source='local')`. The packages of requirements.txt must be
installed; the entry points are the library's `backbones.create_model` and `built_segmentor`.
"""
from collections.abc import Callable as _Callable
from pathlib import Path as _Path

import torch.nn as _nn

import backbones.dense  # noqa: F401  (registers the suite's dense modules with mmseg)
from backbones.dense.config import load_config as _load_config
from backbones.dense.released_segmentors import RELEASED_SEGMENTORS as _RELEASED_SEGMENTORS
from backbones.dense.trained_checkpoints import built_segmentor as _built_segmentor
from backbones.registry import create_model as _create_model
from backbones.registry import suite_models as _suite_models
from backbones.weights import fetch_pretrained as _fetch_pretrained

dependencies = ['torch', 'timm', 'mmengine', 'mmseg']
_CONFIGS = _Path(__file__).resolve().parent / 'seg_configs'


def _classifier(name: str) -> _Callable[..., _nn.Module]:
    def entry(pretrained: bool = True, tag: str | None = None, **kwargs) -> _nn.Module:
        full_name = f'{name}.{tag}' if tag else name
        if pretrained:  # the release file in timm's cache first: one line naming it where it cannot be downloaded
            _fetch_pretrained('timm', full_name, setting=f'{full_name} (torch.hub)', instead='pretrained=False')
        return _create_model(full_name, pretrained=pretrained, **kwargs)

    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = (f"{name}: `pretrained`, its released ImageNet weights (timm's default tag, or `tag`'s); "
                     'other keywords go to its builder (num_classes, drop_path_rate, ...).')
    return entry


def _segmentor(name: str, url: str) -> _Callable[..., _nn.Module]:
    def entry(pretrained: bool = True, checkpoint: str | None = None, cfg_options: dict | None = None) -> _nn.Module:
        if checkpoint is None and pretrained:
            checkpoint = _fetch_pretrained(url, name, setting=f'{name} (torch.hub)', instead='checkpoint=')
        return _built_segmentor(_load_config(str(_CONFIGS / f'{name}.py'), cfg_options), checkpoint)

    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = (f'{name}: seg_configs/{name}.py in eval mode; `pretrained`, TokenLabeling\'s release file '
                     f'({url}), or `checkpoint`, a file of your own; `cfg_options`, changes to the config.')
    return entry


globals().update({name: _classifier(name) for name in _suite_models()})
globals().update({name: _segmentor(name, url) for name, url in _RELEASED_SEGMENTORS.items()})
