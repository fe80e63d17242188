"""Weights for the suite's models: the official release files of every family, timm's and our own checkpoints.

`load_checkpoint(model, path)`, the one entry point every tool uses, reads `.pth`/`.pth.tar`/`.pt` files weights-only
and `.safetensors` files, unwraps the known layouts (`read_state_dict`), resamples `pos_embed` to the model's grid,
drops the classifiers the model lacks (all with `new_head`) and fails, before touching the model, naming the keys
that do not fit. `release_filter` is the same for timm's `pretrained_filter_fn`; `fetch_pretrained` gives a path,
URL or timm release as a local file. docs/models.md ("Official checkpoints") gives the layouts."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import timm
import torch
import torch.nn as nn
from huggingface_hub import hf_hub_download
from timm.models import get_pretrained_cfg
from timm.models._hub import download_cached_file

from backbones.common.errors import CheckpointError, UsageError
from backbones.common.exporting import check_exported_file
from backbones.common.files import first_line, load_weights_only
from backbones.layers import DIST_HEAD, resize_pos_embed
from backbones.registry import create_model, families, model_family
from backbones.token_head import TOKEN_HEAD

StateDict = dict[str, torch.Tensor]

_WRAPPERS = ('state_dict', 'model', 'module')
_EMA_WRAPPERS = ('state_dict_ema', 'model_ema')
# the suite's checkpoints of a run with an EMA: `state_dict` holds the EMA (the run's model), this the trained weights;
# and the key naming what `state_dict` holds ('ema' or 'trained')
TRAINED_WEIGHTS, MODEL_WEIGHTS = 'state_dict_trained', 'weights'
_PREFIXES = ('module.', '_orig_mod.')


@dataclass
class LoadReport:
    """What `load_checkpoint` did besides copying tensors."""

    path: str
    resized: list[str] = field(default_factory=list)
    dropped_classifier: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [f'loaded {self.path}']
        for label, keys in (('resized', self.resized), ('new classifier, not loaded', self.dropped_classifier),
                            ('missing', self.missing), ('unexpected', self.unexpected),
                            ('mis-shaped, not loaded', self.mismatched)):
            if keys:
                parts.append(f'{label}: {_key_list(keys)}')
        return '; '.join(parts)


def _key_list(keys: list[str], limit: int = 12) -> str:
    shown = ', '.join(keys[:limit])
    return shown + (f' ... ({len(keys) - limit} more)' if len(keys) > limit else '')


def key_mismatch(state: Mapping[str, torch.Tensor], own: Mapping[str, torch.Tensor],
                 resampled: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """The keys of `state` that do not fit `own`: `missing`, `unexpected`, `mis-shaped` (with both shapes)."""
    return {
        'missing': [k for k in own if k not in state and not k.endswith('num_batches_tracked')],
        'unexpected': [k for k in state if k not in own],
        'mis-shaped': [f'{k} {tuple(v.shape)} vs model {tuple(own[k].shape)}' for k, v in state.items()
                       if k in own and v.shape != own[k].shape and not (resampled and k.endswith(resampled))],
    }


def describe_mismatch(problems: Mapping[str, list[str]]) -> str:
    """`key_mismatch`'s findings in words ('2 missing keys: a, b; ...'); '' when the checkpoint fits."""
    return '; '.join(f'{len(keys)} {kind} keys: {_key_list(keys)}' for kind, keys in problems.items() if keys)


def _read_file(path: Path) -> object:
    if path.suffix == '.safetensors':
        from safetensors.torch import load_file
        check_exported_file(path)  # safetensors files hold no checksum: an export's marker records one
        try:
            return load_file(str(path))
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(f'{path}: not a readable safetensors file ({exc})') from exc
    return load_weights_only(path)


def _is_state_dict(obj: object) -> bool:
    return isinstance(obj, Mapping) and len(obj) > 0 and all(isinstance(v, torch.Tensor) for v in obj.values())


def _unwrap(obj: object, path: Path, use_ema: bool | None) -> StateDict:
    if _is_state_dict(obj) and not use_ema:
        return dict(obj)
    if not isinstance(obj, Mapping):
        raise CheckpointError(f'{path}: expected a dict of tensors, found {type(obj).__name__}')
    if use_ema is False and obj.get(MODEL_WEIGHTS) == 'ema' and TRAINED_WEIGHTS not in obj:
        raise CheckpointError(f'{path} holds only its run\'s model, the EMA (a best.pth): the trained weights are in '
                              f'the run\'s last.pth')
    wrappers = _EMA_WRAPPERS if use_ema else (TRAINED_WEIGHTS, *_WRAPPERS) if use_ema is False else _WRAPPERS
    for key in wrappers:
        if key in obj and _is_state_dict(obj[key]):
            return dict(obj[key])
    raise CheckpointError(
        f'{path}: no {"EMA " if use_ema else ""}state dict under any of {list(wrappers)}; '
        f'top-level keys: {_key_list(sorted(map(str, obj)))}')


def _strip_prefixes(state_dict: StateDict) -> StateDict:
    def strip(key: str) -> str:
        while key.startswith(_PREFIXES):
            key = next(key[len(p):] for p in _PREFIXES if key.startswith(p))
        return key
    return {strip(k): v for k, v in state_dict.items()}


def read_state_dict(path: str | Path, use_ema: bool | None = None) -> StateDict:
    """The state dict in a checkpoint file, unwrapped: its model (None), its EMA (True) or trained weights (False)."""
    path = Path(path)
    return _strip_prefixes(_unwrap(_read_file(path), path, use_ema))


def release_filter(checkpoint: Mapping, model: nn.Module) -> StateDict:
    """timm's `pretrained_filter_fn`: the state dict unwrapped, its position table resampled to the model's grid."""
    state_dict = _strip_prefixes(_unwrap(checkpoint, Path(model.pretrained_cfg.get('url') or 'weights'), False))
    if 'pos_embed' in state_dict and state_dict['pos_embed'].shape != model.pos_embed.shape:
        state_dict['pos_embed'] = fit_pos_embed(model, state_dict['pos_embed'])
    return state_dict


def guess_family(keys: list[str]) -> str | None:
    """The suite family whose checkpoint signs the keys carry (shared signs where no other's match), or None."""
    carried = [family for family in families() if any(k.startswith(family.checkpoint_signs) for k in keys)]
    return next((family.name for family in sorted(carried, key=lambda family: family.shared_signs)), None)


def classifier_names(pretrained_cfg: Mapping | None) -> tuple[str, ...]:
    """The modules timm's pretrained config names as a model's classifiers (`head` when it names none)."""
    names = (pretrained_cfg or {}).get('classifier') or 'head'
    return (names,) if isinstance(names, str) else tuple(names)


def classifier_prefixes(model: nn.Module) -> tuple[str, ...]:
    """Key prefixes of the model's classifiers, and of the token and distillation heads any model may carry."""
    names = classifier_names(getattr(model, 'pretrained_cfg', None))
    return tuple(f'{name}.' for name in dict.fromkeys((*names, TOKEN_HEAD, DIST_HEAD)))


def checkpoint_class_count(name: str, checkpoint: str | Path, use_ema: bool | None = None) -> int:
    """The number of classes the classifier of a checkpoint of model `name` predicts."""
    cfg = timm.models.get_pretrained_cfg(name)
    names = classifier_names(cfg.to_dict() if cfg is not None else None)
    weights = read_state_dict(checkpoint, use_ema)
    key = next((f'{n}.weight' for n in names if f'{n}.weight' in weights), None)
    if key is None:
        raise CheckpointError(f'{checkpoint}: no weights of {name}\'s classifier ({", ".join(names)}) to tell '
                              f'its class count')
    return weights[key].shape[0]


def fit_pos_embed(model: nn.Module, value: torch.Tensor) -> torch.Tensor:
    """Resample a checkpoint's (square-grid) position table to the model's grid."""
    grid = tuple(model.patch_embed.grid_size)
    num_prefix = model.pos_embed.shape[1] - grid[0] * grid[1]
    side = math.isqrt(value.shape[1] - num_prefix)
    if side * side != value.shape[1] - num_prefix or value.shape[2] != model.pos_embed.shape[2]:
        return value  # not a table of this family: reported as mis-shaped
    return resize_pos_embed(value, grid, (side, side))


def adapt_state_dict(model: nn.Module, state_dict: StateDict, own: StateDict, report: LoadReport,
                     new_head: bool = False) -> StateDict:
    """Fit a checkpoint to `model` (whose state dict is `own`): resized position table, foreign classifiers dropped."""
    classifiers = classifier_prefixes(model)
    num_classes = getattr(model, 'num_classes', None)
    adapted = {}
    for key, value in state_dict.items():
        if key.startswith(classifiers) and key in own and not new_head and value.shape[0] != num_classes:
            raise CheckpointError(f'{report.path}: its classifier {key} has {value.shape[0]} classes, the model '
                                  f'{num_classes}; the data set does not match the checkpoint (a new classifier '
                                  f'for another class list needs the new-head option)')
        if key.startswith(classifiers) and (new_head or key not in own):
            report.dropped_classifier.append(key)
            continue
        if key == 'pos_embed' and key in own and value.shape != own[key].shape:
            value = fit_pos_embed(model, value)
            if value.shape == own[key].shape:
                report.resized.append(key)
        adapted[key] = value
    return adapted


def load_checkpoint(model: nn.Module, path: str | Path, use_ema: bool | None = None, strict: bool = True,
                    allow_unexpected: bool = False, new_head: bool = False,
                    own_init: tuple[str, ...] = ()) -> LoadReport:
    """Load a checkpoint file into `model` (formats: the module docstring). `strict`: a key that does not fit is a
    CheckpointError, the model untouched; else the fitting keys load. `allow_unexpected`, `new_head` (own classifiers
    kept), `own_init` (key endings the model initialises)."""
    report = LoadReport(str(path))
    own = model.state_dict()
    state_dict = adapt_state_dict(model, read_state_dict(path, use_ema), own, report, new_head)
    fresh_head = classifier_prefixes(model) if report.dropped_classifier or new_head else ()
    mismatch = key_mismatch(state_dict, own)
    report.missing = [k for k in mismatch['missing'] if not k.startswith(fresh_head) and not k.endswith(own_init)]
    report.unexpected, report.mismatched = mismatch['unexpected'], mismatch['mis-shaped']
    problems = {'missing': report.missing, 'unexpected': [] if allow_unexpected else report.unexpected,
                'mis-shaped': report.mismatched}
    if strict and any(problems.values()):
        found = guess_family(list(state_dict))
        name = getattr(model, 'pretrained_cfg', {}).get('architecture', type(model).__name__)
        family = f'the file holds a {found} model, not {name}; ' if found not in (None, model_family(name)) else ''
        raise CheckpointError(f'{path} does not fit {type(model).__name__}: {family}{describe_mismatch(problems)}')
    fitting = {k: v for k, v in state_dict.items() if k in own and v.shape == own[k].shape}
    model.load_state_dict(fitting, strict=False)
    return report


def pretrained_model(name: str, checkpoint: str | Path | None, num_classes: int, **kwargs) -> nn.Module:
    """A registered model (the suite's or timm's) in eval mode with the weights of `checkpoint`, or timm's pretrained
    weights without one (a machine annotator, a distillation teacher); it must predict `num_classes` classes."""
    if checkpoint is None:
        cfg = timm.models.get_pretrained_cfg(name)
        if cfg is None or not (cfg.hf_hub_id or cfg.url or cfg.file):
            raise UsageError(f'timm has no pretrained weights for {name}; give a checkpoint file')
        try:
            model = create_model(name, pretrained=True, **kwargs)
        except (OSError, RuntimeError) as e:  # offline, or a failed download
            raise CheckpointError(f'could not fetch timm\'s pretrained weights for {name} ({type(e).__name__}: '
                                  f'{first_line(e)}); give a local checkpoint file') from e
    else:
        model = create_model(name, num_classes=num_classes, **kwargs)
        load_checkpoint(model, checkpoint)
    if model.num_classes != num_classes:
        raise CheckpointError(f'{name} predicts {model.num_classes} classes, the data set has {num_classes}')
    return model.eval()


TIMM_RELEASE = 'timm'  # a checkpoint named `timm`: the release file the model's timm config names
URL_SCHEMES = ('http', 'https', 'file')
HF_WEIGHTS = 'model.safetensors'  # the file of a Hugging Face repo timm reads


def fetch_pretrained(source: str, model_name: str, setting: str = 'model.backbone.pretrained',
                     instead: str | None = None) -> str:
    """A checkpoint as a local file: a path as it is; a URL, or `timm` (`timm_release`), from the local cache,
    downloaded the first time. `setting` and `instead` (a flag's local-file option) name the source in errors."""
    if source == TIMM_RELEASE:
        return timm_release(model_name, setting, instead)
    if urlparse(source).scheme in URL_SCHEMES:
        return url_weights(source, setting, instead)
    return source


def timm_release(model_name: str, setting: str, instead: str | None) -> str:
    """The weights timm's config of `model_name` names, read from timm's cache before anything is downloaded."""
    cfg = get_pretrained_cfg(model_name)
    if cfg is None or not (cfg.url or cfg.hf_hub_id):
        raise CheckpointError(f"{setting}='timm': the timm config of {model_name} names no release file; give "
                              f"the path or URL of its ImageNet weights")
    url_cache = url_cache_path(cfg.url) if cfg.url and not cfg.url.endswith('.npz') else None  # JAX weights: no
    if cfg.hf_hub_id and (hf_cached(cfg.hf_hub_id) or url_cache is None or not url_cache.is_file()):
        return hf_weights(cfg.hf_hub_id, setting, instead)
    return url_weights(cfg.url, setting, instead)


def url_cache_path(url: str) -> Path:
    """Where torch hub's cache keeps the file of `url`."""
    return Path(torch.hub.get_dir()) / 'checkpoints' / Path(urlparse(url).path).name


def url_weights(url: str, setting: str, instead: str | None) -> str:
    """The file of `url` from torch hub's cache, downloaded into it when it is not there."""
    # no hash check: the releases' names hold accuracies ('-83.3.') where torch hub looks for a hash prefix
    return fetched(url, lambda: download_cached_file(url, check_hash=False), setting,
                   by_hand(f'download {url} to {url_cache_path(url)}', setting, instead))


def hf_cached(repo: str) -> str | None:
    """`repo`'s weights file in the Hugging Face cache, if there."""
    from huggingface_hub import try_to_load_from_cache
    cached = try_to_load_from_cache(repo, HF_WEIGHTS)
    return cached if isinstance(cached, str) else None


def hf_weights(repo: str, setting: str, instead: str | None) -> str:
    """`repo`'s weights from the Hugging Face cache, downloaded into it when they are not there."""
    from huggingface_hub import constants
    cached = hf_cached(repo)
    if cached:
        return cached
    how = f'hf download {repo} {HF_WEIGHTS} (into the Hugging Face cache, {constants.HF_HUB_CACHE})'
    return fetched(f'{repo} ({HF_WEIGHTS})', lambda: hf_hub_download(repo, HF_WEIGHTS), setting,
                   by_hand(how, setting, instead))


def by_hand(how: str, setting: str, instead: str | None) -> str:
    """What to do when a download fails: `how` to put the file where it is read, or give its path."""
    return f'{how}, or give the file with {instead}' if instead else f'download them by hand and set {setting} to ' \
                                                                      f'the file ({how})'


def fetched(source: str, download: Callable[[], str], setting: str, remedy: str) -> str:
    try:
        return download()
    except Exception as e:  # urllib, http.client and huggingface_hub raise their own kinds
        raise CheckpointError(f'cannot download the weights {source} ({type(e).__name__}: {first_line(e)}); '
                              f'{remedy}') from e
