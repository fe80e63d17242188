"""What the models attend to: the attention of every block, attention rollout, CaiT's class attention, mean attention
distance, and position-embedding similarity (the ViT paper's Fig. 6-7, CaiT's class-attention maps); and their figure.

`scaled_dot_product_attention` returns no weights, so `attention_maps` records each attention module's input during
one forward and recomputes the weights from the module's own projections (timm's `Attention`, CaiT's talking-heads
and class attention)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
from timm.layers import Attention
from timm.models.cait import ClassAttn, TalkingHeadAttn

from backbones.common.drawing import blend, figure, finished, upscale
from backbones.common.errors import UsageError
from backbones.layers import Grid, resize_pos_embed
from backbones.token_head import token_grid


@dataclass
class AttentionMaps:
    blocks: list[torch.Tensor] = field(default_factory=list)  # per block (B, heads, N, N), over every token
    class_attention: list[torch.Tensor] = field(default_factory=list)  # CaiT: per block (B, heads, 1 + patches)
    grid: Grid = (0, 0)  # the patch grid
    num_prefix: int = 0  # tokens before the patches in `blocks` (class, distillation)


def _self_attention(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    B, N, _ = x.shape
    heads = module.num_heads
    q, k, _ = module.qkv(x).reshape(B, N, 3, heads, -1).permute(2, 0, 3, 1, 4)
    if isinstance(module, TalkingHeadAttn):
        logits = module.proj_l(((q * module.scale) @ k.transpose(-2, -1)).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return logits.softmax(dim=-1)
    q, k = module.q_norm(q), module.k_norm(k)
    return ((q * module.scale) @ k.transpose(-2, -1)).softmax(dim=-1)


def _class_attention(module: ClassAttn, x: torch.Tensor) -> torch.Tensor:
    B, N, C = x.shape
    heads = module.num_heads
    q = module.q(x[:, :1]).reshape(B, 1, heads, C // heads).transpose(1, 2)
    k = module.k(x).reshape(B, N, heads, C // heads).transpose(1, 2)
    return ((q * module.scale) @ k.transpose(-2, -1)).softmax(dim=-1)[:, :, 0]


@torch.no_grad()
def attention_maps(model: nn.Module, images: torch.Tensor) -> AttentionMaps:
    """The attention weights of every block of a token model for `images` (a forward in eval mode)."""
    inputs: dict[nn.Module, torch.Tensor] = {}
    modules = [m for m in model.modules() if isinstance(m, (Attention, TalkingHeadAttn, ClassAttn))
               and not _inside_patch_embedding(model, m)]
    if not modules:
        raise UsageError(f'{type(model).__name__} has no attention blocks to show')
    hooks = [m.register_forward_pre_hook(lambda module, args: inputs.__setitem__(module, args[0])) for m in modules]
    try:
        model.eval()
        model.forward_features(images)
    finally:
        for hook in hooks:
            hook.remove()
    maps = AttentionMaps(grid=token_grid(model.patch_embed, images.shape[-2:]),
                         num_prefix=getattr(model, 'num_prefix_tokens', 0))
    for module in modules:
        if isinstance(module, ClassAttn):
            maps.class_attention.append(_class_attention(module, inputs[module]))
        else:
            maps.blocks.append(_self_attention(module, inputs[module]))
    if isinstance(modules[0], TalkingHeadAttn):
        maps.num_prefix = 0  # CaiT: the class token joins after the self-attention blocks
    return maps


def _inside_patch_embedding(model: nn.Module, module: nn.Module) -> bool:
    embedding = getattr(model, 'patch_embed', None)
    return embedding is not None and any(m is module for m in embedding.modules())


def attention_rollout(blocks: Sequence[torch.Tensor], residual: float = 0.5) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema; the ViT paper's Fig. 6) through the blocks, with `residual`: (B, N, N)."""
    rollout = None
    for attention in blocks:
        mean = attention.mean(dim=1)
        mixed = residual * torch.eye(mean.shape[-1], dtype=mean.dtype) + (1 - residual) * mean
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        rollout = mixed if rollout is None else mixed @ rollout
    return rollout


def patch_distances(grid: Grid, patch_size: float) -> torch.Tensor:
    """(N, N) distances in pixels between the centres of the patches of a grid (row-major)."""
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing='ij')
    centres = torch.stack([rows.flatten(), cols.flatten()], dim=1).double() * patch_size
    return torch.cdist(centres, centres)


def mean_attention_distance(attention: torch.Tensor, grid: Grid, patch_size: float, num_prefix: int = 0
                            ) -> torch.Tensor:
    """The ViT paper's attention distance per head (Fig. 7, right), averaged over patches and images."""
    patches = attention[:, :, num_prefix:, num_prefix:].double()
    patches = patches / patches.sum(dim=-1, keepdim=True)
    return (patches * patch_distances(grid, patch_size)).sum(dim=-1).mean(dim=(0, 2))


def position_similarity(pos_embed: torch.Tensor, num_prefix: int = 0) -> torch.Tensor:
    """(N, N) cosine similarity of the patches' position embeddings (the ViT paper's Fig. 7, centre)."""
    table = pos_embed.reshape(-1, pos_embed.shape[-1])[num_prefix:].double()
    table = table / table.norm(dim=-1, keepdim=True)
    return table @ table.T


def similarity_mosaic(similarity: torch.Tensor, grid: Grid) -> np.ndarray:
    """One tile per position (its similarity to every position), in the grid's layout, NaN rows between."""
    H, W = grid
    tiles = similarity.reshape(H, W, H, W).numpy()
    mosaic = np.full((H * (H + 1) - 1, W * (W + 1) - 1), np.nan)
    for i in range(H):
        for j in range(W):
            mosaic[i * (H + 1):i * (H + 1) + H, j * (W + 1):j * (W + 1) + W] = tiles[i, j]
    return mosaic


def heat_overlay(image: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A (h, w) map in [0, max] laid over an (H, W, 3) image as a 'magma' heat map, opacity following the value."""
    from matplotlib import colormaps
    scaled = values / max(float(values.max()), 1e-12)
    big = upscale(scaled, image.shape[:2])
    colours = (colormaps['magma'](big)[..., :3] * 255).astype(np.uint8)
    return blend(image, colours, 0.25 + 0.65 * big)


def shown_maps(maps: AttentionMaps) -> list[tuple[str, np.ndarray]]:
    """The maps a figure shows for the first image: the class token's rollout, or CaiT's last class attention."""
    if maps.class_attention:
        last = maps.class_attention[-1][0, :, 1:].reshape(-1, *maps.grid)
        return [(f'class attention, head {h}', last[h].numpy()) for h in range(last.shape[0])]
    rollout = attention_rollout(maps.blocks)[0, 0, maps.num_prefix:].reshape(maps.grid)
    return [('attention rollout (class token)', rollout.numpy())]


def attention_values(maps: AttentionMaps, distances: torch.Tensor, similarity: torch.Tensor, patch_size: float
                     ) -> dict:
    """What `attention_figure` draws, as plain numbers (for JSON)."""
    values = {'grid': list(maps.grid), 'patch_size': patch_size, 'mean_attention_distance': distances.tolist(),
              'position_similarity': similarity.tolist()}
    shown = [grid_map.tolist() for _, grid_map in shown_maps(maps)]
    if maps.class_attention:
        values['class_attention'] = shown
    else:
        values['rollout'] = shown[0]
    return values


def attention_figure(image: np.ndarray, maps: AttentionMaps, distances: torch.Tensor, similarity: torch.Tensor,
                     patch_size: float, title: str) -> np.ndarray:
    """The image, `shown_maps`, mean attention distance per block and head, position-embedding similarity."""
    grid = maps.grid
    maps_to_show = shown_maps(maps)
    cols = max(3, len(maps_to_show) + 1)
    fig, axes = figure(2, cols, size=(3.2, 3.2))
    axes[0, 0].imshow(image)
    axes[0, 0].set_title('image', fontsize=9)
    for ax, (name, values) in zip(axes[0, 1:], maps_to_show):
        ax.imshow(heat_overlay(image, values))
        ax.set_title(name, fontsize=9)
    for ax in axes.flat:
        ax.axis('off')
    dist_ax = axes[1, 0]
    dist_ax.axis('on')
    for layer, per_head in enumerate(distances.numpy()):
        dist_ax.scatter(np.full(len(per_head), layer + 1), per_head, s=10, c=np.arange(len(per_head)), cmap='tab10')
    dist_ax.set_xlabel('block')
    dist_ax.set_ylabel('mean attention distance (pixels)')
    dist_ax.set_ylim(0, float(patch_distances(grid, patch_size).max()))
    dist_ax.set_title('attention distance per head', fontsize=9)
    sim_ax = axes[1, 1]
    mosaic = sim_ax.imshow(similarity_mosaic(similarity, grid), cmap='viridis', vmin=-1, vmax=1,
                           interpolation='nearest')
    sim_ax.set_title('position embedding similarity', fontsize=9)
    fig.colorbar(mosaic, ax=sim_ax, fraction=0.046, pad=0.04)
    return finished(fig, title)


def model_attention(model: nn.Module, images: torch.Tensor) -> tuple[AttentionMaps, torch.Tensor, torch.Tensor,
                                                                      float | None]:
    """The first image's attention maps, the attention distance per block and head, the position similarity."""
    maps = attention_maps(model, images)
    patch_size = images.shape[-2] / maps.grid[0]
    distances = torch.stack([mean_attention_distance(a, maps.grid, patch_size, maps.num_prefix)
                             for a in maps.blocks])
    similarity = position_similarity(*_pos_table(model, maps.grid))
    first = AttentionMaps([a[:1] for a in maps.blocks], [a[:1] for a in maps.class_attention], maps.grid,
                          maps.num_prefix)
    return first, distances, similarity, patch_size


def _pos_table(model: nn.Module, grid: Grid) -> tuple[torch.Tensor, int]:
    """The model's position table at the grid of the image (resampled as the forward does), and its prefix slots."""
    own = tuple(model.patch_embed.grid_size)
    prefix = model.pos_embed.shape[1] - own[0] * own[1]
    return resize_pos_embed(model.pos_embed.detach(), grid, own), prefix
