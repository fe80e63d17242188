"""The suite's classification models, and any plain ViT of timm's, as one mmsegmentation backbone, `TokenBackbone`
(registered under that name and the former per-family ones, `LVViTBackbone`, `T2TViTBackbone`, `CaiTBackbone` and
`ViTBackbone`, so that configs written for those still run).

It returns the patch tokens after the blocks in `out_indices` as stride-16 NCHW maps for an image of any size,
resampled onto the stride-16 cells of the image's own extent. A timm model must be a plain ViT; `pretrained` loads a
classification checkpoint (`backbones.load_checkpoint`); `window_size`, `global_blocks` and `rel_pos` give ViTDet's
window attention. docs/segmentation.md and docs/instances_and_depth.md tell the rest."""
from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.model import BaseModule
from mmseg.registry import MODELS

from backbones import create_model, load_checkpoint, model_family, suite_models
from backbones.common.errors import SuiteError, UsageError
from backbones.common.log import logger
from backbones.weights import fetch_pretrained, fit_pos_embed
from backbones.window_attention import REL_POS_KEYS, WindowAttention, set_token_grid, use_window_attention

FORMER_NAMES = ('LVViTBackbone', 'T2TViTBackbone', 'CaiTBackbone', 'ViTBackbone')
STRIDE = 16  # of the maps every backbone returns
# what a timm model needs to be a dense backbone: timm's contract for plain ViTs
PLAIN_VIT_PARTS = ('forward_intermediates', 'prune_intermediate_layers', 'patch_embed', 'blocks', 'num_prefix_tokens')
PLAIN_VITS = 'vit_small_patch14_reg4_dinov2, deit3_small_patch16_224, eva02_small_patch14_224, beit_base_patch16_224'


def crop_to_extent(maps: torch.Tensor, extent: tuple[float, float], cells: tuple[int, int] | None = None
                   ) -> torch.Tensor:
    """The top-left `extent` (fractions of height, width) of (B, C, h, w) maps resampled onto `cells` (or h x w)."""
    fy, fx = extent
    size = [*maps.shape[:2], *(cells or maps.shape[2:])]
    if fy == 1 and fx == 1 and size == list(maps.shape):
        return maps
    # align_corners=False: output edge -1 maps to input edge -1, output edge +1 to input position 2f - 1.
    theta = maps.new_tensor([[fx, 0, fx - 1], [0, fy, fy - 1]]).expand(maps.shape[0], 2, 3)
    grid = F.affine_grid(theta, size, align_corners=False)
    return F.grid_sample(maps, grid, mode='bilinear', padding_mode='border', align_corners=False)


def dense_model(model_name: str, img_size: int, drop_path_rate: float, model_kwargs: dict) -> nn.Module:
    """The headless classifier a dense backbone wraps: a suite model, or a timm ViT with `dynamic_img_size`."""
    kwargs = dict(img_size=img_size, num_classes=0, drop_path_rate=drop_path_rate, **model_kwargs)
    if model_family(model_name) is not None:
        return create_model(model_name, **kwargs)
    try:
        try:
            model = create_model(model_name, **{'dynamic_img_size': True, **kwargs})
        except TypeError as e:  # a model with no such option (BEiT's relative positions are tied to its grid)
            if 'dynamic_img_size' not in str(e):
                raise
            model = create_model(model_name, **kwargs)
    except TypeError as e:  # an option a plain ViT takes, such as img_size, is not the model's
        raise not_a_plain_vit(model_name, f'its builder says: {e}') from e
    check_plain_vit(model_name, model)
    return model


def not_a_plain_vit(model_name: str, why: str) -> UsageError:
    """The refusal of a model that is neither the suite's nor a plain timm ViT, saying `why`."""
    return UsageError(f'TokenBackbone takes a model of the suite, not {model_name!r}, or a plain timm ViT, which '
                      f'{model_name} is not ({why}); the suite has: {", ".join(suite_models())}; timm\'s plain ViTs '
                      f'include {PLAIN_VITS}')


def check_backbone_model(backbone: dict) -> None:
    """A config's TokenBackbone built on the meta device: what it cannot take or give is refused before any work."""
    if backbone.get('type') not in ('TokenBackbone', *FORMER_NAMES):
        return
    try:
        with torch.device('meta'):
            TokenBackbone(**{key: value for key, value in backbone.items() if key != 'type'})
    except SuiteError:
        raise
    except (TypeError, ValueError, AssertionError) as e:  # the model's own refusal of its arguments
        raise UsageError(f'model.backbone: {backbone.get("model_name")} cannot be built from model.backbone\'s '
                         f'settings and model_kwargs {dict(backbone.get("model_kwargs") or {})} '
                         f'({type(e).__name__}: {" ".join(str(e).split())[:200]})') from e


def check_frozen_backbone(cfg: dict) -> None:
    """A frozen backbone the config's optimizer would still give a learning rate is refused, naming the setting."""
    if not cfg['model'].get('backbone', {}).get('frozen'):
        return
    wrapper = cfg.get('optim_wrapper') or {}
    if wrapper.get('constructor') == 'LayerDecayOptimWrapperConstructor':
        raise UsageError('model.backbone.frozen=True: optim_wrapper.constructor LayerDecayOptimWrapperConstructor '
                         'decays the learning rates of a backbone that does not learn (leave it out)')
    for key, setting in ((wrapper.get('paramwise_cfg') or {}).get('custom_keys') or {}).items():
        if 'backbone' in key and setting.get('lr_mult', 0) != 0:
            raise UsageError(f'model.backbone.frozen=True: optim_wrapper.paramwise_cfg.custom_keys[{key!r}] gives the '
                             f'backbone lr_mult {setting["lr_mult"]} (a frozen backbone learns nothing: leave it out)')


def check_plain_vit(model_name: str, model: nn.Module) -> None:
    """A UsageError naming what a timm model lacks to be a dense backbone."""
    missing = [part for part in PLAIN_VIT_PARTS if not hasattr(model, part)]
    if missing:
        raise not_a_plain_vit(model_name, f'{type(model).__name__} has no {", ".join(missing)}')
    patch = tuple(model.patch_embed.patch_size)
    if patch[0] != patch[1]:
        raise UsageError(f'{model_name}: its patches are {patch[0]}x{patch[1]} pixels; the dense backbone takes square '
                         'patches')


def check_dinov2_inputs(model: nn.Module, model_name: str, final_norm: bool, class_token: bool) -> None:
    """A model that cannot give what `final_norm` or `class_token` ask: no norm over its tokens (BEiT's and EVA's
    `fc_norm` is over the pooled feature), no class token, or one its blocks do not carry (CaiT's)."""
    if final_norm and isinstance(model.norm, nn.Identity):
        raise UsageError(f'model.backbone.final_norm: {model_name} has no final norm over its tokens (its norm is '
                         'over the pooled feature)')
    carried = getattr(model, 'block_prefix_tokens', model.num_prefix_tokens)
    if class_token and (getattr(model, 'cls_token', None) is None or not carried):
        raise UsageError(f'model.backbone.class_token: the blocks of {model_name} carry no class token')


@MODELS.register_module()
class TokenBackbone(BaseModule):
    """Any suite model (CaiT without its class-attention stage) or plain timm ViT as an mmseg backbone, pruned to what
    the blocks in `out_indices` need; `frozen`: no gradient, no graph, always in eval mode; `final_norm`: the final norm
    on every map; `class_token`: each map (B, 2D, h, w), the block's class token beside every patch token."""

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
            frozen: bool = False,
            final_norm: bool = False,
            class_token: bool = False,
            init_cfg: dict | None = None,
    ) -> None:
        if pretrained is not None:
            if init_cfg is not None:
                raise UsageError('give the backbone either `pretrained` or `init_cfg`, not both')
            init_cfg = dict(type='Pretrained', checkpoint=pretrained)
        super().__init__(init_cfg)
        for name, flag in (('frozen', frozen), ('final_norm', final_norm), ('class_token', class_token)):
            if not isinstance(flag, bool):  # a word such as 'False' would turn it on
                raise UsageError(f'model.backbone.{name} must be True or False, got {flag!r}')
        self.frozen = frozen
        self.model = dense_model(model_name, img_size, drop_path_rate, model_kwargs or {})
        depth = len(self.model.blocks)
        if not out_indices or any(not -depth <= i < depth for i in out_indices):
            raise UsageError(f'out_indices {tuple(out_indices)} must name blocks of {model_name} (0..{depth - 1})')
        self.final_norm, self.class_token = final_norm, class_token
        check_dinov2_inputs(self.model, model_name, final_norm, class_token)
        self.out_indices = self.model.prune_intermediate_layers(list(out_indices), prune_norm=not final_norm,
                                                                prune_head=True)
        if window_size is not None or global_blocks is not None or rel_pos:
            use_window_attention(self.model, window_size, global_blocks, rel_pos, depth=depth)
        self.model.set_grad_checkpointing(grad_checkpointing)  # recompute blocks in backward: less memory
        patch = getattr(self.model.patch_embed, 'patch_size', None)  # timm's; else the grid at `img_size` says
        self.patch_size = int(patch[0]) if patch else img_size // self.model.patch_embed.grid_size[0]
        self.stride = STRIDE
        # the one input size of a fixed-grid model (a timm model built without `dynamic_img_size`)
        self.img_size = img_size if getattr(self.model.patch_embed, 'strict_img_size', False) else None
        self.use_ema, self.model_name = use_ema, model_name
        if frozen:
            self.model.requires_grad_(False)
            self.model.eval()

    def train(self, mode: bool = True) -> TokenBackbone:
        return super().train(mode and not self.frozen)

    @property
    def num_layers(self) -> int:
        """Blocks kept (the depth that layer-wise learning-rate decay counts)."""
        return len(self.model.blocks)

    def init_weights(self) -> None:
        """Load the `Pretrained` checkpoint through the suite's loader, else keep the model's own init. A missing
        backbone key is an error; the pruned parts' keys (heads, final norm, later blocks) are logged."""
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
        """A segmentor checkpoint's position table resampled to this backbone's grid."""
        key = f'{prefix}model.pos_embed'
        own = getattr(self.model, 'pos_embed', None)
        if key in state_dict and own is not None and state_dict[key].shape != own.shape:
            state_dict[key] = fit_pos_embed(self.model, state_dict[key])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def padded_size(self, height: int, width: int) -> tuple[int, int]:
        """The size an image is padded to: whole patches, or a fixed-grid model's `img_size`."""
        if self.img_size is None:
            return tuple(-(-side // self.patch_size) * self.patch_size for side in (height, width))
        if height > self.img_size or width > self.img_size:
            raise UsageError(f'{self.model_name} reads images of up to {self.img_size}x{self.img_size} pixels (its '
                             f'relative positions are fixed to that grid), got {height}x{width}: set the backbone\'s '
                             'img_size, or test in windows of that size')
        return self.img_size, self.img_size

    def fixed_size_reason(self) -> str | None:
        """Why a program traced at one input size cannot take others, or None where it can."""
        if self.img_size is not None:
            return f'{self.model_name} reads one input size, its img_size {self.img_size}'
        if self.patch_size != self.stride:
            return (f'{self.model_name}\'s {self.patch_size} px tokens are resampled onto the stride-{self.stride} '
                    'maps at the ratio of the traced size')
        if any(isinstance(module, WindowAttention) and module.window_size for module in self.model.modules()):
            return 'its attention windows are laid out for the traced size'
        return None

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        H, W = images.shape[-2:]
        Hp, Wp = self.padded_size(H, W)  # integers: torch.export saves them
        padded = F.pad(images, (0, Wp - W, 0, Hp - H))
        set_token_grid(self.model, (Hp // self.patch_size, Wp // self.patch_size))  # for the window attention, if any
        with torch.no_grad() if self.frozen else contextlib.nullcontext():
            maps = self.model.forward_intermediates(padded, self.out_indices, norm=self.final_norm,
                                                    intermediates_only=True, return_prefix_tokens=self.class_token)
        if self.class_token:
            # the block's class token beside each cell's patch token: (B, 2D, h, w)
            maps = [torch.cat([m, prefix[:, 0, :, None, None].expand_as(m)], 1) for m, prefix in maps]
        cells = (-(-H // self.stride), -(-W // self.stride))
        return tuple(crop_to_extent(m, (H / Hp, W / Wp), cells) for m in maps)


for _name in FORMER_NAMES:
    MODELS.register_module(name=_name, module=TokenBackbone)
