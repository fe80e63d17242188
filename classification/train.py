"""ImageNet-style training of any suite model, with token labeling (LV-ViT's recipe) or the vanilla DeiT recipe.

`tools/train_cls.py` is the command; `main(argv)` is the same thing callable from Python.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
from pathlib import Path
from typing import Callable, List, Optional

import timm
import torch
import torch.nn as nn
from timm.data import Mixup, resolve_data_config
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3
from torch.utils.data import DataLoader, DistributedSampler

from backbones import CheckpointError, TokenLabelingModel, create_model, load_checkpoint
from backbones.cli import DEVICES, non_negative_int, positive_int
from backbones.errors import DataError, UsageError
from backbones.registry import check_model_name, model_family
from backbones.token_labeling import TOKEN_HEAD

from .augment import TrainTransform
from .checkpointing import checkpoint_classes, seed_all, write_json_atomic
from .data import ImageFolderDataset, check_same_classes, collate_skipping, eval_transform
from .distributed import DistInfo, ShardSampler, barrier, cleanup, init_distributed
from .engine import Objective, StepState
from .fit import METRICS, Fit, RunLog, bare_model, resume_path
from .label_store import TokenLabelStore
from .loss import TokenLabelingLoss
from .recipes import PRESETS, Recipe, add_recipe_arguments, override_recipe, recipe_for
from .targets import TokenTargetBuilder


def parse_model_kwargs(items: List[str]) -> dict:
    """`key=value` pairs, values parsed as Python literals where they are one (numbers, True, None)."""
    kwargs = {}
    for item in items:
        key, sep, value = item.partition('=')
        if not sep:
            raise UsageError(f'--model-kwargs takes key=value, got {item!r}')
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key] = value
    return kwargs


def add_run_arguments(p: argparse.ArgumentParser, default_output: str) -> None:
    """Options every training command has: output and resume, model arguments, processes, device, precision."""
    p.add_argument('--output', help=f'output folder (default {default_output})')
    p.add_argument('--resume', nargs='?', const='auto', metavar='CKPT',
                   help='continue an interrupted run: from CKPT, or from OUTPUT/last.pth when no path is given')
    p.add_argument('--model-kwargs', nargs='*', default=[], metavar='KEY=VALUE',
                   help='extra model arguments, e.g. depth=2 embed_dim=64 (tiny test models)')
    p.add_argument('--workers', type=non_negative_int, default=min(4, os.cpu_count() or 1),
                   help='data-loading processes per training process')
    p.add_argument('--seed', type=non_negative_int, default=42)
    p.add_argument('--device', choices=DEVICES, help='default: cuda when available')
    p.add_argument('--amp', choices=['auto', 'none', 'bf16', 'fp16'], default='auto',
                   help='mixed precision; auto: bf16 on GPUs that have it, fp16 on older GPUs, none on CPU')
    p.add_argument('--log-interval', type=positive_int, default=50, help='updates between TensorBoard loss points')
    p.add_argument('--grad-checkpointing', action='store_true',
                   help='recompute each block\'s activations in the backward pass: less memory, more compute')


def model_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A training command's parser, its first argument the model name."""
    p = argparse.ArgumentParser(prog=prog, description=description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('model', help='model name (tools/model_info.py --all lists them)')
    return p


def build_parser() -> argparse.ArgumentParser:
    p = model_parser('train_cls.py', 'Train a suite model on an ImageNet-layout folder with its paper recipe (token '
                     'labeling for LV-ViT). Without --data-dir it runs on the embedded scikit-learn digits data set.')
    p.add_argument('--data-dir', help='folder with train/CLASS/*.JPEG and val/CLASS/*.JPEG')
    p.add_argument('--token-label-dir', help='token-label store from tools/generate_token_labels.py')
    p.add_argument('--finetune', metavar='CKPT', help='start from these weights (e.g. for 384 fine-tuning); '
                   'position embeddings are resized; the classes must be the data\'s unless --new-head')
    p.add_argument('--new-head', action='store_true',
                   help='with --finetune: train new classifiers for this data set\'s classes')
    p.add_argument('--skip-unreadable', action='store_true',
                   help='skip images that cannot be decoded and report the count (default: stop, naming the file)')
    p.add_argument('--digits-dir', default='data/digits', help='where the embedded digits run writes its data')
    p.add_argument('--preset', choices=list(PRESETS), help=(
        'one of the LV-ViT paper\'s comparison rows, applied over the model\'s recipe: token-labeling (LV-ViT\'s '
        'default), standard (MixUp 0.8 + CutMix 1.0, no token labels, lr 1e-3 per 1024 images; also what '
        '--no-token-labeling gives LV-ViT), mixtoken-label (MixToken with the image label only), '
        'token-labeling-no-mixtoken'))
    add_run_arguments(p, 'output/train_cls/MODEL')
    add_recipe_arguments(p.add_argument_group('recipe (defaults: the model\'s paper preset, printed at start)'),
                         Recipe)
    return p


def chosen_preset(args: argparse.Namespace) -> Optional[str]:
    """--preset, or Standard when --no-token-labeling turns off LV-ViT's token labeling (the paper's baseline)."""
    if args.preset is None and getattr(args, 'token_labeling', None) is False and model_family(args.model) == 'lvvit':
        return 'standard'
    return args.preset


def resolve_recipe(args: argparse.Namespace, digits: bool) -> Recipe:
    return override_recipe(recipe_for(args.model, digits, chosen_preset(args)), args)


def pick_amp(amp: str, device: torch.device) -> str:
    if amp != 'auto':
        if amp != 'none' and device.type != 'cuda':
            raise UsageError(f'--amp {amp} needs a GPU; this run is on {device}')
        return amp
    if device.type != 'cuda':
        return 'none'
    return 'bf16' if torch.cuda.is_bf16_supported() else 'fp16'


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


def describe_epochs(recipe: Recipe) -> str:
    """The epochs a run trains, the cooldown (T2T-ViT's recipe adds 10 at the floor lr) said out loud."""
    if not recipe.cooldown_epochs:
        return f'{recipe.epochs} epochs'
    return (f'{recipe.epochs} epochs + {recipe.cooldown_epochs} cooldown epochs at the final lr = '
            f'{recipe.epochs + recipe.cooldown_epochs} epochs (--cooldown-epochs 0 for none)')


def build_model(args: argparse.Namespace, recipe: Recipe, num_classes: int, img_size: int) -> nn.Module:
    return create_classifier(args.model, num_classes, img_size, recipe.token_labeling, recipe.mix_token,
                             drop_path_rate=recipe.drop_path, **parse_model_kwargs(args.model_kwargs))


def use_grad_checkpointing(model: nn.Module, enable: bool) -> None:
    """Turn on the model's gradient checkpointing (timm's `set_grad_checkpointing`) when asked."""
    if not enable:
        return
    target = bare_model(model)
    if not hasattr(target, 'set_grad_checkpointing'):
        raise UsageError(f'{type(target).__name__} has no gradient checkpointing (--grad-checkpointing)')
    target.set_grad_checkpointing(True)


def load_finetune_weights(model: nn.Module, path: str, classes: List[str], new_head: bool) -> str:
    """The --finetune weights; the checkpoint's classes (when it records them) must be the data's, or new_head."""
    recorded = checkpoint_classes(path)
    if recorded is not None and not new_head:
        check_same_classes(recorded, classes, f'the checkpoint {path}', 'the training split')
    report = load_checkpoint(model, path, strict=False, new_head=new_head)
    missing = [k for k in report.missing if not k.startswith(f'{TOKEN_HEAD}.')]  # a token head may be new
    if missing or report.mismatched:
        raise CheckpointError(f'{path} does not fit {type(model).__name__}: ' + report.summary())
    return report.summary()


def make_loaders(args, recipe: Recipe, info: DistInfo, data_dir: Path, store: Optional[TokenLabelStore],
                 data_cfg: dict, img_size: int):
    train_tf = TrainTransform(img_size, scale=(recipe.scale_min, 1.0), hflip=recipe.hflip,
                              auto_augment=recipe.auto_augment, reprob=recipe.reprob,
                              interpolation=recipe.interpolation, mean=data_cfg['mean'], std=data_cfg['std'])
    train_set = ImageFolderDataset(data_dir, 'train', train_tf, label_store=store,
                                   skip_unreadable=args.skip_unreadable)
    val_tf = eval_transform(img_size, data_cfg['crop_pct'], data_cfg['interpolation'], data_cfg['mean'],
                            data_cfg['std'])
    val_set = ImageFolderDataset(data_dir, 'val', val_tf, classes=train_set.classes,
                                 skip_unreadable=args.skip_unreadable)
    if len(train_set) < recipe.batch_size * info.world_size:
        raise DataError(f'{len(train_set)} training images are fewer than one global batch '
                         f'({recipe.batch_size} x {info.world_size} processes)')
    common = dict(num_workers=args.workers, pin_memory=info.device.type == 'cuda', collate_fn=collate_skipping)
    sampler = DistributedSampler(train_set, info.world_size, info.rank, shuffle=True, seed=args.seed, drop_last=True)
    train_loader = DataLoader(train_set, recipe.batch_size, sampler=sampler, drop_last=True, **common)
    val_loader = DataLoader(val_set, recipe.batch_size, sampler=ShardSampler(len(val_set), info), **common)
    return train_loader, val_loader, train_set.classes


def make_objective(recipe: Recipe, num_classes: int) -> Objective:
    if recipe.token_labeling:
        builder = TokenTargetBuilder(num_classes, recipe.smoothing) if recipe.uses_score_maps else None
        return Objective(num_classes, recipe.smoothing, builder, TokenLabelingLoss(recipe.dense_weight),
                         recipe.cls_target)
    mixup = None
    if recipe.mixup > 0 or recipe.cutmix > 0:
        mixup = Mixup(mixup_alpha=recipe.mixup, cutmix_alpha=recipe.cutmix, label_smoothing=recipe.smoothing,
                      num_classes=num_classes)
    return Objective(num_classes, recipe.smoothing, mixup=mixup)


def launch(run_fn: Callable[[argparse.Namespace, DistInfo], dict], args: argparse.Namespace) -> dict:
    """Check the model name, join the process group torchrun describes (or run alone), run, leave the group."""
    if args.model not in timm.list_models():
        check_model_name(args.model)
    info = init_distributed(args.device)
    try:
        return run_fn(args, info)
    finally:
        cleanup(info)


def main(argv: Optional[List[str]] = None) -> dict:
    return launch(run, build_parser().parse_args(argv))


def run(args: argparse.Namespace, info: DistInfo) -> dict:
    if args.new_head and not args.finetune:
        raise UsageError('--new-head goes with --finetune (the weights to start from)')
    digits = args.data_dir is None
    recipe = resolve_recipe(args, digits)
    output = Path(args.output or f'output/train_cls/{args.model}')
    seed_all(args.seed)
    if digits:
        from .digits import prepare_digits_run
        data_dir, token_label_dir = prepare_digits_run(Path(args.digits_dir), recipe, info, args.workers)
    else:
        data_dir, token_label_dir = Path(args.data_dir), args.token_label_dir
    if recipe.uses_score_maps and token_label_dir is None:
        raise UsageError(f'the {args.model} recipe trains with token labeling: pass --token-label-dir '
                         f'(tools/generate_token_labels.py makes one), --token-target label or --no-token-labeling')
    store = TokenLabelStore(token_label_dir) if recipe.uses_score_maps else None

    resume = resume_path(args.resume, output)
    if info.is_main:
        output.mkdir(parents=True, exist_ok=True)
    barrier(info)

    data_cfg = resolve_data_config({}, pretrained_cfg=timm.models.get_pretrained_cfg(args.model).to_dict())
    img_size = recipe.img_size or data_cfg['input_size'][-1]
    recipe.img_size = img_size
    train_loader, val_loader, classes = make_loaders(args, recipe, info, data_dir, store, data_cfg, img_size)
    num_classes = len(classes)
    seed_all(args.seed)  # the initial weights do not depend on what ran before
    model = build_model(args, recipe, num_classes, img_size)
    if args.finetune and not resume:
        message = load_finetune_weights(bare_model(model), args.finetune, classes, args.new_head)
        if info.is_main:
            print(message, flush=True)
    use_grad_checkpointing(model, args.grad_checkpointing)
    model.to(info.device)

    global_batch = recipe.batch_size * info.world_size
    lr = recipe.lr_base * global_batch / recipe.lr_base_batch
    optimizer = create_optimizer_v2(bare_model(model), opt=recipe.opt, lr=lr, weight_decay=recipe.weight_decay)
    updates_per_epoch = len(train_loader)
    scheduler, num_epochs = create_scheduler_v2(
        optimizer, 'cosine', num_epochs=recipe.epochs, warmup_epochs=recipe.warmup_epochs,
        warmup_lr=recipe.warmup_lr, min_lr=recipe.min_lr, cooldown_epochs=recipe.cooldown_epochs,
        step_on_epochs=False, updates_per_epoch=updates_per_epoch)
    amp = pick_amp(args.amp, info.device)
    scaler = torch.amp.GradScaler('cuda') if amp == 'fp16' else None
    ema = ModelEmaV3(model, decay=recipe.ema_decay, use_warmup=True) if recipe.ema_decay > 0 else None
    state = StepState(optimizer, scheduler, scaler, ema)

    preset = chosen_preset(args)
    fit = Fit(model, state, make_objective(recipe, num_classes), info, output,
              {'model': args.model, 'preset': preset, 'classes': classes, **vars(recipe)},
              amp, recipe.clip_grad)
    fit.start(resume, args.seed)
    if info.is_main:
        print(f'{args.model}: {num_classes} classes, {len(train_loader.dataset)} train / {len(val_loader.dataset)} '
              f'val images, {info.world_size} process(es), global batch {global_batch}, lr {lr:.3g}, amp {amp}, '
              f'token labeling {recipe.token_labeling}', flush=True)
        print('recipe: ' + json.dumps(vars(recipe)), flush=True)
        print(f'schedule: {describe_epochs(recipe)}', flush=True)
    record = fit.run(train_loader, val_loader, num_epochs, RunLog(output, info, args.log_interval))
    best = fit.best
    metrics = {'model': args.model, 'top1': record.get('top1'), 'top5': record.get('top5'), 'epochs': num_epochs,
               'best_top1': best['top1'], 'best_epoch': best['epoch'], 'token_labeling': recipe.token_labeling,
               'preset': preset,
               'skipped_images': record.get('skipped_train', 0) + record.get('skipped', 0)}
    if ema is not None:
        metrics.update(ema_top1=record.get('ema_top1'), ema_top5=record.get('ema_top5'))
    if info.is_main:
        write_json_atomic(output / METRICS, metrics)
        print(f'done: top-1 {metrics["top1"]:.2f}%  top-5 {metrics["top5"]:.2f}%  -> {output / METRICS}', flush=True)
        if metrics['skipped_images']:
            print(f'skipped {metrics["skipped_images"]} unreadable image(s)', flush=True)
    return metrics


