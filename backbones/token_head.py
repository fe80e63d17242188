"""The model side of token labeling, for any model (the suite's, timm's ViTs and MLP-Mixers, CNNs): a token head
(`add_token_head`), the MixToken training forward (`forward_token_labeling`, `TokenLabelingModel`) and the inference
rule (`inference_logits`). Token models (an (H, W) patch grid, the patch tokens last) take the MixToken box through a
hook on the patch embedding (`MixTokenHook`); feature-map models (CNNs) as a CutMix box aligned to the map's stride.
The token head is one linear layer on every token, named `aux_head` as LV-ViT's. docs/imagenet.md ("Token labeling
and distillation with your own model") tells the rest."""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import torch
import torch.nn as nn
from timm.layers import trunc_normal_

from backbones.common.errors import UsageError
from backbones.layers import Grid

Box = tuple[int, int, int, int]  # (top, left, bottom, right) on the token grid, bottom/right exclusive

TOKEN_HEAD = 'aux_head'  # the token head's attribute and checkpoint key prefix in every family
TOKEN_LOGIT_WEIGHT = 0.5  # inference: class logits + 0.5 * class-wise max of the token logits (LV-ViT paper)


class TokenLabelingOutput(NamedTuple):
    """What a model with a token head returns in training mode: what the token-labeling loss consumes."""

    cls_logits: torch.Tensor  # (B, num_classes), from the class token
    token_logits: torch.Tensor  # (B, H, W, num_classes), one prediction per patch token, grid layout
    mix_box: Box | None  # MixToken box on the token grid (patches there came from sample B-1-i)


def sample_mix_box(grid: Grid, alpha: float = 1.0) -> Box:
    """CutMix box on the token grid: area fraction (1 - lambda), lambda ~ Beta(alpha, alpha), clipped at borders; from
    torch's global generator, so that seeding and checkpointed random state reproduce it."""
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


def box_mask(box: Box, grid: Grid, device: torch.device | None = None) -> torch.Tensor:
    """The (H, W) boolean mask of `box` on `grid` (made on `device` from ranges: no copy from the host)."""
    top, left, bottom, right = box
    rows, cols = torch.arange(grid[0], device=device), torch.arange(grid[1], device=device)
    return ((rows >= top) & (rows < bottom))[:, None] & ((cols >= left) & (cols < right))[None, :]


def mix_masked_grid(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Replace the cells of a (B, H, W, ...) grid under the (H, W) `mask` by those of the flipped batch (sample
    B-1-i). Tensor operations only: a compiled graph takes every mask of the grid's size."""
    if tuple(mask.shape) != tuple(x.shape[1:3]):
        raise ValueError(f'MixToken: a {tuple(mask.shape)} mask for a {tuple(x.shape[1:3])} token grid')
    return torch.where(mask.view(*mask.shape, *(1,) * (x.ndim - 3)), x.flip(0), x)


def mix_token_grid(x: torch.Tensor, box: Box) -> torch.Tensor:
    """Replace the box of a (B, H, W, ...) grid by the same box of the flipped batch (sample B-1-i)."""
    return mix_masked_grid(x, box_mask(box, x.shape[1:3], x.device))


class MixTokenHook:
    """MixToken as a forward hook on a patch embedding: while `mask` is set, its cells come from the flipped batch
    (before the position table). Kept registered: a hook registered per call breaks a compiled graph."""

    def __init__(self) -> None:
        self.mask: torch.Tensor | None = None  # (H, W) bool on the token grid

    def __call__(self, module: nn.Module, inputs: tuple, tokens: torch.Tensor) -> torch.Tensor:
        if self.mask is None:
            return tokens
        grid = tokens if tokens.ndim == 4 else tokens.unflatten(1, tuple(self.mask.shape))
        return mix_masked_grid(grid, self.mask).reshape(tokens.shape)


@contextlib.contextmanager
def mixing_tokens(embedding: nn.Module, hook: MixTokenHook | None, mask: torch.Tensor | None) -> Iterator[None]:
    """`mask` in `hook` for the block's forward passes (a hook registered on `embedding` for the block when None)."""
    temporary = hook is None
    hook = MixTokenHook() if temporary else hook
    handle = embedding.register_forward_hook(hook) if temporary else None
    hook.mask = mask
    try:
        yield
    finally:
        hook.mask = None
        if handle is not None:
            handle.remove()


def has_token_head(model: nn.Module) -> bool:
    return getattr(model, TOKEN_HEAD, None) is not None


def add_token_head(model: nn.Module) -> nn.Module:
    """Give `model` a token head (`aux_head`: one linear classifier shared by all patch tokens) if it has none."""
    if not has_token_head(model):
        model.aux_head = nn.Linear(model.num_features, model.num_classes)
        trunc_normal_(model.aux_head.weight, std=0.02)
        nn.init.zeros_(model.aux_head.bias)
    return model


def patch_embedding(model: nn.Module) -> nn.Module | None:
    """The module that makes the patch tokens (`patch_embed`, MLP-Mixer's `stem`); None for a feature-map model."""
    for name in ('patch_embed', 'stem'):
        module = getattr(model, name, None)
        if module is not None and hasattr(module, 'grid_size'):
            return module
    return None


def token_grid(embedding: nn.Module, image_size: Sequence[int]) -> Grid:
    """The (h, w) token grid a patch embedding gives an (H, W) image: its `dynamic_feat_size`, else its `grid_size`."""
    if hasattr(embedding, 'dynamic_feat_size'):
        return tuple(embedding.dynamic_feat_size(tuple(image_size)))
    return tuple(embedding.grid_size)


def feature_stride(model: nn.Module) -> int:
    """Pixels per position of a feature-map model's last map (timm's `feature_info`)."""
    info = getattr(model, 'feature_info', None)
    if not info:
        raise UsageError(f'{type(model).__name__} has neither a patch embedding nor timm\'s feature_info: token '
                         f'labeling cannot tell where its features lie in the image')
    return int(info[-1]['reduction'])


def feature_grid(model: nn.Module, features: torch.Tensor) -> torch.Tensor:
    """A feature-map model's (B, C, h, w) map (NHWC where the model says so) as a (B, h, w, C) grid of tokens."""
    return features if getattr(model, 'output_fmt', 'NCHW') == 'NHWC' else features.permute(0, 2, 3, 1)


def class_logits(model: nn.Module, features: torch.Tensor) -> torch.Tensor:
    """The class head alone on `forward_features` output (for LV-ViT: without the token-head term)."""
    return model.get_classifier()(model.forward_head(features, pre_logits=True))


def patch_tokens(model: nn.Module, features: torch.Tensor) -> torch.Tensor:
    """The (B, N, D) patch tokens (token models) or map positions (feature-map models) of `forward_features` output."""
    if features.ndim == 4:
        return feature_grid(model, features).flatten(1, 2)
    return features[:, getattr(model, 'num_prefix_tokens', 0):]


def inference_logits(cls_logits: torch.Tensor, token_logits: torch.Tensor,
                     weight: float = TOKEN_LOGIT_WEIGHT) -> torch.Tensor:
    """The paper's prediction: class logits + `weight` * class-wise max of the (B, N, C) token logits (an argument:
    TorchScript reads no module-level float)."""
    return cls_logits + weight * token_logits.amax(dim=1)


def predict_with_token_head(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    features = model.forward_features(x)
    return inference_logits(class_logits(model, features), model.aux_head(patch_tokens(model, features)))


def forward_token_labeling(model: nn.Module, x: torch.Tensor, mix_token: float = 1.0,
                           hook: MixTokenHook | None = None) -> TokenLabelingOutput:
    """Training forward for token labeling, with MixToken (box area ~ Beta(mix_token, mix_token)) unless `mix_token`
    is 0; a token model's box drawn here, eagerly, and mixed by `hook` (or one registered for this call)."""
    embedding = patch_embedding(model)
    if embedding is None:
        return _forward_feature_map(model, x, mix_token)
    grid = token_grid(embedding, x.shape[-2:])
    box = sample_mix_box(grid, mix_token) if mix_token > 0 else None
    with mixing_tokens(embedding, hook, None if box is None else box_mask(box, grid, x.device)):
        features = model.forward_features(x)
    H, W = grid
    token_logits = model.aux_head(features[:, -H * W:]).unflatten(1, (H, W))
    return TokenLabelingOutput(class_logits(model, features), token_logits, box)


def _forward_feature_map(model: nn.Module, x: torch.Tensor, mix_token: float) -> TokenLabelingOutput:
    """Token labeling on a CNN: MixToken's box on the last map's grid, its pixels from the flipped batch."""
    stride = feature_stride(model)
    H, W = x.shape[-2:]
    grid = (math.ceil(H / stride), math.ceil(W / stride))
    box = sample_mix_box(grid, mix_token) if mix_token > 0 else None
    if box is not None:
        pixels = tuple(edge * stride for edge in box)
        x = mix_token_grid(x.movedim(1, -1), pixels).movedim(-1, 1)
    features = model.forward_features(x)
    tokens = feature_grid(model, features)
    if tuple(tokens.shape[1:3]) != grid:
        raise UsageError(f'{type(model).__name__} gives a {tokens.shape[1]}x{tokens.shape[2]} map for a {H}x{W} input, '
                         f'not the {grid[0]}x{grid[1]} its stride of {stride} implies: MixToken cannot align its box')
    return TokenLabelingOutput(class_logits(model, features), model.aux_head(tokens), box)


class TokenLabelingModel(nn.Module):
    """Any model for token labeling: training -> `TokenLabelingOutput`, eval -> predictions (one module for DDP)."""

    def __init__(self, model: nn.Module, mix_token: float = 1.0) -> None:
        super().__init__()
        self.model = add_token_head(model)
        self.mix_token = mix_token
        embedding = patch_embedding(self.model)
        self.hook = None if embedding is None else MixTokenHook()
        if embedding is not None:
            embedding.register_forward_hook(self.hook)

    def compile(self, *args, **kwargs) -> None:
        """torch.compile the model's `forward_features`, not this forward: MixToken's box, drawn here eagerly,
        reaches the compiled graph as a mask tensor instead of recompiling it for every box."""
        self.model.forward_features = torch.compile(self.model.forward_features, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor | TokenLabelingOutput:
        if self.training:
            return forward_token_labeling(self.model, x, self.mix_token, self.hook)
        return predict_with_token_head(self.model, x)


def bare_model(model: nn.Module) -> nn.Module:
    """The classifier itself, without DDP's (any `.module`) or the token-labeling wrapper: what checkpoints hold."""
    model = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    return model.model if isinstance(model, TokenLabelingModel) else model
