"""LV-ViT: "All Tokens Matter: Token Labeling for Training Better Vision Transformers" (Jiang et al., 2021).

A ViT with a convolutional patch embedding, residual scaling (`skip_lam`), a class head on the class token and an
auxiliary head on every patch token. `forward` returns the paper's inference logits in training mode too (timm's
contract); token labeling trains through `forward_train`. Parameter names match the released checkpoints, which
`pretrained=True` fetches through timm's download cache (`lvvit_s.tl_in1k_384` for the 384 file)."""
from __future__ import annotations

import torch
import torch.nn as nn
from timm.layers import calculate_drop_path_rates, trunc_normal_
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
from backbones.token_head import TokenLabelingOutput, forward_token_labeling, inference_logits
from backbones.weights import release_filter

__all__ = ['LVViT']


class ConvStemPatchEmbed(nn.Module):
    """Three conv-BN-ReLU layers (7x7 stride 2, 3x3, 3x3) and an 8x8 stride-8 projection: total stride 16."""

    def __init__(self, img_size: int, embed_dim: int, in_chans: int = 3, stem_chs: int = 64) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_chans, stem_chs, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(stem_chs)
        self.conv2 = nn.Conv2d(stem_chs, stem_chs, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(stem_chs)
        self.conv3 = nn.Conv2d(stem_chs, stem_chs, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(stem_chs)
        self.relu = nn.ReLU(inplace=True)
        self.proj = nn.Conv2d(stem_chs, embed_dim, 8, stride=8)
        self.grid_size = self.dynamic_feat_size((img_size, img_size))

    @staticmethod
    def dynamic_feat_size(image_size: Grid) -> Grid:
        """Token grid for an (H, W) image: the first conv halves a side rounding up, then 8-pixel patches."""
        return tuple((side + 1) // 2 // 8 for side in image_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) image -> (B, H/16, W/16, D) token grid."""
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.relu(self.bn2(self.conv2(x)))
        x = self.relu(self.bn3(self.conv3(x)))
        return self.proj(x).permute(0, 2, 3, 1)


class LVViT(TokenModelMixin, nn.Module):
    def __init__(
            self,
            img_size: int = 224,
            in_chans: int = 3,
            num_classes: int = 1000,
            embed_dim: int = 384,
            depth: int = 16,
            num_heads: int = 6,
            mlp_ratio: float = 3.0,
            skip_lam: float = 1.0,
            stem_chs: int = 64,
            drop_path_rate: float = 0.0,
            token_head: bool = True,
            mix_token: float = 1.0,
            distilled: bool = False,
    ) -> None:
        super().__init__()
        if distilled and token_head:
            raise ValueError('LV-ViT takes a distillation token (DeiT\'s hard distillation) or a token head (token '
                             'labeling), not both')
        self.num_classes = num_classes
        self.num_features = self.embed_dim = embed_dim
        self.num_prefix_tokens = 2 if distilled else 1
        self.mix_token = mix_token  # MixToken's Beta(alpha, alpha) parameter (forward_train); 0 turns it off
        self.patch_embed = ConvStemPatchEmbed(img_size, embed_dim, in_chans, stem_chs)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self._init_token_model(distilled)
        num_patches = self.patch_embed.grid_size[0] * self.patch_embed.grid_size[1]
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_prefix_tokens + num_patches, embed_dim))
        self.blocks = nn.Sequential(*[
            ScaledResidualBlock(embed_dim, num_heads, mlp_ratio, drop_path=rate, skip_lam=skip_lam)
            for rate in calculate_drop_path_rates(drop_path_rate, depth)
        ])
        self.norm = nn.LayerNorm(embed_dim)
        self.feature_info = block_feature_info(depth, embed_dim)
        self.token_head = token_head
        self.reset_classifier(num_classes)
        trunc_normal_(self.pos_embed, std=0.02)
        trunc_normal_(self.cls_token, std=0.02)
        self.apply(init_linear_and_norm)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """New class head (and token head) for `num_classes`; 0 removes both."""
        self._reset_heads(num_classes)
        self.aux_head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 and self.token_head else None

    def _class_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Inference logits: the class head plus half the class-wise max of the token head (`inference_logits`)."""
        if pre_logits:
            return x[:, 0]
        logits = self.head(x[:, 0])
        if self.aux_head is None:
            return logits
        return inference_logits(logits, self.aux_head(x[:, 1:]))

    def forward_train(self, x: torch.Tensor) -> TokenLabelingOutput:
        """Token labeling's training forward (`forward_token_labeling`), MixToken unless `mix_token` is 0."""
        return forward_token_labeling(self, x, self.mix_token)


LVVIT = Family('lvvit', ('patch_embed.conv1.',), recipe='lvvit', distillation_token=True, token_head_kwarg='token_head')
RELEASES = 'https://github.com/zihangJiang/TokenLabeling/releases/download'


def _cfg(file: str = '', **kwargs) -> dict:
    """The cfg of LV-ViT weights: an official release file (TokenLabeling's release tag / file name) or none."""
    return token_model_cfg('patch_embed.conv1', classifier=('head', 'aux_head'),
                           url=f'{RELEASES}/{file}' if file else '', **kwargs)


# The released ImageNet weights (REFERENCE section 6); a tag picks the resolution, e.g. `lvvit_m.tl_in1k_448`.
default_cfgs = generate_default_cfgs({
    'lvvit_t.tl_in1k': _cfg('v0.2.0/lvvit_t.pth'),
    'lvvit_s.tl_in1k': _cfg('1.0/lvvit_s-26M-224-83.3.pth.tar'),
    'lvvit_s.tl_in1k_384': _cfg('1.0/lvvit_s-26M-384-84.4.pth.tar', input_size=(3, 384, 384), crop_pct=1.0),
    'lvvit_m.tl_in1k': _cfg('1.0/lvvit_m-56M-224-84.0.pth.tar'),
    'lvvit_m.tl_in1k_384': _cfg('1.0/lvvit_m-56M-384-85.4.pth.tar', input_size=(3, 384, 384), crop_pct=1.0),
    'lvvit_m.tl_in1k_448': _cfg('1.0/lvvit_m-56M-448-85.5.pth.tar', input_size=(3, 448, 448), crop_pct=1.0),
    'lvvit_l.tl_in1k_448': _cfg('1.0/lvvit_l-150M-448-86.2.pth.tar', input_size=(3, 448, 448), crop_pct=1.0),
    'lvvit_l.tl_in1k_512': _cfg('1.0/lvvit_l-150M-512-86.4.pth.tar', input_size=(3, 512, 512), crop_pct=1.0),
    # the default (last: a starred tag must follow the weighted ones in timm): the training resolution, no file
    'lvvit_l.untrained*': _cfg(input_size=(3, 288, 288), crop_pct=1.0),
})


# name: its model arguments; each name an entrypoint
_VARIANTS = {
    'lvvit_t': dict(embed_dim=240, depth=12, num_heads=4, skip_lam=1.0),
    'lvvit_s': dict(embed_dim=384, depth=16, num_heads=6, skip_lam=2.0),
    'lvvit_m': dict(embed_dim=512, depth=20, num_heads=8, skip_lam=2.0),
    'lvvit_l': dict(embed_dim=768, depth=24, num_heads=12, skip_lam=3.0, stem_chs=128),
}
suite_entrypoints(LVVIT, __name__, _VARIANTS, lambda name, pretrained, kwargs: build_token_model(
    LVViT, name, pretrained, _VARIANTS[name], kwargs, release_filter))
