"""Window attention and decomposed relative positions in a token model's blocks (ViTDet, Li et al. 2022; MViTv2).

`use_window_attention(model, window_size, global_blocks, rel_pos)` turns the blocks of a suite model, or of timm's
VisionTransformer, to ViTDet's scheme: every block but the `global_blocks` attends within `window_size` windows, and
with `rel_pos` adds decomposed relative positions (tables `blocks.N.attn.rel_pos_h`/`_w`, zeros at first). The
original layers are taken over by reference, so the checkpoints' keys and weights load unchanged.

The blocks see tokens only: whoever runs the model hands them the token grid with `set_token_grid(model, (H, W))`
before the forward (the dense backbone does); it stays set for the blocks recomputed by gradient checkpointing."""
from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.models.cait import TalkingHeadAttn
from timm.models.vision_transformer_sam import get_rel_pos, window_partition, window_unpartition
from torch.utils.checkpoint import checkpoint

from backbones.common.errors import UsageError
from backbones.registry import families

__all__ = ['REL_POS_KEYS', 'WindowAttention', 'set_token_grid', 'use_window_attention', 'vitdet_global_blocks']

REL_POS_KEYS = ('.attn.rel_pos_h', '.attn.rel_pos_w')  # a block's tables (detectron2's names), zeros at first

WHY_NOT = {
    'EvaAttention': 'its rotary position embeddings turn q and k by each token\'s place in the whole grid',
    'AttentionRope': 'its rotary position embeddings turn q and k by each token\'s place in the whole grid',
    'timm.models.beit.Attention': 'it adds its own relative position bias over the fixed training grid',
}


def vitdet_global_blocks(depth: int) -> tuple[int, ...]:
    """ViTDet's 4 evenly spaced global blocks, the last of each quarter (12 -> 2, 5, 8, 11); all below 4 blocks."""
    return tuple(sorted({depth * (i + 1) // 4 - 1 for i in range(4)} - {-1}))


def resample_rel_pos(table: torch.Tensor, length: int) -> torch.Tensor:
    """A (L, C) relative-position table linearly resampled to `length` rows, as timm's `get_rel_pos` does."""
    if table.shape[0] == length:
        return table
    resized = F.interpolate(table.reshape(1, table.shape[0], -1).permute(0, 2, 1), size=length, mode='linear')
    return resized.reshape(-1, length).permute(1, 0)


class WindowAttention(nn.Module):
    """A block's attention within windows (or over the whole grid, `window_size=None`), with decomposed relative
    positions where `rel_pos_side` (the tables' side) is given. A window's patch tokens attend to their window and the
    prefix tokens, which attend to every token: one window over the grid is global attention exactly. A grid not a
    multiple of the window is padded and the padded keys masked out (ViTDet attends to them)."""

    def __init__(self, attn: nn.Module, window_size: int | None, rel_pos_side: int | None,
                 num_prefix_tokens: int) -> None:
        super().__init__()
        for name, child in attn.named_children():  # the original's layers, under its names: the checkpoints' keys
            self.add_module(name, child)
        self.talking_heads = isinstance(attn, TalkingHeadAttn)
        self.num_heads = attn.num_heads
        self.head_dim = attn.qkv.out_features // 3 // attn.num_heads
        self.scale = attn.scale
        self.window_size = window_size
        self.num_prefix_tokens = num_prefix_tokens
        self.grid: tuple[int, int] | None = None
        if rel_pos_side is not None:
            self.rel_pos_h = nn.Parameter(torch.zeros(2 * rel_pos_side - 1, self.head_dim))
            self.rel_pos_w = nn.Parameter(torch.zeros(2 * rel_pos_side - 1, self.head_dim))

    @property
    def rel_pos(self) -> bool:
        return hasattr(self, 'rel_pos_h')

    def extra_repr(self) -> str:
        return f'window_size={self.window_size}, rel_pos={self.rel_pos}, num_prefix_tokens={self.num_prefix_tokens}'

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args, **kwargs) -> None:
        """Relative-position tables of another length (a checkpoint trained at another grid or window) resampled."""
        for name in ('rel_pos_h', 'rel_pos_w'):
            key, own = prefix + name, getattr(self, name, None)
            if key in state_dict and own is not None and state_dict[key].shape[0] != own.shape[0]:
                state_dict[key] = resample_rel_pos(state_dict[key], own.shape[0])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise UsageError('window attention takes no attention mask')
        B, N, _ = x.shape
        H, W = self._grid(N)
        P = self.num_prefix_tokens
        gate = self.gate(x).sigmoid() if getattr(self, 'gate', None) is not None else None
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        if not self.talking_heads:
            q, k = self.q_norm(q), self.k_norm(k)
        side = (self.window_size, self.window_size) if self.window_size else (H, W)
        regions = [self._to_regions(t[:, :, P:], H, W) for t in (q, k, v)]
        count = regions[0].shape[0] // B  # windows per image
        # each window's keys and values: the prefix tokens', then its own
        keys, values = (torch.cat([t[:, :, :P].repeat_interleave(count, 0), r], dim=2)
                        for t, r in zip((k, v), regions[1:]))
        mask = self._padding_mask(H, W, B, x.dtype, x.device)
        if self.rel_pos:
            out = self._attend_with_rel_pos(regions[0], keys, values, side, mask)
        else:
            out = self._attend(regions[0], keys, values, None, mask)
        out = self._from_regions(out, H, W)
        if P:  # the prefix tokens' row of global attention
            out = torch.cat([self._attend(q[:, :, :P], k, v, None, None), out], dim=2)
        out = out.transpose(1, 2).reshape(B, N, self.num_heads * self.head_dim)
        if not self.talking_heads:
            out = self.norm(out)
        if gate is not None:
            out = out * gate
        return self.proj_drop(self.proj(out))

    def _grid(self, tokens: int) -> tuple[int, int]:
        """The token grid handed over by `set_token_grid`, checked against the tokens the block sees."""
        if self.grid is None or tokens != self.num_prefix_tokens + self.grid[0] * self.grid[1]:
            raise UsageError(f'window attention: {tokens} tokens are not {self.num_prefix_tokens} prefix tokens and '
                             f'the token grid {self.grid}; hand the grid over with set_token_grid() before the forward')
        return self.grid

    def _to_regions(self, t: torch.Tensor, H: int, W: int) -> torch.Tensor:
        """(B, heads, H*W, C) patch tokens as (B * windows, heads, tokens of a window, C)."""
        B, heads, _, C = t.shape
        t = t.transpose(1, 2).reshape(B, H, W, heads * C)
        if self.window_size:
            t, _ = window_partition(t, self.window_size)
        return t.reshape(t.shape[0], -1, heads, C).transpose(1, 2)

    def _from_regions(self, t: torch.Tensor, H: int, W: int) -> torch.Tensor:
        """The inverse of `_to_regions`: (B, heads, H*W, C)."""
        heads, C = t.shape[1], t.shape[3]
        # a copy, not .contiguous(): SDPA's output may be laid out so that the transpose is contiguous when traced,
        # and the reshape below is then traced as a view, which torch's ONNX exporter replays on other strides
        t = t.transpose(1, 2).clone(memory_format=torch.contiguous_format)
        if self.window_size:
            size = self.window_size
            t = window_unpartition(t.reshape(-1, size, size, heads * C), size, (H, W),
                                   (-(-H // size) * size, -(-W // size) * size))
        return t.reshape(-1, H * W, heads, C).transpose(1, 2)

    def _rel_pos_terms(self, q: torch.Tensor, side: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """`q . Rh` and `q . Rw` from the unscaled queries as ViTDet (timm's decomposed bias before its sum)."""
        regions, heads, L, C = q.shape
        grid_q = q.reshape(regions, heads, side[0], side[1], C)
        rows = torch.einsum('nahwc,hkc->nahwk', grid_q, get_rel_pos(side[0], side[0], self.rel_pos_h))
        columns = torch.einsum('nahwc,wkc->nahwk', grid_q, get_rel_pos(side[1], side[1], self.rel_pos_w))
        return rows.reshape(regions, heads, L, side[0]), columns.reshape(regions, heads, L, side[1])

    def _attend_with_rel_pos(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, side: tuple[int, int],
                             mask: torch.Tensor | None) -> torch.Tensor:
        """`_attend` with the decomposed relative positions (none towards the prefix tokens). When training, what it
        builds is rebuilt in the backward pass rather than kept (it would take more than the block's other
        activations)."""
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, self.rel_pos_h, self.rel_pos_w)):
            return checkpoint(self._attend_biased, q, k, v, side, mask, use_reentrant=False)
        return self._attend_biased(q, k, v, side, mask)

    def _attend_biased(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, side: tuple[int, int],
                       mask: torch.Tensor | None) -> torch.Tensor:
        """A key's bias is the query's term towards its row plus its term towards its column, so fused attention
        takes it inside its dot products: each query carries its terms beside its scaled self, each patch key the
        one-hot of its row and of its column, and no (queries x keys) bias is made (CaiT's talking heads, which make
        their logits anyway, add the bias to them)."""
        rows, columns = self._rel_pos_terms(q, side)
        if self.talking_heads:
            bias = (rows[..., :, None] + columns[..., None, :]).flatten(-2)
            return self._attend(q, k, v, F.pad(bias, (self.num_prefix_tokens, 0)), mask)
        eye = functools.partial(torch.eye, device=k.device, dtype=k.dtype)
        places = torch.cat([eye(side[0]).repeat_interleave(side[1], 0), eye(side[1]).repeat(side[0], 1)], dim=1)
        places = F.pad(places, (0, 0, self.num_prefix_tokens, 0))  # the prefix keys': zeros
        queries = torch.cat([q * self.scale, rows, columns], dim=-1)
        keys = torch.cat([k, places.expand(*k.shape[:2], -1, -1)], dim=-1)
        # all three padded with zeros to one width, a multiple of 8: the fused kernels take one width (the unfused
        # path, which another falls to, keeps the weights), and GPU kernels want multiples of 8
        width = -(-queries.shape[-1] // 8) * 8
        queries, keys, values = (F.pad(t, (0, width - t.shape[-1])) for t in (queries, keys, v))
        bias = None if mask is None else mask.to(q.dtype)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=bias,
                                             dropout_p=self.attn_drop.p if self.training else 0.0, scale=1.0)
        return out[..., :v.shape[-1]]

    def _padding_mask(self, H: int, W: int, B: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
        """(B * windows, 1, 1, P + L): -inf at the keys padding the grid to whole windows; None where none do."""
        size = self.window_size
        if not size or (H % size == 0 and W % size == 0):
            return None
        Hp, Wp = -(-H // size) * size, -(-W // size) * size
        inside = (torch.arange(Hp, device=device) < H)[:, None] & (torch.arange(Wp, device=device) < W)[None, :]
        inside = inside.reshape(Hp // size, size, Wp // size, size).permute(0, 2, 1, 3).reshape(-1, size * size)
        inside = F.pad(inside, (self.num_prefix_tokens, 0), value=True).repeat(B, 1)
        return torch.zeros(inside.shape, dtype=dtype, device=device).masked_fill(~inside, float('-inf'))[:, None, None]

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rel_bias: torch.Tensor | None,
                mask: torch.Tensor | None) -> torch.Tensor:
        """timm's attention, or CaiT's talking heads (relative positions before the heads mix, the mask after)."""
        if not self.talking_heads:
            bias = rel_bias if mask is None else mask if rel_bias is None else rel_bias + mask
            return F.scaled_dot_product_attention(q, k, v, attn_mask=None if bias is None else bias.to(q.dtype),
                                                  dropout_p=self.attn_drop.p if self.training else 0.0)
        logits = (q * self.scale) @ k.transpose(-2, -1)
        if rel_bias is not None:
            logits = logits + rel_bias
        logits = self.proj_l(logits.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        if mask is not None:
            logits = logits + mask
        weights = self.proj_w(logits.softmax(dim=-1).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        if mask is not None:
            weights = weights.masked_fill(mask.isinf(), 0.0)
        return self.attn_drop(weights) @ v


def prefix_tokens_in_blocks(model: nn.Module) -> int:
    """The prefix tokens the blocks see: none in CaiT (its class token joins in the class-attention stage)."""
    return 0 if hasattr(model, 'blocks_token_only') else int(getattr(model, 'num_prefix_tokens', 0))


def use_window_attention(model: nn.Module, window_size: int | None, global_blocks: Sequence[int] | None = None,
                         rel_pos: bool = False, depth: int | None = None) -> None:
    """Window attention in every block but `global_blocks` (None: ViTDet's 4), relative positions with `rel_pos`."""
    blocks = model.blocks
    depth = len(blocks) if depth is None else depth
    if not isinstance(rel_pos, bool):  # a word such as 'no' would otherwise switch them on
        raise UsageError(f'rel_pos must be True or False, got {rel_pos!r}')
    if global_blocks is not None and not isinstance(global_blocks, Sequence):
        raise UsageError(f'global_blocks must be a list of block indices (e.g. (2, 5, 8, 11)), got {global_blocks!r}')
    if window_size is None:  # relative positions in global attention
        if global_blocks is not None:
            raise UsageError(f'global_blocks {tuple(global_blocks)} need a window_size: without windows every block '
                             'is global')
        global_blocks = range(depth)
    elif isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
        raise UsageError(f'window_size must be a whole number of tokens, 1 or more, got {window_size!r}')
    global_blocks = vitdet_global_blocks(depth) if global_blocks is None else tuple(global_blocks)
    outside = [i for i in global_blocks if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < depth]
    if outside:
        raise UsageError(f'global_blocks {global_blocks}: {outside} name no block of the model (0..{depth - 1})')
    for i, block in enumerate(blocks):
        refuse_unsupported(block.attn, i)
    grid_side = max(model.patch_embed.grid_size) if rel_pos else None
    for i, block in enumerate(blocks):
        window = None if i in global_blocks else window_size
        if window is not None or rel_pos:  # a global block without relative positions keeps its own attention
            block.attn = WindowAttention(block.attn, window, (window or grid_side) if rel_pos else None,
                                         prefix_tokens_in_blocks(model))


def refuse_unsupported(attn: nn.Module, index: int) -> None:
    """A one-line UsageError for a block whose attention WindowAttention cannot take over (naming it and why)."""
    supported = {cls.__qualname__: cls for family in families() for cls in family.attention}
    cls = type(attn)
    if cls in supported.values():
        return
    why = WHY_NOT.get(f'{cls.__module__}.{cls.__qualname__}') or WHY_NOT.get(cls.__qualname__) or \
        f'window attention reproduces the forward of the families\' attention only: {", ".join(supported)}'
    raise UsageError(f'block {index}\'s attention {cls.__module__}.{cls.__qualname__} cannot be windowed: {why}')


def set_token_grid(model: nn.Module, grid: tuple[int, int]) -> None:
    """Hand the token grid (H, W) of the next forward to every window module of `model`."""
    for module in model.modules():
        if isinstance(module, WindowAttention):
            module.grid = (int(grid[0]), int(grid[1]))
