"""The papers' recipes: ImageNet training, one preset per model, CIFAR transfer and fine-grained transfer (DeiT's);
every value can be overridden. Learning rates follow the linear scaling rule: lr = lr_base * global batch /
lr_base_batch."""
from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from timm.data import IMAGENET_DEFAULT_MEAN
from timm.optim import list_optimizers

from backbones.common.cli import (
    below_one,
    fraction,
    non_negative_float,
    non_negative_int,
    open_fraction,
    positive_float,
    positive_int,
    probability,
)
from backbones.common.errors import UsageError
from backbones.registry import family_of
from classification.data.augment import LabelAwareRandAugment
from classification.engine.trainer import Optimization

R = TypeVar('R')


@dataclass(kw_only=True)
class TrainingRecipe:
    """What ImageNet training and CIFAR transfer both set; each recipe gives the defaults that differ."""

    epochs: int
    warmup_epochs: int
    batch_size: int  # per process
    img_size: int | None = None  # None: the model's default input size
    opt: str
    lr_base_batch: int  # the global batch the learning rates are given for (they scale linearly with it)
    weight_decay: float
    min_lr: float
    clip_grad: float | None = None
    frozen: bool = False  # the classifiers alone learn: linear probing of fixed features
    layer_decay: float | None = None  # layer-wise lr decay (timm's; BEiT's, MAE's fine-tuning: 0.65-0.75); None: off
    drop_path: float = 0.1
    hflip: float = 0.5
    smoothing: float
    token_labeling: bool = False
    dense_weight: float = 0.5  # weight of the token term of the loss (the LV-ViT paper's beta, Eq. 4)
    mix_token: float  # MixToken Beta(alpha, alpha); 0 turns it off


@dataclass(kw_only=True)
class Recipe(TrainingRecipe):
    epochs: int = 300
    cooldown_epochs: int = 0
    warmup_epochs: int = 5
    batch_size: int = 128
    opt: str = 'adamw'
    lr_base: float = 5e-4
    lr_base_batch: int = 512
    weight_decay: float = 0.05
    warmup_lr: float = 1e-6
    min_lr: float = 1e-5
    ema_decay: float = 0.99996  # 0 turns the EMA off
    token_participation: float = 1.0  # the fraction of each image's tokens in the token term (paper's Fig. 4, left)
    cls_target: str = 'map'  # class-token target with token labeling: 'map' (RoIAlign 1x1) or 'label'
    token_target: str = 'map'  # patch-token targets: 'map', 'pooled' (ReLabel's on every token) or 'label'
    label_pooling: bool = False  # ReLabel: no token head; the class target is the map pooled over the crop (CutMix)
    mix_token: float = 1.0
    mixup: float = 0.8  # vanilla mode only
    cutmix: float = 1.0  # vanilla mode only
    smoothing: float = 0.1
    scale_min: float = 0.08
    interpolation: str = 'random'  # of the training crop: random (bilinear or bicubic), bilinear, bicubic
    auto_augment: str | None = 'rand-m9-mstd0.5-inc1'
    reprob: float = 0.25
    aug_repeats: int = 0  # repeated augmentation (DeiT, CaiT): each image this many times an epoch; 0: off
    zero_head: bool = False  # a new classifier (--finetune --new-head) starts at zero (ViT's fine-tuning)

    @property
    def uses_score_maps(self) -> bool:
        """Whether training reads a token-label store (token labeling with map targets, or label pooling)."""
        return (self.token_labeling and self.token_target != 'label') or self.label_pooling

    @property
    def unused_fields(self) -> tuple[str, ...]:
        """The fields this recipe's objective does not read (MixToken or CutMix replace MixUp)."""
        if self.token_labeling:
            return 'mixup', 'cutmix'
        return ('mixup',) if self.label_pooling else ()

    def applied(self) -> dict:
        """The recipe's values that training applies (what the log shows)."""
        return {k: v for k, v in vars(self).items() if k not in self.unused_fields}

    def optimization(self, global_batch: int) -> Optimization:
        """The recipe's optimisation at `global_batch` images per update (lr scaled linearly)."""
        return Optimization(self.opt, self.lr_base * global_batch / self.lr_base_batch, self.weight_decay,
                            self.epochs, self.warmup_epochs, self.warmup_lr, self.min_lr, self.cooldown_epochs,
                            clip_grad=self.clip_grad, ema_decay=self.ema_decay, layer_decay=self.layer_decay)

    def describe_epochs(self) -> str:
        """The epochs a run trains, the cooldown (T2T-ViT's recipe adds 10 at the floor lr) said out loud."""
        if not self.cooldown_epochs:
            return f'{self.epochs} epochs'
        return (f'{self.epochs} epochs + {self.cooldown_epochs} cooldown epochs at the final lr = '
                f'{self.epochs + self.cooldown_epochs} epochs (--cooldown-epochs 0 for none)')


# LV-ViT (Jiang et al.): token labeling, AdamW lr 1e-3 per 640 images, 300 epochs, 5 warmup, EMA 0.99992.
# (MixUp and CutMix are never combined with token labeling; they return with the Standard preset below.)
LVVIT = dict(token_labeling=True, lr_base=1e-3, lr_base_batch=640, ema_decay=0.99992)
# T2T-ViT (Yuan et al.): the DeiT recipe with 300 + 10 cooldown epochs and 10 warmup epochs.
T2T = dict(cooldown_epochs=10, warmup_epochs=10)
# DeiT (Touvron et al.), used for ViT and, for CaiT, with the CaiT paper's 400 epochs and DeiT's repeated augmentation
# (3 copies); lr 1e-3 per 1024 images is DeiT's 5e-4 per 512.
CAIT = dict(epochs=400, aug_repeats=3)
RECIPES = {'lvvit': LVVIT, 't2t_vit': T2T, 'deit': {}, 'cait': CAIT}  # by the name a family's record gives
# Stochastic depth (uniform) per size: LV-ViT's; CaiT paper, Table 3 (d_r; M48, not in the table, takes M36's).
DROP_PATH = {'lvvit_t': 0.1, 'lvvit_s': 0.1, 'lvvit_m': 0.2, 'lvvit_l': 0.3, 'cait_xxs24': 0.1, 'cait_xxs36': 0.1,
             'cait_xs24': 0.1, 'cait_xs36': 0.2, 'cait_s24': 0.1, 'cait_s36': 0.2, 'cait_s48': 0.3, 'cait_m24': 0.2,
             'cait_m36': 0.3, 'cait_m48': 0.3}

# The LV-ViT paper's comparison rows (its Table 2 and MixToken ablation) as overrides of a model's recipe.
# `lr_scale` multiplies lr_base when the recipe it replaces trained with token labeling: Standard takes 1e-3 per
# 1024 images where token labeling takes 1e-3 per 640.
PRESETS = {
    # token labeling with the annotator's score maps and MixToken: LV-ViT's own recipe
    'token-labeling': dict(token_labeling=True, token_target='map', mix_token=1.0),
    # the paper's Standard baseline: no token labels, MixUp 0.8 + CutMix 1.0, lr 1e-3 per 1024 images
    'standard': dict(token_labeling=False, mixup=0.8, cutmix=1.0, lr_scale=640 / 1024),
    # MixToken with the image label only: every token (and the class token) learns the image label; no annotator
    'mixtoken-label': dict(token_labeling=True, token_target='label', cls_target='label', mix_token=1.0),
    # Table 2's CutMix + image label: a plain classifier with CutMix alone (no MixUp, no token labels), lr as Standard
    'cutmix-label': dict(token_labeling=False, mixup=0.0, cutmix=1.0, lr_scale=640 / 1024),
    # token labeling without MixToken
    'token-labeling-no-mixtoken': dict(token_labeling=True, token_target='map', mix_token=0.0),
    # ReLabel (Table 2's CutMix + ReLabel, Table 4): a plain classifier learns the map pooled over each crop, CutMix
    'relabel': dict(token_labeling=False, label_pooling=True, mixup=0.0, cutmix=1.0, lr_scale=640 / 1024),
    # Table 2's MixToken + ReLabel: token labeling and MixToken, every token learning the map pooled over the crop
    'relabel-mixtoken': dict(token_labeling=True, token_target='pooled', cls_target='map', mix_token=1.0),
    # the ViT paper's fine-tuning (with --finetune): lr 0.01 per 512 images (its grid: 0.001 to 0.03), 8 epochs (its
    # 20k steps of 512), inception crop and flip only (docs/imagenet.md)
    'vit-finetune': dict(token_labeling=False, opt='momentum', lr_base=0.01, lr_base_batch=512, weight_decay=0.0,
                         clip_grad=1.0, img_size=384, epochs=8, warmup_epochs=0, min_lr=0.0, zero_head=True,
                         auto_augment=None, reprob=0.0, mixup=0.0, cutmix=0.0, smoothing=0.0, drop_path=0.0,
                         ema_decay=0.0, aug_repeats=0),
}


def apply_preset(values: dict, preset: str) -> dict:
    if preset not in PRESETS:
        raise ValueError(f'unknown preset {preset!r}; choose one of: {", ".join(PRESETS)}')
    values = dict(values)
    overrides = dict(PRESETS[preset])
    lr_scale = overrides.pop('lr_scale', 1.0)
    if values.get('token_labeling') and not overrides['token_labeling']:
        values['lr_base'] = values.get('lr_base', Recipe.lr_base) * lr_scale
    values.update(overrides)
    return values


def recipe_for(model_name: str, preset: str | None = None, data_values: dict | None = None) -> Recipe:
    """The model's family recipe (DeiT's outside the suite), with `data_values` and then a preset applied."""
    values = dict(RECIPES[family_of(model_name).recipe])
    size = '_'.join(model_name.split('.')[0].split('_')[:2])  # lvvit_s, cait_xs24: no pretrained tag, no resolution
    if size in DROP_PATH:
        values['drop_path'] = DROP_PATH[size]
    values.update(data_values or {})
    if preset is not None:
        values = apply_preset(values, preset)
    return Recipe(**values)


@dataclass(kw_only=True)
class TransferRecipe(TrainingRecipe):
    """CIFAR transfer (T2T-ViT paper, Table 5): the new classifier at `lr`, the rest at `lr * backbone_lr_scale`, one
    cosine to `min_lr`, all scaled with the global batch; with token labeling every token learns the image label."""

    epochs: int = 60
    warmup_epochs: int = 0
    batch_size: int = 64
    opt: str = 'sgd'  # sgd (momentum, no Nesterov) or adamw
    lr: float = 0.05
    lr_base_batch: int = 64
    backbone_lr_scale: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 5e-4
    min_lr: float = 2e-4
    crop_padding: int | None = None  # random crop from the image padded by this much; None: img_size // 8
    smoothing: float = 0.0
    val_fraction: float = 0.1  # of every class of the training set, held out for model selection
    mix_token: float = 0.0

    def optimization(self, global_batch: int) -> Optimization:
        """The recipe at `global_batch` images per update: `lr` (the new classifier's) and `min_lr` scaled linearly."""
        scale = global_batch / self.lr_base_batch
        return Optimization(TRANSFER_OPTIMIZERS_TIMM[self.opt], self.lr * scale, self.weight_decay, self.epochs,
                            self.warmup_epochs, min_lr=self.min_lr * scale, momentum=self.momentum,
                            clip_grad=self.clip_grad, layer_decay=self.layer_decay)


# AdamW wants a far smaller step than SGD: 1e-3 on the head, 1e-4 on the backbone, one warm-up epoch.
TRANSFER_ADAMW = dict(opt='adamw', lr=1e-3, backbone_lr_scale=0.1, weight_decay=0.05, min_lr=1e-6, warmup_epochs=1)
TRANSFER_OPTIMIZERS = {'sgd': {}, 'adamw': TRANSFER_ADAMW}
TRANSFER_OPTIMIZERS_TIMM = {'sgd': 'momentum', 'adamw': 'adamw'}  # timm's name: its 'sgd' is Nesterov, the recipe's not


def transfer_recipe(opt: str = 'sgd') -> TransferRecipe:
    if opt not in TRANSFER_OPTIMIZERS:
        raise UsageError(f'--opt must be one of {", ".join(TRANSFER_OPTIMIZERS)}, got {opt}')
    return TransferRecipe(**TRANSFER_OPTIMIZERS[opt])


# Fine-grained transfer (tools/transfer.py --dataset ...): DeiT's fine-tuning for transfer (DeiT paper, section 5.3),
# DeiT main.py's defaults as iBOT's evaluation keeps them; docs/cifar.md gives the sources.
DEIT_FINETUNE = dict(token_labeling=False, label_pooling=False, mix_token=0.0, opt='adamw', lr_base_batch=512,
                     weight_decay=0.05, warmup_epochs=5, warmup_lr=1e-6, min_lr=1e-5, cooldown_epochs=0,
                     auto_augment='rand-m9-mstd0.5-inc1', interpolation='bicubic', reprob=0.25, mixup=0.8, cutmix=1.0,
                     smoothing=0.1, drop_path=0.1, ema_decay=0.99996, aug_repeats=3, img_size=224, clip_grad=None,
                     zero_head=False)
# Per set, iBOT's run.sh for ViT-B/16; Pets and a folder data set take Flowers' values (neither paper gives them).
TRANSFER_SETS = {
    'flowers102': dict(batch_size=96, lr_base=7.5e-6, epochs=1000),
    'cars': dict(batch_size=96, lr_base=7.5e-5, epochs=1000),
    'pets': dict(batch_size=96, lr_base=7.5e-6, epochs=1000),
    'inat2018': dict(batch_size=96, lr_base=7.5e-6, epochs=360, reprob=0.1),
    'inat2019': dict(batch_size=96, lr_base=7.5e-6, epochs=360, reprob=0.1),
    'folder': dict(batch_size=96, lr_base=7.5e-6, epochs=1000),
}


def transfer_set_recipe(model_name: str, dataset: str, data_values: dict | None = None) -> Recipe:
    """The fine-grained transfer recipe of `dataset` for `model_name`, `data_values` over it."""
    if dataset not in TRANSFER_SETS:
        raise UsageError(f'no transfer recipe for {dataset!r}; choose from {", ".join(TRANSFER_SETS)}')
    return recipe_for(model_name, data_values={**DEIT_FINETUNE, **TRANSFER_SETS[dataset], **(data_values or {})})


def rand_augment_spec(text: str) -> str:
    """A timm RandAugment string (`rand-m9-mstd0.5-inc1`): the only kind the label-aware augmentation replays."""
    try:
        name, *sections = text.split('-')
        # timm skips a section it cannot split into a key and a number: rand-zz would silently be the default
        if name != 'rand' or not all(s.startswith('t') or re.fullmatch(r'(mstd|mmax|inc|m|n|p)\d[\d.]*', s)
                                     for s in sections):
            raise ValueError
        LabelAwareRandAugment.from_config(text, 224, IMAGENET_DEFAULT_MEAN)  # as training builds it
    except (AssertionError, ValueError, KeyError, IndexError):
        raise argparse.ArgumentTypeError(f'not a RandAugment string like rand-m9-mstd0.5-inc1: {text!r} '
                                         f'(none turns it off)') from None
    return text


def timm_optimizer(text: str) -> str:
    known = list_optimizers()
    if text.lower() not in known:
        raise argparse.ArgumentTypeError(f'unknown optimizer {text!r}; timm knows {", ".join(known[:12])}, ... '
                                         f'(timm.optim.list_optimizers() lists all {len(known)})')
    return text.lower()


# The value each recipe field takes on the command line (both recipes: a name means the same in each).
FIELD_TYPES: dict[str, Callable[[str], object]] = {
    'epochs': positive_int, 'cooldown_epochs': non_negative_int, 'warmup_epochs': non_negative_int,
    'batch_size': positive_int, 'img_size': positive_int, 'lr_base': positive_float, 'lr_base_batch': positive_int,
    'lr': positive_float, 'backbone_lr_scale': non_negative_float, 'momentum': below_one,
    'weight_decay': non_negative_float, 'warmup_lr': non_negative_float, 'min_lr': non_negative_float,
    'clip_grad': positive_float, 'layer_decay': fraction, 'drop_path': below_one, 'ema_decay': below_one,
    'dense_weight': non_negative_float,
    'token_participation': fraction, 'mix_token': non_negative_float, 'mixup': non_negative_float,
    'cutmix': non_negative_float, 'smoothing': below_one, 'scale_min': fraction, 'hflip': probability,
    'reprob': probability,
    'auto_augment': rand_augment_spec, 'opt': timm_optimizer, 'crop_padding': non_negative_int,
    'val_fraction': open_fraction, 'aug_repeats': non_negative_int,
}
FIELD_CHOICES = {
    'cls_target': ('map', 'label'), 'token_target': ('map', 'pooled', 'label'),
    'interpolation': ('random', 'bilinear', 'bicubic'),
}
# What each recipe field sets, for --help (both recipes: a name means the same in each).
FIELD_HELP = {
    'epochs': 'training epochs', 'cooldown_epochs': 'epochs at the final lr after the schedule',
    'warmup_epochs': 'epochs of linear lr warm-up', 'batch_size': 'images per process per batch',
    'img_size': "training input size (none: the model's own)",
    'opt': "optimizer (timm's name; the transfer recipe: sgd or adamw)",
    'lr_base': 'learning rate for lr_base_batch images per update (scaled linearly with the global batch)',
    'lr': "the new classifier's learning rate for lr_base_batch images per update (scaled linearly)",
    'lr_base_batch': 'the global batch the base learning rate is given for',
    'backbone_lr_scale': "the backbone's learning rate as a fraction of the classifier's",
    'momentum': "SGD's momentum", 'weight_decay': 'weight decay (none on biases, norms and position tables)',
    'warmup_lr': 'learning rate the warm-up starts from', 'min_lr': 'the floor the cosine schedule decays to',
    'clip_grad': 'clip gradients at this global norm (none: no clipping)',
    'layer_decay': "layer-wise lr decay: block i (from 0) of N learns at lr x rate^(N - i), the embedding at "
                   "rate^(N + 1), the classifiers at lr (timm's param_groups_layer_decay; none: off)",
    'drop_path': 'stochastic depth rate', 'ema_decay': 'decay of the weights\' EMA (0: no EMA)',
    'token_labeling': 'token labeling: a token head trained on per-token targets',
    'frozen': 'the classifiers alone learn (linear probing): the rest keeps its weights and stays in eval mode',
    'dense_weight': "weight of the token term of the loss (the LV-ViT paper's beta)",
    'token_participation': "fraction of each image's tokens in the token term (the paper's Figure 4)",
    'cls_target': "the class token's target with token labeling: the annotator's map (RoIAlign 1x1) or the label",
    'token_target': "patch tokens' targets: the annotator's maps, the map pooled over the crop, or the label",
    'label_pooling': "ReLabel: no token head; the class target is the map pooled over the crop (with CutMix)",
    'mix_token': 'MixToken Beta(alpha, alpha) (0: off)', 'mixup': 'MixUp alpha without token labeling (0: off)',
    'cutmix': 'CutMix alpha without token labeling (0: off)', 'smoothing': 'label smoothing',
    'scale_min': "RandomResizedCrop's smallest area", 'interpolation': 'resampling of the training crop',
    'hflip': 'probability of a horizontal flip', 'auto_augment': 'RandAugment string (none: off)',
    'reprob': 'random erasing probability',
    'aug_repeats': 'repeated augmentation: each image this many times an epoch (0: off)',
    'zero_head': 'a new classifier (--finetune --new-head) starts at zero',
    'crop_padding': 'random crop from the image padded by this much (none: img_size // 8)',
    'val_fraction': 'share of every class held out of the training set for model selection',
}


def none_or(kind: Callable[[str], object]) -> Callable[[str], object]:
    """A command-line value of `kind`, or the word `none` (None)."""
    def parse(text: str):
        return None if text.lower() == 'none' else kind(text)
    parse.__name__ = getattr(kind, '__name__', 'value')
    return parse


# timm's train.py names of recipe fields, taken as well
FIELD_ALIASES = {'auto_augment': ('--aa',), 'ema_decay': ('--model-ema-decay',)}


def add_recipe_arguments(group: argparse._ArgumentGroup, recipe_class: type,
                         choices: dict[str, Sequence[str]] | None = None) -> None:
    """One `--flag` per field of a recipe dataclass (absent unless given), typed by FIELD_TYPES and the choices."""
    own = choices or {}
    choices = {**FIELD_CHOICES, **own}
    for f in dataclasses.fields(recipe_class):
        flag = '--' + f.name.replace('_', '-')
        flags = (flag, *FIELD_ALIASES.get(f.name, ()))
        if f.type in ('bool', bool):
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                               help=FIELD_HELP[f.name])
            continue
        kind = str if f.name in own else FIELD_TYPES.get(f.name, str)  # the command's choices: its own words
        if str(f.type).endswith('| None'):  # the field's annotation (a string: postponed evaluation)
            kind = none_or(kind)
        group.add_argument(*flags, dest=f.name, type=kind, choices=choices.get(f.name),
                           default=argparse.SUPPRESS, help=FIELD_HELP[f.name])


def override_recipe(recipe: R, args: argparse.Namespace) -> R:
    """The recipe with every field given on the command line (None included: `--auto-augment none`) replaced."""
    for f in dataclasses.fields(recipe):
        if hasattr(args, f.name):
            setattr(recipe, f.name, getattr(args, f.name))
    if recipe.frozen and recipe.layer_decay:
        raise UsageError(f'--frozen with --layer-decay {recipe.layer_decay}: the frozen features learn nothing whose '
                         'rate could decay (leave --layer-decay out)')
    return recipe


def chosen_preset(args: argparse.Namespace) -> str | None:
    """--preset, or Standard when --no-token-labeling turns off the recipe's token labeling (the paper's baseline)."""
    if args.preset is None and getattr(args, 'token_labeling', None) is False and recipe_for(args.model).token_labeling:
        return 'standard'
    return args.preset


TIMM_EMA_DECAY = 0.9998  # timm's train.py: --model-ema's decay unless --model-ema-decay


def resolve_recipe(args: argparse.Namespace, data_values: dict | None = None) -> Recipe:
    """The model's recipe for the data, --preset and every recipe flag applied (and timm's --model-ema)."""
    recipe = override_recipe(recipe_for(args.model, chosen_preset(args), data_values), args)
    if getattr(args, 'model_ema', False) and recipe.ema_decay == 0 and not hasattr(args, 'ema_decay'):
        recipe.ema_decay = TIMM_EMA_DECAY
    return recipe
