"""Layer-wise learning-rate decay for the token backbones (`LayerDecayOptimWrapperConstructor`, with
`paramwise_cfg=dict(layer_decay_rate=0.9)`): BEiT's recipe on timm's parameter groups, layer 0 the embedding,
layer i + 1 block i, the neck and heads the last layer at the base lr; a parameter of layer l gets
lr * rate ** (last - l). Biases, norm weights and the model's `no_weight_decay()` tables get no weight decay."""
from __future__ import annotations

import torch.nn as nn
from mmengine.optim import DefaultOptimWrapperConstructor
from mmseg.registry import OPTIM_WRAPPER_CONSTRUCTORS
from timm.optim import param_groups_layer_decay, param_groups_weight_decay

from backbones.common.errors import UsageError
from backbones.common.log import logger


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class LayerDecayOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """Parameter groups per (layer, weight decay or not), lr scaled by `paramwise_cfg['layer_decay_rate']`."""

    def add_params(self, params: list[dict], module: nn.Module, **kwargs) -> None:
        if 'layer_decay_rate' not in self.paramwise_cfg:
            raise UsageError('LayerDecayOptimWrapperConstructor needs paramwise_cfg=dict(layer_decay_rate=...)')
        rate = self.paramwise_cfg['layer_decay_rate']
        model = module.backbone.model
        # timm counts the backbone's own layers and gives its last block the full lr; the neck and heads are the
        # layer above it here, so every backbone group takes one more factor of `rate`.
        for group in param_groups_layer_decay(model, self.base_wd, no_weight_decay_list=model.no_weight_decay(),
                                              layer_decay=rate):
            params.append({'params': group['params'], 'weight_decay': group['weight_decay'],
                           'lr': self.base_lr * group['lr_scale'] * rate})
        for name, part in module.named_children():
            if name != 'backbone':
                params.extend({**group, 'lr': self.base_lr}
                              for group in param_groups_weight_decay(part, self.base_wd) if group['params'])
        num_layers = module.backbone.num_layers + 1
        logger.info(f'layer-wise lr decay {rate} over {num_layers + 1} layers: lr x{rate ** num_layers:.3g} '
                    f'(embedding) ... x1 (neck and heads)')
