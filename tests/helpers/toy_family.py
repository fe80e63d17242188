"""A model family of a test's own, declared in this one module as a user's would be (imported before the suite's
entry points run: by a user's script, or a config's custom_imports): "toy_vit", timm's VisionTransformer with a
LayerNorm before its blocks (CLIP's `norm_pre`, whose keys mark the family's checkpoints), tiny, with DeiT's
distillation token and head on request. Its `Family` record is all the suite reads of it: DeiT's recipe, timm's
attention in its blocks (window attention takes them over), a distillation token, no token head of its own. Nothing
else in the suite names it."""
from __future__ import annotations

from timm.models import build_model_with_cfg, generate_default_cfgs
from timm.models.deit import VisionTransformerDistilled
from timm.models.vision_transformer import VisionTransformer, _cfg

from backbones.registry import Family, suite_model

TOY_VIT = Family('toy_vit', ('norm_pre.',), distillation_token=True)  # DeiT's recipe, timm's attention: the defaults

default_cfgs = generate_default_cfgs({'toy_vit_tiny': _cfg(input_size=(3, 32, 32))})  # read by timm's registration


@suite_model(TOY_VIT)
def toy_vit_tiny(pretrained: bool = False, distilled: bool = False, **kwargs) -> VisionTransformer:
    """4 blocks of width 32 on 16 px patches, 2 heads, inputs of any size; `distilled`: a distillation token and
    head (timm's VisionTransformerDistilled)."""
    defaults = dict(img_size=32, patch_size=16, embed_dim=32, depth=4, num_heads=2, pre_norm=True,
                    dynamic_img_size=True)
    model_class = VisionTransformerDistilled if distilled else VisionTransformer
    return build_model_with_cfg(model_class, 'toy_vit_tiny', pretrained, **{**defaults, **kwargs})
