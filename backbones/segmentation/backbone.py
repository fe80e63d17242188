"""The suite's classification models as one mmsegmentation backbone, `TokenBackbone`, for all four families.

The backbone wraps a registered suite model (`model_name`, e.g. `lvvit_m`; the family follows from it), pruned to
what the chosen blocks need, and returns the patch tokens after the blocks in `out_indices` as stride-16 NCHW maps,
class tokens dropped, no final norm (as the papers' segmentation code). `drop_path_rate` is stochastic depth (the
reference passed it as MLP dropout).

Any input size works, also in test mode where mmseg does not pad: the image is padded to the stride, the position
embeddings are resampled to its token grid, and the maps are cropped back to the image's own extent, so that the
decode head's final resize to the image size is exact.

`pretrained=PATH` or `init_cfg=dict(type='Pretrained', checkpoint=PATH)` loads a classification checkpoint (ours
or an official release file) through `backbones.load_checkpoint`: wrappers, prefixes and the position-table resize
are handled there. Instead of a path, an http(s):// or file:// URL, or `timm` (the release file the model's timm
config names), is downloaded once into timm's cache (torch hub's `checkpoints` folder) and read from there. A
missing backbone key is an error, and keys of the pruned parts (heads, final norm, later blocks) are reported in
the log. A segmentation checkpoint whose position table has another grid (the released
LV-ViT segmentors, a run at another crop size) has it resampled to this backbone's grid when it loads.

Registered as `TokenBackbone`, and under the former per-family names (`LVViTBackbone`, `T2TViTBackbone`,
`CaiTBackbone`, `ViTBackbone`) so that configs written for those still run.

`window_size` (tokens a side; None: global attention everywhere), `global_blocks` (the blocks that stay global; ViTDet's
4 evenly spaced ones over the model's depth by default) and `rel_pos` (decomposed relative positions in every block)
give ViTDet's window attention (backbones/window_attention.py).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from mmengine.model import BaseModule
from mmseg.registry import MODELS

from backbones import create_model, load_checkpoint, model_family, suite_models
from backbones.common.errors import UsageError
from backbones.common.log import logger
from backbones.weights import fetch_pretrained, fit_pos_embed
from backbones.window_attention import REL_POS_KEYS, set_token_grid, use_window_attention

FORMER_NAMES = ('LVViTBackbone', 'T2TViTBackbone', 'CaiTBackbone', 'ViTBackbone')


def crop_to_extent(maps: torch.Tensor, extent: tuple[float, float]) -> torch.Tensor:
    """Resample the top-left `extent` (fractions of height, width) of (B, C, h, w) maps back onto h x w cells."""
    fy, fx = extent
    if fy == 1 and fx == 1:
        return maps
    # align_corners=False: output edge -1 maps to input edge -1, output edge +1 to input position 2f - 1.
    theta = maps.new_tensor([[fx, 0, fx - 1], [0, fy, fy - 1]]).expand(maps.shape[0], 2, 3)
    grid = F.affine_grid(theta, list(maps.shape), align_corners=False)
    return F.grid_sample(maps, grid, mode='bilinear', padding_mode='border', align_corners=False)


@MODELS.register_module()
class TokenBackbone(BaseModule):
    """Any suite model (LV-ViT, T2T-ViT, CaiT without its class-attention stage, ViT/DeiT) as an mmseg backbone."""

    def __init__(
            self,
            model_name: str,
            out_indices: Sequence[int],
            img_size: int = 512,
            drop_path_rate: float = 0.0,
            pretrained: str | None = None,
            use_ema: bool | None = None,
            model_kwargs: dict | None = None,
            grad_checkpointing: bool = False,
            window_size: int | None = None,
            global_blocks: Sequence[int] | None = None,
            rel_pos: bool = False,
            init_cfg: dict | None = None,
    ) -> None:
        if pretrained is not None:
            if init_cfg is not None:
                raise UsageError('give the backbone either `pretrained` or `init_cfg`, not both')
            init_cfg = dict(type='Pretrained', checkpoint=pretrained)
        super().__init__(init_cfg)
        if model_family(model_name) is None:
            raise UsageError(f'{type(self).__name__} takes a model of the suite, not {model_name!r}; choose one of: '
                             f'{", ".join(suite_models())}')
        self.model = create_model(model_name, img_size=img_size, num_classes=0, drop_path_rate=drop_path_rate,
                                  **(model_kwargs or {}))
        depth = len(self.model.blocks)
        if not out_indices or any(not -depth <= i < depth for i in out_indices):
            raise UsageError(f'out_indices {tuple(out_indices)} must name blocks of {model_name} (0..{depth - 1})')
        self.out_indices = self.model.prune_intermediate_layers(list(out_indices), prune_norm=True, prune_head=True)
        if window_size is not None or global_blocks is not None or rel_pos:
            use_window_attention(self.model, window_size, global_blocks, rel_pos, depth=depth)
        self.model.set_grad_checkpointing(grad_checkpointing)  # recompute blocks in backward: less memory
        self.stride = img_size // self.model.patch_embed.grid_size[0]
        self.use_ema, self.model_name = use_ema, model_name

    @property
    def num_layers(self) -> int:
        """Blocks kept (the depth that layer-wise learning-rate decay counts)."""
        return len(self.model.blocks)

    def init_weights(self) -> None:
        """Load the `Pretrained` checkpoint through the suite's loader; otherwise keep the model's own init."""
        if self.init_cfg is None:
            return
        if self.init_cfg.get('type') != 'Pretrained':
            raise UsageError(f'{type(self).__name__} understands init_cfg type "Pretrained" only, '
                             f'got {self.init_cfg!r}')
        checkpoint = fetch_pretrained(self.init_cfg['checkpoint'], self.model_name)
        report = load_checkpoint(self.model, checkpoint, use_ema=self.use_ema, strict=True, allow_unexpected=True,
                                 own_init=REL_POS_KEYS)
        logger.info(f'{type(self).__name__}: {report.summary()}')
        self._is_init = True

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args, **kwargs) -> None:
        """A segmentor checkpoint's position table resampled to this backbone's grid (another crop size, or the
        reference's released segmentors)."""
        key = f'{prefix}model.pos_embed'
        own = getattr(self.model, 'pos_embed', None)
        if key in state_dict and own is not None and state_dict[key].shape != own.shape:
            state_dict[key] = fit_pos_embed(self.model, state_dict[key])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        H, W = images.shape[-2:]
        Hp, Wp = (-(-size // self.stride) * self.stride for size in (H, W))  # integers: torch.export saves them
        padded = F.pad(images, (0, Wp - W, 0, Hp - H))
        set_token_grid(self.model, (Hp // self.stride, Wp // self.stride))  # for the window attention, if any
        maps = self.model.forward_intermediates(padded, self.out_indices, intermediates_only=True)
        return tuple(crop_to_extent(m, (H / Hp, W / Wp)) for m in maps)


for _name in FORMER_NAMES:
    MODELS.register_module(name=_name, module=TokenBackbone)
