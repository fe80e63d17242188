"""Layer-wise learning-rate decay for the token backbones (mmseg's own constructors know BEiT/MAE/ConvNeXt only).

    optim_wrapper = dict(
        type='OptimWrapper', optimizer=dict(type='AdamW', lr=6e-5, weight_decay=0.01),
        constructor='LayerDecayOptimWrapperConstructor', paramwise_cfg=dict(layer_decay_rate=0.9))

Layer 0 is the embedding (patch embedding, class token, position table), layer i + 1 is block i, and the neck and
heads form the last layer, `num_layers` = blocks + 1. A parameter of layer l gets lr * rate ** (num_layers - l).
As in BEiT's recipe, biases, norm weights (every 1-d parameter) and the model's `no_weight_decay()` tables get no
weight decay.
"""
from __future__ import annotations

import re
from typing import List

import torch.nn as nn
from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor

from mmseg.registry import OPTIM_WRAPPER_CONSTRUCTORS

_BLOCK = re.compile(r'^backbone\.model\.blocks\.(\d+)\.')


def layer_id(name: str, num_layers: int) -> int:
    """Decay layer of a segmentor parameter: 0 embedding, i + 1 for block i, `num_layers` for the rest."""
    block = _BLOCK.match(name)
    if block:
        return int(block.group(1)) + 1
    return 0 if name.startswith('backbone.') else num_layers


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class LayerDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """Parameter groups per (layer, weight decay or not), lr scaled by `paramwise_cfg['layer_decay_rate']`."""

    def add_params(self, params: List[dict], module: nn.Module, **kwargs) -> None:
        if 'layer_decay_rate' not in self.paramwise_cfg:
            raise KeyError('LayerDecayOptimWrapperConstructor needs paramwise_cfg=dict(layer_decay_rate=...)')
        rate = self.paramwise_cfg['layer_decay_rate']
        num_layers = module.backbone.num_layers + 1
        model = module.backbone.model
        no_decay_tables = {f'backbone.model.{n}' for n in getattr(model, 'no_weight_decay', set)()}
        groups: dict = {}
        for name, param in module.named_parameters():
            if not param.requires_grad:
                continue
            layer = layer_id(name, num_layers)
            decay = param.ndim > 1 and name not in no_decay_tables
            group = groups.setdefault((layer, decay), {
                'params': [], 'lr': self.base_lr * rate ** (num_layers - layer),
                'weight_decay': self.base_wd if decay else 0.0,
            })
            group['params'].append(param)
        params.extend(groups[key] for key in sorted(groups))
        print_log(f'layer-wise lr decay {rate} over {num_layers + 1} layers: lr x{rate ** num_layers:.3g} '
                  f'(embedding) ... x1 (neck and heads)', logger='current')
