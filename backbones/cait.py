"""CaiT: "Going deeper with Image Transformers" (Touvron et al., 2021), on timm's implementation.

timm's `Cait` has the official parameter names (LayerScale `gamma_*`, talking-heads `proj_l`/`proj_w`,
`blocks_token_only`); this subclass adds what the suite's contract needs: inputs of any size (position
embeddings resampled per forward) and `forward_intermediates` shared with the other families. The talking-heads
attention mixes heads between the logits and the softmax, so it cannot run on `scaled_dot_product_attention`;
the class-attention stage does (timm's `ClassAttn`).
"""
from __future__ import annotations

from functools import partial
from typing import Tuple

import torch
from timm.layers import PatchEmbed
from timm.models import build_model_with_cfg, cait as _timm_cait, generate_default_cfgs
from timm.models.cait import Cait

from .layers import Grid, TokenModelMixin, features_only_cfg, tokens_with_positions
from .registry import suite_model

__all__ = ['CaiT']


class CaiT(TokenModelMixin, Cait):
    """timm's Cait accepting any input size at inference; the position table has no class slot."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault('patch_layer', partial(PatchEmbed, strict_img_size=False, output_fmt='NHWC'))
        super().__init__(*args, **kwargs)

    # timm's also drops the class token and the class-attention stage, which only the head uses.
    prune_intermediate_layers = Cait.prune_intermediate_layers

    def _embed_tokens(self, x: torch.Tensor) -> Tuple[torch.Tensor, Grid]:
        grid = self.patch_embed(x)
        tokens = tokens_with_positions(grid, self.pos_embed, self.patch_embed.grid_size)
        return self.pos_drop(tokens), grid.shape[1:3]

    def _finish_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Class-attention stage: the class token attends to the patches; the patches stay as they are."""
        return self.forward_cls(x) if self.blocks_token_only is not None else x


_TIMM_NAMES = (
    'cait_xxs24_224', 'cait_xxs24_384', 'cait_xxs36_224', 'cait_xxs36_384', 'cait_xs24_384',
    'cait_s24_224', 'cait_s24_384', 'cait_s36_384', 'cait_m36_384', 'cait_m48_448',
)
# timm's pretrained cfgs carry over to our registration of the same names; the 224 variants that timm lacks
# are the ones whose FLOPs the paper reports at 224 (Table 3).
default_cfgs = {
    **{name: _timm_cait.default_cfgs[name] for name in _TIMM_NAMES},
    **generate_default_cfgs({
        name: _timm_cait._cfg(input_size=(3, 224, 224)) for name in ('cait_xs24_224', 'cait_s36_224', 'cait_m36_224')
    }),
}

XXS = dict(patch_size=16, embed_dim=192, num_heads=4, init_values=1e-5)
XS = dict(patch_size=16, embed_dim=288, num_heads=6, init_values=1e-5)
S = dict(patch_size=16, embed_dim=384, num_heads=8)
M = dict(patch_size=16, embed_dim=768, num_heads=16, init_values=1e-6)


def _cait(variant: str, pretrained: bool, defaults: dict, kwargs: dict) -> CaiT:
    img_size = int(variant.rsplit('_', 1)[1])
    return build_model_with_cfg(
        CaiT, variant, pretrained,
        pretrained_filter_fn=_timm_cait.checkpoint_filter_fn,
        feature_cfg=features_only_cfg(kwargs),
        **{'img_size': img_size, **defaults, **kwargs},
    )


@suite_model('cait')
def cait_xxs24_224(pretrained: bool = False, **kwargs) -> CaiT:
    """CaiT-XXS24 at 224: D 192, 24 + 2 blocks, 12.0M parameters."""
    return _cait('cait_xxs24_224', pretrained, dict(XXS, depth=24), kwargs)


@suite_model('cait')
def cait_xxs24_384(pretrained: bool = False, **kwargs) -> CaiT:
    return _cait('cait_xxs24_384', pretrained, dict(XXS, depth=24), kwargs)


@suite_model('cait')
def cait_xxs36_224(pretrained: bool = False, **kwargs) -> CaiT:
    """CaiT-XXS36 at 224: D 192, 36 + 2 blocks, 17.3M parameters."""
    return _cait('cait_xxs36_224', pretrained, dict(XXS, depth=36), kwargs)


@suite_model('cait')
def cait_xxs36_384(pretrained: bool = False, **kwargs) -> CaiT:
    return _cait('cait_xxs36_384', pretrained, dict(XXS, depth=36), kwargs)


@suite_model('cait')
def cait_xs24_224(pretrained: bool = False, **kwargs) -> CaiT:
    """CaiT-XS24 at 224: D 288, 24 + 2 blocks, 26.6M parameters."""
    return _cait('cait_xs24_224', pretrained, dict(XS, depth=24), kwargs)


@suite_model('cait')
def cait_xs24_384(pretrained: bool = False, **kwargs) -> CaiT:
    return _cait('cait_xs24_384', pretrained, dict(XS, depth=24), kwargs)


@suite_model('cait')
def cait_s24_224(pretrained: bool = False, **kwargs) -> CaiT:
    """CaiT-S24 at 224: D 384, 24 + 2 blocks, 46.9M parameters."""
    return _cait('cait_s24_224', pretrained, dict(S, depth=24, init_values=1e-5), kwargs)


@suite_model('cait')
def cait_s24_384(pretrained: bool = False, **kwargs) -> CaiT:
    return _cait('cait_s24_384', pretrained, dict(S, depth=24, init_values=1e-5), kwargs)


@suite_model('cait')
def cait_s36_224(pretrained: bool = False, **kwargs) -> CaiT:
    """CaiT-S36 at 224: D 384, 36 + 2 blocks, 68.2M parameters."""
    return _cait('cait_s36_224', pretrained, dict(S, depth=36, init_values=1e-6), kwargs)


@suite_model('cait')
def cait_s36_384(pretrained: bool = False, **kwargs) -> CaiT:
    return _cait('cait_s36_384', pretrained, dict(S, depth=36, init_values=1e-6), kwargs)


@suite_model('cait')
def cait_m36_224(pretrained: bool = False, **kwargs) -> CaiT:
    """CaiT-M36 at 224: D 768, 36 + 2 blocks, 270.9M parameters."""
    return _cait('cait_m36_224', pretrained, dict(M, depth=36), kwargs)


@suite_model('cait')
def cait_m36_384(pretrained: bool = False, **kwargs) -> CaiT:
    return _cait('cait_m36_384', pretrained, dict(M, depth=36), kwargs)


@suite_model('cait')
def cait_m48_448(pretrained: bool = False, **kwargs) -> CaiT:
    """CaiT-M48 at 448: D 768, 48 + 2 blocks, 356M parameters."""
    return _cait('cait_m48_448', pretrained, dict(M, depth=48), kwargs)
