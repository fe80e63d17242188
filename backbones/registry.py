"""The suite's model families in timm's registry, and `create_model`, the one way the suite makes a model.

LV-ViT and T2T-ViT (and the CaiT and ViT sizes timm lacks) are registered under their own names; timm's own names
are never registered again, so `timm.create_model` still gives timm's model for each. `create_model` adds the suite's
contract (inputs of any size) by the family's builder; the rest of a family is its `Family` record."""
from __future__ import annotations

import difflib
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import NamedTuple, TypeVar

import timm
import torch.nn as nn
from timm.layers import Attention
from timm.models import register_model, split_model_name_tag

from backbones.common.errors import UsageError


class Family(NamedTuple):
    """A family of the suite's models, declared beside them: what every part that tells families apart reads."""

    name: str
    checkpoint_signs: tuple[str, ...]  # key prefixes that mark its checkpoints (`backbones.weights.guess_family`)
    recipe: str = 'deit'  # its ImageNet training recipe, by name (`classification.recipes.RECIPES`)
    attention: tuple[type[nn.Module], ...] = (Attention,)  # its blocks' attention, which window attention takes over
    distillation_token: bool = False  # its models take `distilled=True` (DeiT's hard distillation)
    token_head_kwarg: str | None = None  # the keyword that asks its models for a token head (token labeling)
    builder: Callable[..., nn.Module] = timm.create_model  # how `create_model` makes its models: (name, **kwargs)
    shared_signs: bool = False  # other families' checkpoints carry its signs too (ViT's patch projection): tried last


_F = TypeVar('_F', bound=Callable[..., nn.Module])
OTHER_MODELS = Family('timm', ())  # timm's models outside the suite: DeiT's recipe, no distillation token or token head
_FAMILIES: dict[Family, list[str]] = defaultdict(list)


def suite_model(family: Family) -> Callable[[_F], _F]:
    """Register an entrypoint under a name timm does not have, as a model of the suite's `family`."""

    def register(fn: _F) -> _F:
        if timm.is_model(fn.__name__):
            raise RuntimeError(f'{fn.__name__} is already in timm\'s registry; the suite never takes over a name')
        register_model(fn)
        _FAMILIES[family].append(fn.__name__)
        return fn

    return register


def suite_entrypoints(family: Family, module: str, names: Iterable[str],
                      build: Callable[[str, bool, dict], nn.Module]) -> None:
    """`suite_model` for an entrypoint `NAME(pretrained=False, **kwargs)` of each name in `module`, returning
    `build(NAME, pretrained, kwargs)`."""
    def entrypoint_of(name: str) -> Callable[..., nn.Module]:
        def entrypoint(pretrained: bool = False, **kwargs) -> nn.Module:
            return build(name, pretrained, kwargs)

        entrypoint.__name__ = entrypoint.__qualname__ = name
        entrypoint.__module__ = module
        return entrypoint

    for name in names:
        setattr(sys.modules[module], name, suite_model(family)(entrypoint_of(name)))


def adopt_timm_models(family: Family, names: list[str]) -> None:
    """Count timm's models `names` in the suite's `family` (`create_model` makes them with its builder)."""
    missing = [name for name in names if not timm.is_model(name)]
    if missing:
        raise RuntimeError(f'timm has no model {", ".join(missing)}')
    _FAMILIES[family].extend(names)


def suite_models(family: str | None = None) -> list[str]:
    """Names of the suite's models, in registration order, of one family or all."""
    return [name for record, names in _FAMILIES.items() if family in (None, record.name) for name in names]


def families() -> dict[Family, list[str]]:
    return {family: list(names) for family, names in _FAMILIES.items()}


def model_family(name: str) -> str | None:
    """The suite family of a model name (a pretrained tag such as `.tl_in1k` allowed); None for other models."""
    base, _ = split_model_name_tag(name)
    return next((family.name for family, names in _FAMILIES.items() if base in names), None)


def family_of(name: str) -> Family:
    """The Family record of a model name's family; OTHER_MODELS for models outside the suite."""
    return {family.name: family for family in _FAMILIES}.get(model_family(name), OTHER_MODELS)


def check_model_name(name: str) -> None:
    """A UsageError listing the closest registered names if `name` is not a registered model."""
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=8, cutoff=0.6)
        hint = f"did you mean: {', '.join(close)}?" if close else 'no registered name is close'
        raise UsageError(f'unknown model {name!r}; {hint} (the suite has: {", ".join(suite_models())})')


def create_model(name: str, **kwargs) -> nn.Module:
    """A model with the suite's contract (the family's builder; timm's for others); an unknown name is a UsageError."""
    check_model_name(name)
    return family_of(name).builder(name, **kwargs)
