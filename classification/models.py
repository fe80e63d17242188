"""The classifiers the applications train and evaluate: any registered model (the suite's, or any timm model), at
the input size asked for, with a token head and MixToken for token labeling or a distillation token for DeiT's
distillation; a trained classifier from its checkpoint; and the distillation teacher."""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import torch
import torch.nn as nn
from timm.data import resolve_data_config
from timm.models import get_pretrained_cfg

from backbones import TokenLabelingModel, bare_model, create_model, load_checkpoint, model_family
from backbones.common.errors import CheckpointError, CheckpointReadError, UsageError
from backbones.common.log import logger
from backbones.registry import check_model_name, families, family_of
from backbones.token_head import TOKEN_HEAD, patch_embedding, token_grid
from backbones.weights import (
    TIMM_RELEASE,
    checkpoint_class_count,
    classifier_prefixes,
    fetch_pretrained,
    read_state_dict,
)
from classification.engine.checkpoints import checkpoint_data_config
from classification.token_labeling.annotate import dense_scores


class FrozenFeatures:
    """Mixed into a model with fixed features: training leaves all but the classifiers in eval mode."""

    def train(self, mode: bool = True) -> nn.Module:
        super().train(mode)
        heads = classifier_prefixes(self)
        for name, child in self.named_children():
            if not f'{name}.'.startswith(heads):
                child.eval()
        return self


def freeze_features(model: nn.Module) -> None:
    """Linear probing's model (`--frozen`): every parameter but the classifiers' fixed, the features in eval mode."""
    heads = classifier_prefixes(model)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.startswith(heads))
    model.__class__ = type(f'Frozen{type(model).__name__}', (FrozenFeatures, type(model)), {})


def create_classifier(name: str, num_classes: int, img_size: int | None = None, token_labeling: bool = False,
                      mix_token: float = 1.0, distilled: bool = False, frozen: bool = False, **kwargs) -> nn.Module:
    """A model for training or evaluation (`token_labeling`, `distilled`, `frozen`); `architecture` records them."""
    architecture = {'model': name, 'num_classes': num_classes, 'img_size': img_size, 'token_labeling': token_labeling,
                    'mix_token': mix_token, 'distilled': distilled, 'kwargs': dict(kwargs)}
    family = family_of(name)
    if distilled and (not family.distillation_token or token_labeling):
        raise UsageError(f'distillation takes a {"/".join(f.name for f in families() if f.distillation_token)} model '
                         f'without token labeling, not {name}{" with token labeling" if token_labeling else ""}')
    if distilled:
        kwargs['distilled'] = True
    if img_size is not None and takes_input_size(name):
        kwargs['img_size'] = img_size
    if family.token_head_kwarg:
        kwargs[family.token_head_kwarg] = token_labeling
    try:
        model = create_model(name, num_classes=num_classes, **kwargs)
    except TypeError as e:  # an argument the model does not take
        raise UsageError(f'{name} does not take these arguments: {e}') from e
    check_input_size(model, name, img_size)
    if frozen:
        freeze_features(model)
    model = TokenLabelingModel(model, mix_token) if token_labeling else model
    model.architecture = architecture
    return model


def build_eval_model(name: str, checkpoint: str, num_classes: int, img_size: int | None, use_ema: bool | None,
                     model_kwargs: dict) -> torch.nn.Module:
    """The model with the checkpoint's weights; a token head or a distillation token is attached when the checkpoint
    has one. A classifier for another number of classes is an error (never a random head in its place)."""
    keys = read_state_dict(checkpoint, use_ema)
    token_head = any(k.startswith(f'{TOKEN_HEAD}.') for k in keys)
    model = create_classifier(name, num_classes, img_size, token_labeling=token_head,
                              distilled='dist_token' in keys, **model_kwargs)
    report = load_checkpoint(bare_model(model), checkpoint, use_ema=use_ema)
    if report.resized:  # a file recording no size (a bare state dict) trained at another one
        size = f'{img_size} px' if img_size else "the model's own size"
        logger.warning(f'warning: {checkpoint} holds a position table for another input size than {size}: it was '
                       f'resized to run there (give --img-size, the size it was trained at, to run it as trained)')
    return model.eval()


def trained_data_config(name: str, checkpoint: str | None, img_size: int | None = None,
                        crop_pct: float | None = None) -> dict:
    """The data config a checkpoint of `name` is evaluated with: its run's record, `img_size` and `crop_pct` over it."""
    return checkpoint_data_config(checkpoint, model_data_config(name), img_size, crop_pct)


def load_trained_classifier(name: str, checkpoint: str, data_config: dict, use_ema: bool | None = None,
                            model_kwargs: dict | None = None, num_classes: int | None = None) -> torch.nn.Module:
    """The trained classifier at `data_config`'s size, for the checkpoint's class count unless `num_classes`."""
    count = checkpoint_class_count(name, checkpoint, use_ema) if num_classes is None else num_classes
    return build_eval_model(name, checkpoint, count, data_config['input_size'][-1], use_ema, model_kwargs or {})


PRETRAINED_HELP = ("timm's pretrained weights of the model (the release file its timm config names, or its Hugging "
                   "Face repo's), read from the local cache (downloaded into it once where there is a network)")


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """The weights a command evaluates: `--checkpoint FILE`, or `--pretrained`, the model's official release."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument('--checkpoint', help='a checkpoint of train_cls/transfer or a release file')
    source.add_argument('--pretrained', action='store_true', help=PRETRAINED_HELP)


def checkpoint_file(args: argparse.Namespace) -> str:
    """The checkpoint file `add_checkpoint_arguments` names: --checkpoint, or the model's release in timm's cache."""
    return pretrained_file(args.model, '--checkpoint FILE') if args.pretrained else args.checkpoint


def pretrained_file(model_name: str, instead: str) -> str:
    """timm's pretrained weights of `model_name` (its release file, or its Hugging Face repo's) from the local cache:
    what `--pretrained` means in every command; `instead` names the option that takes a local file."""
    return fetch_pretrained(TIMM_RELEASE, model_name, '--pretrained', instead)


CHECKPOINT_SUFFIXES = ('.pth', '.pt', '.tar', '.bin', '.safetensors', '.npz', '.ckpt')


def add_start_arguments(parser: argparse.ArgumentParser, finetune_help: str) -> None:
    """`--finetune CKPT` (a local file) or `--pretrained` (timm's weights): `start_weights`."""
    start = parser.add_mutually_exclusive_group()
    start.add_argument('--finetune', metavar='CKPT', help=finetune_help)
    start.add_argument('--pretrained', action='store_true', help=f'start from {PRETRAINED_HELP} (as --finetune does '
                                                                 f'from that file)')


def start_weights(args: argparse.Namespace) -> str | None:
    """The file a training run starts from, named before any data is listed (an ImageNet listing takes minutes)."""
    if args.pretrained:
        return pretrained_file(args.model, '--finetune FILE')
    if args.finetune is not None and not Path(args.finetune).is_file():
        raise CheckpointReadError(f'{args.finetune}: PyTorch checkpoint not found (--finetune)')
    return args.finetune


def refuse_pretrained_file(argv: list[str]) -> None:
    """`--pretrained FILE`, the former spelling of `--finetune FILE`, refused with the new one."""
    for i, arg in enumerate(argv):
        value = arg.partition('=')[2] if arg.startswith('--pretrained=') else \
            (argv[i + 1] if arg == '--pretrained' and i + 1 < len(argv) else None)
        if value and not value.startswith('-') and (Path(value).suffix in CHECKPOINT_SUFFIXES or '/' in value
                                                    or Path(value).is_file()):
            raise UsageError(f'--pretrained {value}: --pretrained takes no file now (it starts from timm\'s pretrained '
                             f'weights of the model); start from a local file with --finetune {value}')


def check_finite(logits: torch.Tensor, checkpoint: str) -> torch.Tensor:
    """`logits` when all are numbers, else a CheckpointError naming the checkpoint (NaN still gives an argmax)."""
    finite = torch.isfinite(logits).flatten(1).all(dim=1)
    if not finite.all():
        raise CheckpointError(f'{checkpoint}: the model gives NaN or infinite logits for {int((~finite).sum())} of '
                              f'{len(finite)} images: its weights hold such values, or a reduced-precision '
                              f'computation (--amp) overflows; no result')
    return logits


def zero_classifiers(model: nn.Module) -> None:
    """Zero the weights and biases of every classifier head: ViT fine-tuning's start of a new head."""
    heads = model.get_classifier()
    for head in (*(heads if isinstance(heads, tuple) else (heads,)), getattr(model, TOKEN_HEAD, None)):
        for param in (head.parameters() if head is not None else ()):
            nn.init.zeros_(param)


def takes_input_size(name: str) -> bool:
    """Whether a model is built for one input size: the suite's, and timm's whose cfg says so."""
    return model_family(name) is not None or bool(get_pretrained_cfg(name).fixed_input_size)


def whole_patches(name: str, img_size: int, model_kwargs: dict | None = None) -> int:
    """The input size nearest `img_size` of a whole number of the model's patches (at least one)."""
    patch = getattr(patch_embedding(create_model(name, num_classes=0, **(model_kwargs or {}))), 'patch_size', None)
    if not patch or img_size % patch[0] == 0:
        return img_size
    return max(1, round(img_size / patch[0])) * patch[0]


def check_input_size(model: nn.Module, name: str, img_size: int | None) -> None:
    """The input size must give the model at least one patch, and whole patches where its embedding needs that."""
    patch_embed = patch_embedding(model)
    if img_size is None or patch_embed is None:
        return
    grid = token_grid(patch_embed, (img_size, img_size))
    patch = getattr(patch_embed, 'patch_size', None)
    if min(grid) < 1:
        raise UsageError(f'--img-size {img_size} is smaller than one patch of {name}'
                         + (f' ({patch[0]} px)' if patch else ''))
    if patch and not getattr(patch_embed, 'dynamic_img_pad', False) and img_size % patch[0]:
        raise UsageError(f'--img-size {img_size} does not fit {name}: it needs a multiple of its {patch[0]} px '
                         f'patches')


def model_data_config(name: str) -> dict:
    check_model_name(name)
    return resolve_data_config({}, pretrained_cfg=get_pretrained_cfg(name).to_dict())


R = TypeVar('R')  # a recipe: a dataclass with `img_size`


def recipe_at_start_size(recipe: R, model_name: str, weights: str | None) -> tuple[R, dict]:
    """`recipe` at the size its run trains at, and the model's data config: the recipe's `img_size` where it sets
    one, else the size the start `weights` were trained at (a fine-tuning runs there by default), else the model's."""
    data_cfg = model_data_config(model_name)
    return replace(recipe, img_size=checkpoint_data_config(weights, data_cfg, recipe.img_size)['input_size'][-1]), \
        data_cfg


class Teacher(nn.Module):
    """A frozen classifier whose class the distillation head learns, or whose dense map of each batch gives the token
    targets: in eval mode without gradients, fed the student's images renormalised to its own mean and std."""

    def __init__(self, model: nn.Module, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.model = model.eval().requires_grad_(False)
        cfg = bare_model(model).pretrained_cfg

        def channels(values: Sequence[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32).view(1, -1, 1, 1)

        self.register_buffer('scale', channels(std) / channels(cfg['std']), persistent=False)
        self.register_buffer('shift', (channels(mean) - channels(cfg['mean'])) / channels(cfg['std']),
                             persistent=False)

    def train(self, mode: bool = True) -> 'Teacher':
        return super().train(False)  # a teacher never trains: no dropout, frozen batch-norm statistics

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images * self.scale + self.shift).argmax(dim=-1)

    @torch.no_grad()
    def dense_map(self, images: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-k logits and classes (B, h, w, k), best first, of the teacher's dense scores of `images`."""
        scores = dense_scores(bare_model(self.model), images * self.scale + self.shift).float()
        top = scores.topk(min(topk, scores.shape[-1]), dim=-1)
        return top.values, top.indices
