"""ViT (Dosovitskiy et al., 2021) and DeiT (Touvron et al., 2021): timm's VisionTransformer, names and weights.

Only the ViT-S/16 the T2T-ViT paper compares with (timm < 0.4's `vit_small_patch16_224`) is registered here;
`backbones.create_model` builds every ViT with timm's `dynamic_img_size=True` (inputs of any size)."""
from __future__ import annotations

import timm
import torch.nn as nn
from timm.models import vision_transformer as _timm_vit
from timm.models.vision_transformer import VisionTransformer

from backbones.common.errors import UsageError
from backbones.registry import Family, adopt_timm_models, suite_model

__all__ = ['VisionTransformer']


# DeiT's distilled models (timm's VisionTransformerDistilled, the official layout): the twins of the ViT sizes
# that have one (ViT-B/16 is DeiT-B).
DISTILLED_TWINS = {
    'deit_tiny_patch16_224': 'deit_tiny_distilled_patch16_224',
    'deit_small_patch16_224': 'deit_small_distilled_patch16_224',
    'deit_base_patch16_224': 'deit_base_distilled_patch16_224',
    'vit_base_patch16_224': 'deit_base_distilled_patch16_224',
    'deit_base_patch16_384': 'deit_base_distilled_patch16_384',
}


def distilled_twin(name: str) -> str:
    """The DeiT model with a distillation token and head that has `name`'s architecture."""
    if name in DISTILLED_TWINS.values():
        return name
    if name not in DISTILLED_TWINS:
        raise UsageError(f'{name} has no distilled twin with a distillation token; the ViT/DeiT models with one: '
                         f'{", ".join(sorted(DISTILLED_TWINS))}, and the twins themselves')
    return DISTILLED_TWINS[name]


def create_any_size(name: str, distilled: bool = False, **kwargs) -> VisionTransformer:
    """timm's model with `dynamic_img_size=True` unless told otherwise; `distilled`: its DeiT twin."""
    return timm.create_model(distilled_twin(name) if distilled else name, **{'dynamic_img_size': True, **kwargs})


VIT = Family('vit', ('patch_embed.proj.',), distillation_token=True, builder=create_any_size, shared_signs=True)
# the published ViT sizes and every DeiT with a distilled twin (each can be a distilled student), and the twins
adopt_timm_models(VIT, ['vit_base_patch16_224', 'vit_large_patch16_224'] + [
    name for name in dict.fromkeys([*DISTILLED_TWINS, *DISTILLED_TWINS.values()]) if name != 'vit_base_patch16_224'])

default_cfgs = _timm_vit.generate_default_cfgs({'vit_small_patch16_legacy_224': _timm_vit._cfg()})


@suite_model(VIT)
def vit_small_patch16_legacy_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-S/16 of the T2T-ViT paper (timm < 0.4): 8 blocks, D 768, MLP 2304, 8 heads, no qkv bias."""
    model_args = dict(patch_size=16, embed_dim=768, depth=8, num_heads=8, mlp_ratio=3.0, qkv_bias=False,
                      norm_layer=nn.LayerNorm)
    return _timm_vit._create_vision_transformer('vit_small_patch16_legacy_224', pretrained=pretrained,
                                                **{**model_args, **kwargs})
