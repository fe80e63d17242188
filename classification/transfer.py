"""CIFAR-10/100 transfer of any model of the suite (the T2T-ViT paper's Table 5 recipe).

`tools/transfer_cifar.py` is the command; `main(argv)` is the same thing callable from Python. Unlike the
reference tool, every parameter trains (the class token and the final norm too), the inputs are normalised with
the statistics of the data set at hand, the epoch is chosen on a held-out part of the training set and only
that epoch's model meets the test set, and a checkpoint of another resolution loads (its position table is
resampled).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import List, Optional, Tuple

import timm
import torch
import torch.nn as nn
from timm.data import resolve_data_config
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from torch.utils.data import DataLoader, DistributedSampler

from backbones import load_checkpoint
from backbones.errors import DataError
from backbones.checkpoint import LoadReport, classifier_prefixes
from backbones.cli import non_negative_int

from .checkpointing import read_training_checkpoint, seed_all, write_json_atomic
from .cifar import (FORMATS, CifarDataset, CifarInput, CifarSplit, channel_stats, hold_out,
                    read_cifar)
from .data import collate_skipping
from .distributed import DistInfo, ShardSampler, barrier
from .engine import Objective, StepState, evaluate
from .fit import BEST, METRICS, Fit, RunLog, bare_model, resume_path
from .loss import TokenLabelingLoss
from .recipes import TRANSFER_OPTIMIZERS, TransferRecipe, add_recipe_arguments, override_recipe, transfer_recipe
from .train import (add_run_arguments, create_classifier, launch, model_parser, parse_model_kwargs, pick_amp,
                    use_grad_checkpointing)

_OPTIMIZERS = {'sgd': 'momentum', 'adamw': 'adamw'}  # timm's 'sgd' is Nesterov; the recipe's is not


def build_parser() -> argparse.ArgumentParser:
    p = model_parser('transfer_cifar.py', 'Fine-tune a model on CIFAR-10/100 with the T2T-ViT transfer recipe; the '
                     'epoch is chosen on a held-out part of the training set and its test accuracy reported.')
    p.add_argument('--dataset', required=True, choices=sorted(FORMATS))
    p.add_argument('--data-dir', required=True,
                   help='folder holding cifar-10-python.tar.gz / cifar-100-python.tar.gz or the extracted folder')
    p.add_argument('--pretrained', metavar='CKPT',
                   help='start from these weights: an official release of the family or one of ours; the '
                        'classifiers are replaced and the position table resized (default: random initialisation)')
    p.add_argument('--use-ema', action='store_true', help='take the EMA weights of a training checkpoint')
    p.add_argument('--split-seed', type=non_negative_int, default=0, help='seed of the held-out validation draw')
    add_run_arguments(p, 'output/transfer_cifar/DATASET/MODEL')
    add_recipe_arguments(p.add_argument_group('recipe (defaults: the T2T-ViT transfer recipe, or its AdamW '
                                              'variant with --opt adamw; printed at start)'),
                         TransferRecipe, choices={'opt': list(TRANSFER_OPTIMIZERS)})
    return p


def resolve_recipe(args: argparse.Namespace) -> TransferRecipe:
    return override_recipe(transfer_recipe(getattr(args, 'opt', 'sgd')), args)


def build_transfer_model(name: str, num_classes: int, img_size: Optional[int], recipe: TransferRecipe,
                         pretrained: Optional[str] = None, use_ema: bool = False,
                         model_kwargs: Optional[dict] = None) -> Tuple[nn.Module, Optional[LoadReport]]:
    """The model with fresh classifiers for `num_classes` on top of the `pretrained` weights (every other key must
    be in the file). With `token_head='label'` it keeps a token head (LV-ViT's, or a new one for other families)."""
    model = create_classifier(name, num_classes, img_size, token_labeling=recipe.token_head == 'label',
                              mix_token=recipe.mix_token, drop_path_rate=recipe.drop_path, **(model_kwargs or {}))
    report = None
    if pretrained:
        report = load_checkpoint(bare_model(model), pretrained, use_ema=use_ema, new_head=True)
    return model, report


def transfer_param_groups(model: nn.Module, lr: float, backbone_lr_scale: float, weight_decay: float) -> List[dict]:
    """Every trainable parameter: the classifiers at `lr`, the rest at `lr * backbone_lr_scale`; no weight decay on
    biases, norms and the model's `no_weight_decay()` tables (position embedding, class token)."""
    heads = classifier_prefixes(model)
    skip = set(model.no_weight_decay()) if hasattr(model, 'no_weight_decay') else set()
    groups: dict = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue  # frozen by design: T2T-ViT's sinusoidal table
        head, decay = name.startswith(heads), param.ndim > 1 and name not in skip
        group = groups.setdefault((head, decay), {
            'params': [], 'lr': lr if head else lr * backbone_lr_scale, 'weight_decay': weight_decay if decay else 0.0})
        group['params'].append(param)
    return [groups[key] for key in sorted(groups, reverse=True)]  # the head first: its lr is the one logged


def make_optimizer(model: nn.Module, recipe: TransferRecipe, lr: float) -> torch.optim.Optimizer:
    """SGD with momentum (or AdamW) over `transfer_param_groups`, the classifiers at `lr`."""
    groups = transfer_param_groups(model, lr, recipe.backbone_lr_scale, recipe.weight_decay)
    return create_optimizer_v2(groups, opt=_OPTIMIZERS[recipe.opt], lr=lr, weight_decay=recipe.weight_decay,
                               momentum=recipe.momentum)


def make_loaders(train: CifarSplit, val: CifarSplit, test: CifarSplit, batch_size: int, workers: int, seed: int,
                 info: DistInfo):
    """Train (shuffled, sharded, whole batches), held-out validation and test loaders (each image once)."""
    train_set = CifarDataset(train)
    if len(train_set) < batch_size * info.world_size:
        raise DataError(f'{len(train_set)} training images are fewer than one global batch '
                         f'({batch_size} x {info.world_size} processes)')
    common = dict(num_workers=workers, pin_memory=info.device.type == 'cuda', collate_fn=collate_skipping)
    sampler = DistributedSampler(train_set, info.world_size, info.rank, shuffle=True, seed=seed, drop_last=True)
    loaders = [DataLoader(train_set, batch_size, sampler=sampler, drop_last=True, **common)]
    for split in (val, test):
        dataset = CifarDataset(split)
        loaders.append(DataLoader(dataset, batch_size, sampler=ShardSampler(len(dataset), info), **common))
    return loaders


def main(argv: Optional[List[str]] = None) -> dict:
    return launch(run, build_parser().parse_args(argv))


def run(args: argparse.Namespace, info: DistInfo) -> dict:
    recipe = resolve_recipe(args)
    output = Path(args.output or f'output/transfer_cifar/{args.dataset}/{args.model}')
    resume = resume_path(args.resume, output)
    data = read_cifar(args.data_dir, args.dataset)
    train_idx, val_idx = hold_out(data.train.labels, recipe.val_fraction, args.split_seed)
    if info.is_main:
        output.mkdir(parents=True, exist_ok=True)
    barrier(info)

    train_split, val_split = data.train.subset(train_idx), data.train.subset(val_idx)
    mean, std = channel_stats(train_split.images)
    data_cfg = resolve_data_config({}, pretrained_cfg=timm.models.get_pretrained_cfg(args.model).to_dict())
    recipe.img_size = img_size = recipe.img_size or data_cfg['input_size'][-1]
    train_loader, val_loader, test_loader = make_loaders(train_split, val_split, data.test, recipe.batch_size,
                                                         args.workers, args.seed, info)
    num_classes = len(data.classes)
    seed_all(args.seed)  # the fresh classifiers do not depend on what ran before
    model, report = build_transfer_model(args.model, num_classes, img_size, recipe,
                                         None if resume else args.pretrained, args.use_ema,
                                         parse_model_kwargs(args.model_kwargs))
    use_grad_checkpointing(model, args.grad_checkpointing)
    model.to(info.device)

    global_batch = recipe.batch_size * info.world_size
    scale = global_batch / recipe.lr_base_batch  # linear scaling of the whole schedule, floor included
    lr, min_lr = recipe.lr * scale, recipe.min_lr * scale
    backbone_lr = lr * recipe.backbone_lr_scale
    if backbone_lr < min_lr and info.is_main:
        print(f'warning: the backbone lr {backbone_lr:.3g} starts below the cosine floor '
              f'{min_lr:.3g} (--min-lr) and would rise towards it', flush=True)
    optimizer = make_optimizer(bare_model(model), recipe, lr)
    scheduler, num_epochs = create_scheduler_v2(
        optimizer, 'cosine', num_epochs=recipe.epochs, warmup_epochs=recipe.warmup_epochs, min_lr=min_lr,
        step_on_epochs=False, updates_per_epoch=len(train_loader))
    amp = pick_amp(args.amp, info.device)
    state = StepState(optimizer, scheduler, torch.amp.GradScaler('cuda') if amp == 'fp16' else None, None)
    objective = Objective(num_classes, recipe.smoothing,
                          token_loss=TokenLabelingLoss(recipe.dense_weight) if recipe.token_head == 'label' else None)
    config = {'model': args.model, 'dataset': args.dataset, 'classes': data.classes, 'mean': mean, 'std': std,
              'split_seed': args.split_seed, 'pretrained': args.pretrained, **vars(recipe)}
    train_input = CifarInput(img_size, mean, std, train=True, hflip=recipe.hflip, padding=recipe.crop_padding)
    fit = Fit(model, state, objective, info, output, config, amp, recipe.clip_grad, train_transform=train_input,
              eval_transform=CifarInput(img_size, mean, std, train=False))
    fit.start(resume, args.seed)
    if info.is_main:
        print(f'{args.model} on {FORMATS[args.dataset].title}: {num_classes} classes, {len(train_idx)} train / '
              f'{len(val_idx)} held-out val / {len(data.test.labels)} test images at {img_size}px, '
              f'{info.world_size} process(es), global batch {global_batch}, head lr {lr:.3g}, backbone lr '
              f'{backbone_lr:.3g}, cosine to {min_lr:.3g}, amp {amp}', flush=True)
        print('normalisation (training split): mean ' + ', '.join(f'{m:.4f}' for m in mean) + '  std '
              + ', '.join(f'{s:.4f}' for s in std), flush=True)
        if report is not None:
            print(report.summary(), flush=True)
        elif not resume:
            print('no --pretrained: training from random initialisation', flush=True)
        print('recipe: ' + json.dumps(vars(recipe)), flush=True)
    record = fit.run(train_loader, val_loader, num_epochs, RunLog(output, info, args.log_interval))

    bare_model(model).load_state_dict(read_training_checkpoint(output / BEST)['state_dict'])
    test = evaluate(model, test_loader, info, amp, desc='test', transform=fit.eval_transform)
    metrics = {'model': args.model, 'dataset': args.dataset, 'val_top1': fit.best['top1'],
               'best_epoch': fit.best['epoch'], 'test_top1': test['top1'], 'test_top5': test['top5'],
               'epochs': num_epochs, 'last_val_top1': record['top1'], 'train_images': len(train_idx),
               'val_images': len(val_idx), 'test_images': test['images'], 'pretrained': args.pretrained}
    if info.is_main:
        write_json_atomic(output / METRICS, metrics)
        print(f'done: epoch {fit.best["epoch"]} chosen on the held-out split (val top-1 {fit.best["top1"]:.2f}%): '
              f'test top-1 {test["top1"]:.2f}%  top-5 {test["top5"]:.2f}%  -> {output / METRICS}', flush=True)
    return metrics
