"""T2T-ViT: "Tokens-to-Token ViT: Training Vision Transformers from Scratch on ImageNet" (Yuan et al., 2021).

The tokens-to-token module soft-splits the image three times, with a performer (`t2t_vit_*`) or a one-head
transformer (`t2t_vit_t_*`) in between; the backbone is a ViT with a fixed sinusoidal position table. State-dict keys
match the released checkpoints (the fixed tables are buffers here), which `pretrained=True` fetches through timm's
download cache (`t2t_vit_14.in1k_384` for 384)."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Mlp, calculate_drop_path_rates, register_notrace_function, trunc_normal_, use_fused_attn
from timm.models import generate_default_cfgs

from backbones.layers import (
    Grid,
    ScaledResidualBlock,
    TokenModelMixin,
    block_feature_info,
    build_token_model,
    init_linear_and_norm,
    token_model_cfg,
)
from backbones.registry import Family, suite_entrypoints
from backbones.weights import release_filter

__all__ = ['T2TViT', 'TokensToToken', 'sinusoid_table']

# (kernel, stride, padding) of the three soft splits: total stride 4 * 2 * 2 = 16.
SOFT_SPLITS = ((7, 4, 2), (3, 2, 1), (3, 2, 1))


def sinusoid_table(num_positions: int, dim: int) -> torch.Tensor:
    """[1, num_positions, dim] table: sin at even, cos at odd channels, angle pos / 10000^(2*(j//2)/dim)."""
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]
    j = torch.arange(dim, dtype=torch.float64)
    angle = pos / torch.pow(10000.0, 2 * torch.div(j, 2, rounding_mode='floor') / dim)
    table = torch.where(j.long() % 2 == 0, torch.sin(angle), torch.cos(angle))
    return table.float().unsqueeze(0)


@register_notrace_function  # torch.fx: called whole at run time (its autocast switch needs the input's device)
def performer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
                        eps: float) -> torch.Tensor:
    """Linear attention with the positive random features of `w`, in fp32 even under autocast."""
    if torch.jit.is_scripting():  # (TorchScript's autocast needs a constant device; scripted models run no autocast)
        return _performer_attention_fp32(q.float(), k.float(), v.float(), w.float(), eps)
    # (meta tensors, used to count FLOPs, have no autocast of their own)
    with torch.autocast(device_type='cpu' if q.is_meta else q.device.type, enabled=False):
        return _performer_attention_fp32(q.float(), k.float(), v.float(), w.float(), eps)


def _performer_attention_fp32(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor,
                              eps: float) -> torch.Tensor:
    qp, kp = _random_features(q, w), _random_features(k, w)
    numerator = qp @ (kp.transpose(1, 2) @ v)  # (B, T, m) @ (B, m, d)
    denominator = qp @ kp.sum(dim=1).unsqueeze(-1)  # (B, T, 1)
    return numerator / (denominator + eps)


def _random_features(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """phi(x) = exp(x w^T - |x|^2 / 2) / sqrt(m): (B, T, d) -> (B, T, m)."""
    return torch.exp(x @ w.t() - 0.5 * (x * x).sum(-1, keepdim=True)) / math.sqrt(w.shape[0])


class PerformerLayer(nn.Module):
    """T2T layer with linear attention: softmax kernel approximated by m = dim/2 positive random features, the skip
    adding v (the width changes); fp32 under autocast (the published fp16 NaNs came from there)."""

    def __init__(self, dim: int, token_dim: int = 64, kernel_ratio: float = 0.5, eps: float = 1e-8) -> None:
        super().__init__()
        self.token_dim = token_dim
        self.eps = eps
        self.norm1 = nn.LayerNorm(dim)
        self.kqv = nn.Linear(dim, 3 * token_dim)
        self.dp = nn.Dropout(0.1)
        self.proj = nn.Linear(token_dim, token_dim)
        self.norm2 = nn.LayerNorm(token_dim)
        self.mlp = nn.Sequential(
            nn.Linear(token_dim, token_dim), nn.GELU(), nn.Linear(token_dim, token_dim), nn.Dropout(0.1),
        )
        self.m = int(token_dim * kernel_ratio)
        # Orthogonal random directions of norm sqrt(m), frozen: a buffer, part of the released state dicts.
        self.register_buffer('w', nn.init.orthogonal_(torch.empty(self.m, token_dim)) * math.sqrt(self.m))

    def _linear_attention(self, x: torch.Tensor) -> torch.Tensor:
        k, q, v = self.kqv(x).float().split(self.token_dim, dim=-1)
        y = performer_attention(q, k, v, self.w, self.eps)
        return v.to(x.dtype) + self.dp(self.proj(y.to(x.dtype)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._linear_attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TokenAttention(nn.Module):
    """One-head softmax attention from width `dim` to `token_dim`, scaled by dim^-0.5 (the INPUT width)."""

    def __init__(self, dim: int, token_dim: int = 64) -> None:
        super().__init__()
        self.scale = dim ** -0.5
        self.token_dim = token_dim
        self.qkv = nn.Linear(dim, 3 * token_dim, bias=False)
        self.proj = nn.Linear(token_dim, token_dim)
        self.fused_attn = use_fused_attn()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unsqueeze(1).split(self.token_dim, dim=-1)  # (B, 1, T, d) each
        if self.fused_attn:
            y = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
        else:
            y = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1) @ v
        return (v + self.proj(y)).squeeze(1)  # skip from v: the width changed


class TransformerLayer(nn.Module):
    """T2T layer of T2T-ViT_t: one-head attention (skip from v), then an MLP of ratio 1."""

    def __init__(self, dim: int, token_dim: int = 64) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = TokenAttention(dim, token_dim)
        self.norm2 = nn.LayerNorm(token_dim)
        self.mlp = Mlp(token_dim, hidden_features=token_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def _split_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


class SoftSplit(nn.Module):
    """Overlapping patches (an unfold): (B, C, H, W) -> (B, h*w, C*k*k) and their (h, w) grid."""

    def __init__(self, kernel: int, stride: int, padding: int) -> None:
        super().__init__()
        self.kernel, self.stride, self.padding = kernel, stride, padding

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, Grid]:
        H, W = x.shape[-2:]
        grid = (_split_size(H, self.kernel, self.stride, self.padding),
                _split_size(W, self.kernel, self.stride, self.padding))
        patches = F.unfold(x, self.kernel, padding=self.padding, stride=self.stride)
        return patches.transpose(1, 2), grid


class TokensToToken(nn.Module):
    """Soft split -> T2T layer -> soft split -> T2T layer -> soft split -> linear projection to `embed_dim`."""

    def __init__(self, img_size: int, embed_dim: int, tokens_type: str = 'performer', in_chans: int = 3,
                 token_dim: int = 64) -> None:
        super().__init__()
        layers = {'performer': PerformerLayer, 'transformer': TransformerLayer}
        if tokens_type not in layers:
            raise ValueError(f"tokens_type must be one of {sorted(layers)}, got {tokens_type!r}")
        (k0, _, _), (k1, _, _), (k2, _, _) = SOFT_SPLITS
        self.soft_splits = nn.ModuleList([SoftSplit(*split) for split in SOFT_SPLITS])
        self.attention1 = layers[tokens_type](in_chans * k0 * k0, token_dim)
        self.attention2 = layers[tokens_type](token_dim * k1 * k1, token_dim)
        self.project = nn.Linear(token_dim * k2 * k2, embed_dim)
        self.grid_size = self.dynamic_feat_size((img_size, img_size))

    @staticmethod
    def dynamic_feat_size(image_size: Grid) -> Grid:
        """Token grid after the three soft splits for an (H, W) image (timm's name for it, as its PatchEmbed)."""
        h, w = image_size
        for split in SOFT_SPLITS:
            h, w = _split_size(h, *split), _split_size(w, *split)
        return h, w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) image -> (B, H/16, W/16, D) token grid (step by step: TorchScript takes no loop over layers)."""
        tokens, (h, w) = self.soft_splits[0](x)
        x = self.attention1(tokens).transpose(1, 2).reshape(tokens.shape[0], -1, h, w)
        tokens, (h, w) = self.soft_splits[1](x)
        x = self.attention2(tokens).transpose(1, 2).reshape(tokens.shape[0], -1, h, w)
        tokens, (h, w) = self.soft_splits[2](x)
        return self.project(tokens).reshape(tokens.shape[0], h, w, -1)


class T2TViT(TokenModelMixin, nn.Module):
    def __init__(
            self,
            img_size: int = 224,
            tokens_type: str = 'performer',
            in_chans: int = 3,
            num_classes: int = 1000,
            embed_dim: int = 384,
            depth: int = 14,
            num_heads: int = 6,
            mlp_ratio: float = 3.0,
            token_dim: int = 64,
            drop_path_rate: float = 0.0,
            distilled: bool = False,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.num_features = self.embed_dim = embed_dim
        self.num_prefix_tokens = 2 if distilled else 1
        self.tokens_to_token = TokensToToken(img_size, embed_dim, tokens_type, in_chans, token_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self._init_token_model(distilled)
        grid = self.tokens_to_token.grid_size
        # fixed, not learned: a buffer (under the released checkpoints' key)
        self.register_buffer('pos_embed', sinusoid_table(self.num_prefix_tokens + grid[0] * grid[1], embed_dim))
        self.blocks = nn.Sequential(*[
            ScaledResidualBlock(embed_dim, num_heads, mlp_ratio, drop_path=rate)
            for rate in calculate_drop_path_rates(drop_path_rate, depth)
        ])
        self.norm = nn.LayerNorm(embed_dim)
        self.feature_info = block_feature_info(depth, embed_dim)
        self.reset_classifier(num_classes)
        trunc_normal_(self.cls_token, std=0.02)
        self.apply(init_linear_and_norm)

    __jit_unused_properties__ = [*TokenModelMixin.__jit_unused_properties__, 'patch_embed']

    @property
    def patch_embed(self) -> TokensToToken:
        """The tokens-to-token module under the name the other families use for their patch embedding."""
        return self.tokens_to_token

    def _embed_tokens(self, x: torch.Tensor) -> tuple[torch.Tensor, Grid]:
        return self._tokens_with_positions(self.tokens_to_token(x), self.tokens_to_token.grid_size)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self._reset_heads(num_classes)


T2T_VIT = Family('t2t_vit', ('tokens_to_token.',), recipe='t2t_vit', distillation_token=True)
RELEASES = 'https://github.com/yitu-opensource/T2T-ViT/releases/download/main'


def _cfg(file: str = '', transformer: bool = False, **kwargs) -> dict:
    """The cfg of T2T-ViT weights: an official release file (T2T-ViT's `main` release) or none."""
    first_conv = 'tokens_to_token.attention1.' + ('attn.qkv' if transformer else 'kqv')
    return token_model_cfg(first_conv, url=f'{RELEASES}/{file}' if file else '', **kwargs)


# name: its model arguments (performer or transformer T2T); each name an entrypoint
_VARIANTS = {
    't2t_vit_7': dict(tokens_type='performer', embed_dim=256, depth=7, num_heads=4, mlp_ratio=2.0),
    't2t_vit_10': dict(tokens_type='performer', embed_dim=256, depth=10, num_heads=4, mlp_ratio=2.0),
    't2t_vit_12': dict(tokens_type='performer', embed_dim=256, depth=12, num_heads=4, mlp_ratio=2.0),
    't2t_vit_14': dict(tokens_type='performer', embed_dim=384, depth=14, num_heads=6, mlp_ratio=3.0),
    't2t_vit_19': dict(tokens_type='performer', embed_dim=448, depth=19, num_heads=7, mlp_ratio=3.0),
    't2t_vit_24': dict(tokens_type='performer', embed_dim=512, depth=24, num_heads=8, mlp_ratio=3.0),
    't2t_vit_t_14': dict(tokens_type='transformer', embed_dim=384, depth=14, num_heads=6, mlp_ratio=3.0),
    't2t_vit_t_19': dict(tokens_type='transformer', embed_dim=448, depth=19, num_heads=7, mlp_ratio=3.0),
    't2t_vit_t_24': dict(tokens_type='transformer', embed_dim=512, depth=24, num_heads=8, mlp_ratio=3.0),
}

# The released ImageNet weights (REFERENCE section 6), named by their top-1; `.in1k_384` tags the 384 files.
default_cfgs = generate_default_cfgs({
    't2t_vit_7.in1k': _cfg('71.7_T2T_ViT_7.pth.tar'),
    't2t_vit_10.in1k': _cfg('75.2_T2T_ViT_10.pth.tar'),
    't2t_vit_12.in1k': _cfg('76.5_T2T_ViT_12.pth.tar'),
    't2t_vit_14.in1k': _cfg('81.5_T2T_ViT_14.pth.tar'),
    't2t_vit_14.in1k_384': _cfg('83.3_T2T_ViT_14.pth.tar', input_size=(3, 384, 384), crop_pct=1.0),
    't2t_vit_19.in1k': _cfg('81.9_T2T_ViT_19.pth.tar'),
    't2t_vit_24.in1k': _cfg('82.3_T2T_ViT_24.pth.tar'),
    't2t_vit_24.in1k_384': _cfg('84.2_T2T_ViT_24.pth.tar', input_size=(3, 384, 384), crop_pct=1.0),
    't2t_vit_t_14.in1k': _cfg('81.7_T2T_ViTt_14.pth.tar', transformer=True),
    't2t_vit_t_19.in1k': _cfg('82.4_T2T_ViTt_19.pth.tar', transformer=True),
    't2t_vit_t_24.in1k': _cfg('82.6_T2T_ViTt_24.pth.tar', transformer=True),
})


suite_entrypoints(T2T_VIT, __name__, _VARIANTS, lambda name, pretrained, kwargs: build_token_model(
    T2TViT, name, pretrained, _VARIANTS[name], kwargs, release_filter))
