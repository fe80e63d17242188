"""ViT (Dosovitskiy et al., 2021) and DeiT (Touvron et al., 2021): timm's VisionTransformer.

timm implements these models with the official key layout, so the suite uses its class and entrypoints as they
are, registered again under the same names only to default `dynamic_img_size=True` (inputs of any size, position
embeddings resampled per forward), which the suite's contract requires of every model.
"""
from __future__ import annotations

import torch.nn as nn
from timm.models import deit as _timm_deit, vision_transformer as _timm_vit
from timm.models.vision_transformer import VisionTransformer

from .registry import suite_model

__all__ = ['VisionTransformer']

default_cfgs = {
    'vit_base_patch16_224': _timm_vit.default_cfgs['vit_base_patch16_224'],
    'vit_large_patch16_224': _timm_vit.default_cfgs['vit_large_patch16_224'],
    'deit_small_patch16_224': _timm_deit.default_cfgs['deit_small_patch16_224'],
    **_timm_vit.generate_default_cfgs({'vit_small_patch16_legacy_224': _timm_vit._cfg()}),
}


def _any_size(kwargs: dict) -> dict:
    return {'dynamic_img_size': True, **kwargs}


@suite_model('vit')
def vit_base_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-B/16: 12 blocks, D 768, MLP 3072, 12 heads, 86.6M parameters."""
    return _timm_vit.vit_base_patch16_224(pretrained, **_any_size(kwargs))


@suite_model('vit')
def vit_large_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-L/16: 24 blocks, D 1024, MLP 4096, 16 heads, 304.3M parameters."""
    return _timm_vit.vit_large_patch16_224(pretrained, **_any_size(kwargs))


@suite_model('vit')
def deit_small_patch16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """DeiT-S/16: 12 blocks, D 384, MLP 1536, 6 heads, 22.1M parameters."""
    return _timm_deit.deit_small_patch16_224(pretrained, **_any_size(kwargs))


@suite_model('vit')
def vit_small_patch16_legacy_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-S/16 as compared in the T2T-ViT paper (timm < 0.4): 8 blocks, D 768, MLP 2304, 8 heads, no qkv bias.

    Not timm's current `vit_small_patch16_224` (that one is DeiT-S sized). LayerNorm eps 1e-5 as it had then.
    """
    model_args = dict(patch_size=16, embed_dim=768, depth=8, num_heads=8, mlp_ratio=3.0, qkv_bias=False,
                      norm_layer=nn.LayerNorm)
    return _timm_vit._create_vision_transformer(
        'vit_small_patch16_legacy_224', pretrained=pretrained, **_any_size({**model_args, **kwargs}))
