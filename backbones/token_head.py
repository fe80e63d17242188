"""The model side of token labeling, for any model of the suite: a token head, the MixToken training forward, and
the inference rule. (The data side, from the annotator's score maps to the loss, is the `token_labeling` package.)

Every family's patch embedding returns a (B, H, W, D) grid, and every `forward_features` returns the normalised
tokens with the H*W patch tokens last. So MixToken is a forward hook on `patch_embed` (mixing before or after
the position embedding is the same thing: both samples get the same table at the same place), and the token
head is one linear layer on the patch tokens. LV-ViT has its token head (`aux_head`) built in; the other
families get one from `add_token_head`, under the same name, so checkpoints look alike.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn as nn
from timm.layers import trunc_normal_

Grid = Tuple[int, int]
Box = Tuple[int, int, int, int]  # (top, left, bottom, right) on the token grid, bottom/right exclusive

TOKEN_HEAD = 'aux_head'  # the token head's attribute and checkpoint key prefix in every family
TOKEN_LOGIT_WEIGHT = 0.5  # inference: class logits + 0.5 * class-wise max of the token logits (LV-ViT paper)


class TokenLabelingOutput(NamedTuple):
    """What a model with a token head returns in training mode: what the token-labeling loss consumes."""

    cls_logits: torch.Tensor  # (B, num_classes), from the class token
    token_logits: torch.Tensor  # (B, H, W, num_classes), one prediction per patch token, grid layout
    mix_box: Optional[Box]  # MixToken box on the token grid (patches there came from sample B-1-i)


def sample_mix_box(grid: Grid, alpha: float = 1.0) -> Box:
    """CutMix box on the token grid: area fraction (1 - lambda), lambda ~ Beta(alpha, alpha), clipped at borders.

    Uses torch's global RNG so that seeding and checkpointed RNG state make it reproducible.
    """
    H, W = grid
    lam = torch.distributions.Beta(alpha, alpha).sample().item()
    cut = (1.0 - lam) ** 0.5
    cut_h, cut_w = int(H * cut), int(W * cut)
    cy, cx = torch.randint(H, ()).item(), torch.randint(W, ()).item()
    top, bottom = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, H)
    left, right = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, W)
    return top, left, bottom, right


def mix_box_lambda(box: Box, grid: Grid) -> float:
    """Fraction of the grid a sample keeps from itself after MixToken with `box` (the clipped area)."""
    top, left, bottom, right = box
    return 1.0 - (bottom - top) * (right - left) / (grid[0] * grid[1])


def mix_token_grid(x: torch.Tensor, box: Box) -> torch.Tensor:
    """Replace the box of a (B, H, W, ...) grid by the same box of the flipped batch (sample B-1-i)."""
    top, left, bottom, right = box
    mixed = x.clone()
    mixed[:, top:bottom, left:right] = x.flip(0)[:, top:bottom, left:right]
    return mixed


def has_token_head(model: nn.Module) -> bool:
    return getattr(model, TOKEN_HEAD, None) is not None


def add_token_head(model: nn.Module) -> nn.Module:
    """Give `model` a token head (`aux_head`: one linear classifier shared by all patch tokens) if it has none.

    The checkpoint loader treats `aux_head` as a classifier of every model (dropped when the class count changes).
    """
    if not has_token_head(model):
        model.aux_head = nn.Linear(model.num_features, model.num_classes)
        trunc_normal_(model.aux_head.weight, std=0.02)
        nn.init.zeros_(model.aux_head.bias)
    return model


def class_logits(model: nn.Module, features: torch.Tensor) -> torch.Tensor:
    """The class head alone on `forward_features` output (for LV-ViT: without the token-head term)."""
    return model.get_classifier()(model.forward_head(features, pre_logits=True))


def patch_tokens(model: nn.Module, features: torch.Tensor) -> torch.Tensor:
    return features[:, model.num_prefix_tokens:]


def inference_logits(cls_logits: torch.Tensor, token_logits: torch.Tensor) -> torch.Tensor:
    """The paper's prediction: class logits + 0.5 * class-wise max over the (B, N, C) token logits."""
    return cls_logits + TOKEN_LOGIT_WEIGHT * token_logits.amax(dim=1)


def predict_with_token_head(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    features = model.forward_features(x)
    return inference_logits(class_logits(model, features), model.aux_head(patch_tokens(model, features)))


def forward_token_labeling(model: nn.Module, x: torch.Tensor, mix_token: float = 1.0) -> TokenLabelingOutput:
    """Training forward for token labeling; MixToken (box area ~ Beta(mix_token, mix_token)) on the patch grid unless
    `mix_token` is 0."""
    seen = {}

    def mix_patches(module: nn.Module, inputs: tuple, grid: torch.Tensor) -> torch.Tensor:
        seen['grid'] = grid.shape[1:3]
        if mix_token <= 0:
            return grid
        seen['box'] = sample_mix_box(seen['grid'], mix_token)
        return mix_token_grid(grid, seen['box'])

    hook = model.patch_embed.register_forward_hook(mix_patches)
    try:
        features = model.forward_features(x)
    finally:
        hook.remove()
    H, W = seen['grid']
    token_logits = model.aux_head(features[:, -H * W:]).unflatten(1, (H, W))
    return TokenLabelingOutput(class_logits(model, features), token_logits, seen.get('box'))


class TokenLabelingModel(nn.Module):
    """Wraps any suite model for token labeling: training forward -> `TokenLabelingOutput`, eval -> predictions.

    A module (not a function) so that DistributedDataParallel sees the whole forward.
    """

    def __init__(self, model: nn.Module, mix_token: float = 1.0) -> None:
        super().__init__()
        self.model = add_token_head(model)
        self.mix_token = mix_token

    def forward(self, x: torch.Tensor) -> torch.Tensor | TokenLabelingOutput:
        if self.training:
            return forward_token_labeling(self.model, x, self.mix_token)
        return predict_with_token_head(self.model, x)
