"""Layers and model plumbing shared by the suite's own model families (LV-ViT, T2T-ViT, CaiT)."""
# (No postponed annotations here: torch.fx copies the annotations of `forward` into the code it generates, where
# TorchScript cannot read them as strings.)
from collections.abc import Callable

import torch
import torch.nn as nn
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import (
    Attention,
    DropPath,
    Mlp,
    register_notrace_function,
    resample_abs_pos_embed,
    trunc_normal_,
)
from timm.models import build_model_with_cfg, checkpoint, checkpoint_seq, resolve_pretrained_cfg
from timm.models._features import feature_take_indices  # private: no public twin (docs/layout.md)

from backbones.common.files import release_globals_allowed

Grid = tuple[int, int]
DIST_HEAD = 'head_dist'  # the distillation head's attribute and checkpoint key prefix (DeiT's name)


class ScaledResidualBlock(nn.Module):
    """Pre-norm transformer block whose residual branches are divided by `skip_lam` (LV-ViT's 2 or 3; ViT's 1)."""

    def __init__(
            self,
            dim: int,
            num_heads: int,
            mlp_ratio: float = 4.0,
            qkv_bias: bool = False,
            drop_path: float = 0.0,
            skip_lam: float = 1.0,
            norm_layer: type[nn.Module] = nn.LayerNorm,
    ) -> None:
        super().__init__()
        self.skip_lam = skip_lam
        self.norm1 = norm_layer(dim)
        self.attn = Attention(dim, num_heads=num_heads, qkv_bias=qkv_bias)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, hidden_features=int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x))) / self.skip_lam
        return x + self.drop_path(self.mlp(self.norm2(x))) / self.skip_lam


def init_linear_and_norm(module: nn.Module) -> None:
    """ViT initialisation (use with `model.apply`): truncated-normal(0.02) linear weights, zero biases, unit norms."""
    if isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


@register_notrace_function  # torch.fx: called whole at run time (its same-grid test needs the sizes, not proxies)
def resize_pos_embed(pos_embed: torch.Tensor, new_grid: Grid, old_grid: Grid) -> torch.Tensor:
    """Bicubically resample the patch part of a [1, prefix + H*W, D] table to `new_grid`, prefix slots kept (timm's
    resampling, without its same-grid shortcut under torch.export, which would fix the traced size)."""
    num_prefix = pos_embed.shape[1] - old_grid[0] * old_grid[1]
    return resample_abs_pos_embed(pos_embed, [new_grid[0], new_grid[1]], [old_grid[0], old_grid[1]],
                                  num_prefix_tokens=num_prefix)


def tokens_with_positions(
        x: torch.Tensor,
        pos_embed: torch.Tensor,
        pos_grid: Grid,
        prefix: torch.Tensor | None = None,
) -> torch.Tensor:
    """A (B, H, W, D) token grid flattened, the `prefix` tokens in front, `pos_embed` resized to (H, W) added."""
    B, H, W, D = x.shape
    x = x.reshape(B, H * W, D)
    if prefix is not None:
        x = torch.cat([prefix.expand(B, -1, -1), x], dim=1)
    return x + resize_pos_embed(pos_embed, (H, W), pos_grid)


class TokenModelMixin:
    """`forward`, `forward_features` and timm's `forward_intermediates` contract for a token model, scriptable
    (TorchScript) and traceable (torch.fx). A model provides `_embed_tokens(x) -> (tokens, (H, W))`, the patch tokens
    LAST, `blocks` (an nn.Sequential), `norm`, optionally `_finish_tokens`; its `__init__` calls `_init_token_model`.
    DeiT's distillation token (`distilled=True`, `dist_token` after the class token) feeds `head_dist`; in training,
    after `set_distilled_training()`, the heads return both logits, otherwise their mean (DeiT's inference rule)."""

    __jit_unused_properties__ = ['distilled']

    def _init_token_model(self, distilled: bool) -> None:
        """The attributes every token model has (instance attributes: TorchScript reads no mixin class attributes)."""
        self.head_hidden_size = self.embed_dim  # timm's name for the width of `forward_head(pre_logits=True)`
        self.grad_checkpointing = False
        self.distilled_training = False
        self.dist_token = nn.Parameter(trunc_normal_(torch.zeros(1, 1, self.embed_dim), std=0.02)) if distilled \
            else None

    @property
    def distilled(self) -> bool:
        """Whether the model has a distillation token (and head)."""
        return getattr(self, 'dist_token', None) is not None

    def _reset_heads(self, num_classes: int) -> None:
        """The class head (and distillation head) for `num_classes`; 0 leaves none."""
        self.num_classes = num_classes
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        if self.distilled:
            self.head_dist = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    def prefix_tokens(self) -> torch.Tensor:
        """The (1, P, D) tokens in front of the patch tokens: the class token, and the distillation token if any."""
        if self.dist_token is None:
            return self.cls_token
        return torch.cat([self.cls_token, self.dist_token], dim=1)

    def _embed_tokens(self, x: torch.Tensor) -> tuple[torch.Tensor, Grid]:
        """Patch embedding, the position table resampled to the input's grid, the prefix tokens in front."""
        return self._tokens_with_positions(self.patch_embed(x), self.patch_embed.grid_size)

    def _tokens_with_positions(self, grid: torch.Tensor, pos_grid: Grid) -> tuple[torch.Tensor, Grid]:
        """`tokens_with_positions` with this model's prefix tokens and table (made for `pos_grid`); and (H, W)."""
        tokens = tokens_with_positions(grid, self.pos_embed, pos_grid, self.prefix_tokens())
        return tokens, (grid.shape[1], grid.shape[2])

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False):
        """The class head on the class token; with a distillation token, DeiT's two heads (see the class doc)."""
        if self.dist_token is None:
            return self._class_head(x, pre_logits)
        if pre_logits:
            return (x[:, 0] + x[:, 1]) / 2
        logits, dist_logits = self.head(x[:, 0]), self.head_dist(x[:, 1])
        if self.distilled_training and self.training and not torch.jit.is_scripting():
            return logits, dist_logits
        return (logits + dist_logits) / 2

    def _class_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return x[:, 0] if pre_logits else self.head(x[:, 0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits, in training mode as in eval mode (timm's contract; token labeling has `forward_token_labeling`)."""
        return self.forward_head(self.forward_features(x))

    @torch.jit.ignore
    def set_distilled_training(self, enable: bool = True) -> None:
        self.distilled_training = enable

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """The trained position table and prefix tokens (T2T-ViT's sinusoid table is a buffer: not listed)."""
        return {name for name in ('pos_embed', 'cls_token', 'dist_token')
                if isinstance(getattr(self, name, None), nn.Parameter) and getattr(self, name).requires_grad}

    def get_classifier(self) -> nn.Module | tuple[nn.Module, nn.Module]:
        return (self.head, self.head_dist) if self.distilled else self.head

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        """timm's parameter grouping (layer decay): the embedding, each block, the final norm; the heads last."""
        return dict(stem=r'^cls_token|^dist_token|^pos_embed|^patch_embed|^tokens_to_token',
                    blocks=[(r'^blocks\.(\d+)', None), (r'^norm', (99999,))])

    def _finish_tokens(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def _run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        if self.grad_checkpointing and not torch.jit.is_scripting():
            return checkpoint_seq(self.blocks, x)
        return self.blocks(x)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x, _ = self._embed_tokens(x)
        return self.norm(self._finish_tokens(self._run_blocks(x)))

    def prune_intermediate_layers(
            self,
            indices: int | list[int] = 1,
            prune_norm: bool = False,
            prune_head: bool = True,
    ) -> list[int]:
        """Drop what `forward_intermediates(indices)` does not use: later blocks, the final norm, the heads."""
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[:max_index + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0)
        return take_indices

    def forward_intermediates(
            self,
            x: torch.Tensor,
            indices: int | list[int] | None = None,
            norm: bool = False,
            stop_early: bool = False,
            output_fmt: str = 'NCHW',
            intermediates_only: bool = False,
            return_prefix_tokens: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """timm's contract: the patch tokens after the blocks in `indices` (with their prefix tokens if asked)."""
        if output_fmt not in ('NCHW', 'NLC'):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        x, (H, W) = self._embed_tokens(x)
        blocks = self.blocks[:max_index + 1] if stop_early else self.blocks
        intermediates = []
        for i, block in enumerate(blocks):
            # with grad checkpointing, each block's activations are recomputed in the backward pass
            x = checkpoint(block, x) if self.grad_checkpointing and torch.is_grad_enabled() else block(x)
            if i in take_indices:
                tokens = self.norm(x) if norm else x
                y = tokens[:, -H * W:]
                if output_fmt == 'NCHW':
                    y = y.reshape(y.shape[0], H, W, -1).permute(0, 3, 1, 2).contiguous()
                intermediates.append((y, tokens[:, :-H * W]) if return_prefix_tokens else y)
        if intermediates_only:
            return intermediates
        return self.norm(self._finish_tokens(x)), intermediates


def token_model_cfg(first_conv: str, classifier='head', url: str = '', **kwargs) -> dict:
    """timm's pretrained_cfg of a suite model: ImageNet at 224, crop 0.9, bicubic, ImageNet mean and std."""
    return {
        'url': url, 'num_classes': 1000, 'input_size': (3, 224, 224), 'pool_size': None, 'crop_pct': 0.9,
        'interpolation': 'bicubic', 'mean': IMAGENET_DEFAULT_MEAN, 'std': IMAGENET_DEFAULT_STD,
        'first_conv': first_conv, 'classifier': classifier, **kwargs,
    }


def build_token_model(cls: type, variant: str, pretrained: bool, defaults: dict, kwargs: dict,
                      filter_fn: Callable) -> nn.Module:
    """timm's `build_model_with_cfg` for a suite family, the input size the weights' tag's unless `img_size`."""
    cfg = resolve_pretrained_cfg(variant, kwargs.get('pretrained_cfg'), kwargs.get('pretrained_cfg_overlay'))
    kwargs.setdefault('img_size', cfg.input_size[-1])
    size = kwargs['img_size']
    if isinstance(size, (list, tuple)):  # timm's (H, W), as an exported config.json records it
        if len(size) != 2 or size[0] != size[1]:
            raise ValueError(f'{variant} takes square inputs: img_size {size}')
        kwargs['img_size'] = int(size[0])
    with release_globals_allowed():  # timm's download path reads the release files weights-only
        return build_model_with_cfg(cls, variant, pretrained, pretrained_filter_fn=filter_fn,
                                    feature_cfg=features_only_cfg(kwargs), **{**defaults, **kwargs})


def block_feature_info(depth: int, channels: int, reduction: int = 16) -> list[dict]:
    """timm's `feature_info` of a token model: the output of every block, one token per `reduction` pixels."""
    return [dict(module=f'blocks.{i}', num_chs=channels, reduction=reduction) for i in range(depth)]


def features_only_cfg(kwargs: dict) -> dict:
    """`build_model_with_cfg`'s feature_cfg: `features_only` gives the blocks in `out_indices` (default: last 3)."""
    return dict(out_indices=kwargs.pop('out_indices', 3), feature_cls='getter')
