"""The suite's view of timm's model registry: which models are ours, and a create_model with helpful errors."""
from __future__ import annotations

import difflib
import warnings
from collections import defaultdict
from typing import Callable, Dict, List, TypeVar

import timm
import torch.nn as nn
from timm.models import register_model

from .errors import UsageError

_F = TypeVar('_F', bound=Callable[..., nn.Module])
_FAMILIES: Dict[str, List[str]] = defaultdict(list)


def suite_model(family: str) -> Callable[[_F], _F]:
    """Register an entrypoint in timm's registry and record it as a model of the suite's `family`.

    Names that timm already has are registered again only for the same architecture (CaiT, ViT), to give
    them the suite's contract (any input size); timm's warning about the overwrite is expected then.
    """

    def register(fn: _F) -> _F:
        with warnings.catch_warnings():
            warnings.filterwarnings('ignore', message=f'Overwriting {fn.__name__} in registry')
            register_model(fn)
        _FAMILIES[family].append(fn.__name__)
        return fn

    return register


def suite_models(family: str | None = None) -> List[str]:
    """Names of the suite's models, in registration order, of one family or all."""
    if family is not None:
        return list(_FAMILIES[family])
    return [name for names in _FAMILIES.values() for name in names]


def families() -> Dict[str, List[str]]:
    return {family: list(names) for family, names in _FAMILIES.items()}


def model_family(name: str) -> str | None:
    """The suite family a registered model name belongs to (None for other timm models)."""
    return next((family for family, names in _FAMILIES.items() if name in names), None)


def check_model_name(name: str) -> None:
    """Raise a ValueError that lists the closest registered names if `name` is not a registered model."""
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=8, cutoff=0.6)
        hint = f"did you mean: {', '.join(close)}?" if close else 'no registered name is close'
        raise UsageError(f'unknown model {name!r}; {hint} (the suite has: {", ".join(suite_models())})')


def create_model(name: str, **kwargs) -> nn.Module:
    """timm.create_model, but an unknown name raises a ValueError that lists the closest registered names."""
    check_model_name(name)
    return timm.create_model(name, **kwargs)
