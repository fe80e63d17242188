"""CaiT: "Going deeper with Image Transformers" (Touvron et al., 2021), on timm's implementation.

`CaiT` is timm's `Cait` (its parameter names and weights) with inputs of any size (position embeddings resampled
per forward) and the suite's `forward_intermediates`; `backbones.create_model` builds every CaiT name with it, and
only the sizes timm lacks (Table 3 at 224: XS24, XS36, S36, S48, M24, M36) are registered here. Every size starts
LayerScale at Table 3's value (XXS36: 1e-6, timm's 1e-5). docs/models.md tells the rest."""
from __future__ import annotations

from functools import partial

import torch
from timm.layers import PatchEmbed
from timm.models import build_model_with_cfg, generate_default_cfgs, split_model_name_tag
from timm.models import cait as _timm_cait
from timm.models.cait import Cait, TalkingHeadAttn

from backbones.layers import Grid, TokenModelMixin, features_only_cfg, tokens_with_positions
from backbones.registry import Family, adopt_timm_models, suite_entrypoints

__all__ = ['CaiT']


class CaiT(TokenModelMixin, Cait):
    """timm's Cait taking any input size (no class slot in the position table); `distilled`: a distillation token."""

    def __init__(self, *args, distilled: bool = False, **kwargs) -> None:
        kwargs.setdefault('patch_layer', partial(PatchEmbed, strict_img_size=False, output_fmt='NHWC'))
        super().__init__(*args, **kwargs)
        self._init_token_model(distilled)
        if distilled:
            self.num_prefix_tokens = 2
            self._reset_heads(self.num_classes)

    block_prefix_tokens = 0  # the class token joins after the blocks, in the class-attention stage
    # timm's also drops the class token and the class-attention stage, which only the head uses.
    prune_intermediate_layers = Cait.prune_intermediate_layers
    group_matcher = Cait.group_matcher

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        Cait.reset_classifier(self, num_classes, global_pool)
        if self.distilled:
            self._reset_heads(num_classes)

    def _class_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """timm's `Cait.forward_head` (written out: TorchScript cannot call it through the class)."""
        if self.global_pool:
            x = x[:, self.num_prefix_tokens:].mean(dim=1) if self.global_pool == 'avg' else x[:, 0]
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def _embed_tokens(self, x: torch.Tensor) -> tuple[torch.Tensor, Grid]:
        grid = self.patch_embed(x)
        tokens = tokens_with_positions(grid, self.pos_embed, self.patch_embed.grid_size, None)
        return self.pos_drop(tokens), (grid.shape[1], grid.shape[2])

    def _finish_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Class-attention stage: the class (and distillation) token attends to the patches, which stay as they are."""
        if self.blocks_token_only is None:
            return x
        cls_token = self._class_attention(self.cls_token, x)
        if self.dist_token is None:
            return torch.cat([cls_token, x], dim=1)
        return torch.cat([cls_token, self._class_attention(self.dist_token, x), x], dim=1)

    def _class_attention(self, token: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        query = token.expand(x.shape[0], -1, -1)
        for block in self.blocks_token_only:
            query = block(x, query)
        return query


XXS = dict(patch_size=16, embed_dim=192, num_heads=4)
XS = dict(patch_size=16, embed_dim=288, num_heads=6)
S = dict(patch_size=16, embed_dim=384, num_heads=8)
M = dict(patch_size=16, embed_dim=768, num_heads=16)
# Depth and LayerScale init of every size (CaiT paper, Table 3; M48 as M36): 24 blocks start at 1e-5, deeper at 1e-6.
SIZES = {
    'xxs24': dict(XXS, depth=24, init_values=1e-5), 'xxs36': dict(XXS, depth=36, init_values=1e-6),
    'xs24': dict(XS, depth=24, init_values=1e-5), 'xs36': dict(XS, depth=36, init_values=1e-6),
    's24': dict(S, depth=24, init_values=1e-5), 's36': dict(S, depth=36, init_values=1e-6),
    's48': dict(S, depth=48, init_values=1e-6), 'm24': dict(M, depth=24, init_values=1e-5),
    'm36': dict(M, depth=36, init_values=1e-6), 'm48': dict(M, depth=48, init_values=1e-6),
}
_TIMM = ('cait_xxs24_224', 'cait_xxs24_384', 'cait_xxs36_224', 'cait_xxs36_384', 'cait_xs24_384', 'cait_s24_224',
         'cait_s24_384', 'cait_s36_384', 'cait_m36_384', 'cait_m48_448')
_NEW = ('cait_xs24_224', 'cait_xs36_224', 'cait_s36_224', 'cait_s48_224', 'cait_m24_224', 'cait_m36_224')
# The model arguments of every CaiT name (timm's and those registered below).
VARIANTS = {name: SIZES[name.split('_')[1]] for name in (*_TIMM, *_NEW)}

default_cfgs = generate_default_cfgs({name: _timm_cait._cfg(input_size=(3, 224, 224)) for name in _NEW})


def build_cait(name: str, pretrained: bool = False, **kwargs) -> CaiT:
    """Any CaiT name (a pretrained tag such as `.fb_dist_in1k` allowed) as the suite's `CaiT`, with timm's weights."""
    variant, tag = split_model_name_tag(name)
    if tag:
        kwargs.setdefault('pretrained_cfg', tag)
    return build_model_with_cfg(
        CaiT, variant, pretrained,
        pretrained_filter_fn=_timm_cait.checkpoint_filter_fn,
        feature_cfg=features_only_cfg(kwargs),
        **{**VARIANTS[variant], **kwargs},
    )


CAIT = Family('cait', ('blocks_token_only.',), recipe='cait', attention=(TalkingHeadAttn,), distillation_token=True,
              builder=build_cait)
adopt_timm_models(CAIT, list(_TIMM))
suite_entrypoints(CAIT, __name__, _NEW, lambda name, pretrained, kwargs: build_cait(name, pretrained, **kwargs))
