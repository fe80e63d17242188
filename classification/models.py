"""The classifiers the applications train and evaluate: any registered model (the suite's, or any timm model), at
the input size asked for, with a token head and MixToken for token labeling."""
from __future__ import annotations

from typing import Optional

import torch.nn as nn
from timm.data import resolve_data_config
from timm.models import get_pretrained_cfg

from backbones import TokenLabelingModel, create_model, model_family
from backbones.errors import UsageError


def create_classifier(name: str, num_classes: int, img_size: Optional[int] = None, token_labeling: bool = False,
                      mix_token: float = 1.0, **kwargs) -> nn.Module:
    """A model for training or evaluation; with `token_labeling`, wrapped with a token head and MixToken."""
    family = model_family(name)
    if family is not None and img_size is not None:  # timm models outside the suite (CNNs) keep their own size
        kwargs['img_size'] = img_size
    if family == 'lvvit':
        kwargs['token_head'] = token_labeling
    try:
        model = create_model(name, num_classes=num_classes, **kwargs)
    except TypeError as e:  # an argument the model does not take
        raise UsageError(f'{name} does not take these arguments: {e}') from e
    check_input_size(model, name, img_size)
    return TokenLabelingModel(model, mix_token) if token_labeling else model


def check_input_size(model: nn.Module, name: str, img_size: Optional[int]) -> None:
    """The input size must give the model at least one patch, and a whole number of them where it needs that."""
    patch_embed = getattr(model, 'patch_embed', None)
    grid = getattr(patch_embed, 'grid_size', None)
    if img_size is None or grid is None:
        return
    patch = getattr(patch_embed, 'patch_size', None)
    if min(grid) < 1:
        raise UsageError(f'--img-size {img_size} is smaller than one patch of {name}'
                         + (f' ({patch[0]} px)' if patch else ''))
    if patch and not getattr(patch_embed, 'dynamic_img_pad', False) and img_size % patch[0]:
        raise UsageError(f'--img-size {img_size} does not fit {name}: it needs a multiple of its {patch[0]} px '
                         f'patches')


def model_data_config(name: str) -> dict:
    """timm's data config of a registered model: input size, crop fraction, interpolation, mean and std."""
    return resolve_data_config({}, pretrained_cfg=get_pretrained_cfg(name).to_dict())
