"""Transfer of any model to another data set: CIFAR-10/100 with the T2T-ViT paper's Table 5 recipe (here), the
fine-grained sets (Flowers-102, Stanford Cars, Oxford-IIIT Pets, iNaturalist, class folders) with DeiT's transfer
recipe through `classification.train` (`transfer_set_main`).

`tools/transfer.py` (and `tools/transfer_cifar.py`, its former name) is the command (`main`); `transfer(...)` is the
CIFAR run from Python. docs/cifar.md tells where it departs from the reference tool."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch.nn as nn

from backbones import bare_model, load_checkpoint
from backbones.common.cli import add_weights_argument, model_parser, non_negative_int
from backbones.common.distributed import DistInfo, run_distributed
from backbones.common.errors import UsageError
from backbones.common.log import logger
from backbones.common.random_state import seed_all
from backbones.registry import check_model_name
from backbones.weights import LoadReport, classifier_prefixes
from classification.data.cifar import FORMATS, CifarDataset, CifarInput, channel_stats, hold_out, read_cifar
from classification.data.folders import collate_skipping
from classification.engine.checkpoints import (
    BEST,
    DATA_CONFIG,
    read_run_args,
    read_training_checkpoint,
)
from classification.engine.samplers import Batching, sharded_loaders
from classification.engine.steps import evaluate
from classification.engine.trainer import (
    RunOptions,
    Trainer,
    add_run_arguments,
    parameter_groups,
    parse_run_arguments,
    run_settings,
)
from classification.loaders import EmbeddedImageData
from classification.models import (
    add_start_arguments,
    create_classifier,
    recipe_at_start_size,
    refuse_pretrained_file,
    start_weights,
)
from classification.objectives.objective import LabelObjective, TokenLabelingObjective
from classification.objectives.token_loss import TokenLabelingLoss
from classification.recipes import (
    TRANSFER_OPTIMIZERS,
    TRANSFER_SETS,
    TransferRecipe,
    add_recipe_arguments,
    override_recipe,
    transfer_recipe,
    transfer_set_recipe,
)
from classification.sources.transfer_sets import LAYOUTS
from classification.train import build_parser as build_train_parser
from classification.train import check_arguments, launch

DATASETS = (*FORMATS, *TRANSFER_SETS)  # --dataset: CIFAR's (its own recipe and pipeline), then DeiT's transfer sets
DATASET_HELP = ('the data set: cifar10 or cifar100 (the T2T-ViT recipe; --data-dir required), or flowers102, cars, '
                'pets, inat2018, inat2019 in their published layouts or folder (train/CLASS/*, val/CLASS/*), each with '
                'DeiT\'s transfer recipe (its options: --dataset NAME --help) and, without --data-dir, the embedded '
                'data written in that layout')


def build_parser(description: str | None = None, prog: str = 'transfer.py') -> argparse.ArgumentParser:
    """tools/transfer.py's options for CIFAR (`description`: its usage text)."""
    p = model_parser(prog, description)
    p.add_argument('--dataset', required=True, choices=DATASETS, help=DATASET_HELP)
    p.add_argument('--data-dir', required=True,
                   help='folder holding cifar-10-python.tar.gz / cifar-100-python.tar.gz or the extracted folder')
    add_start_arguments(p, 'start from these weights: an official release of the family or one of ours; the '
                           'classifiers are replaced and the position table resized (default: random initialisation)')
    add_weights_argument(p)
    p.add_argument('--split-seed', type=non_negative_int, default=0, help='seed of the held-out validation draw')
    add_run_arguments(p, 'output/transfer_cifar/DATASET/MODEL')
    add_recipe_arguments(p.add_argument_group('recipe (defaults: the T2T-ViT transfer recipe, or its AdamW '
                                              'variant with --opt adamw; printed at start)'),
                         TransferRecipe, choices={'opt': list(TRANSFER_OPTIMIZERS)})
    return p


def resolve_recipe(args: argparse.Namespace) -> TransferRecipe:
    return override_recipe(transfer_recipe(getattr(args, 'opt', 'sgd')), args)


def build_transfer_model(name: str, num_classes: int, img_size: int | None, recipe: TransferRecipe,
                         pretrained: str | None = None, use_ema: bool | None = None,
                         model_kwargs: dict | None = None) -> tuple[nn.Module, LoadReport | None]:
    """The model with fresh classifiers for `num_classes` on top of the `pretrained` weights (every other key must
    be in the file). With token labeling it keeps a token head (LV-ViT's, or a new one for other families)."""
    model = create_classifier(name, num_classes, img_size, token_labeling=recipe.token_labeling,
                              mix_token=recipe.mix_token, frozen=recipe.frozen, drop_path_rate=recipe.drop_path,
                              **(model_kwargs or {}))
    report = None
    if pretrained:
        report = load_checkpoint(bare_model(model), pretrained, use_ema=use_ema, new_head=True)
    return model, report


def transfer_param_groups(model: nn.Module, lr: float, backbone_lr_scale: float, weight_decay: float,
                          layer_decay: float | None = None) -> list[dict]:
    """Every trainable parameter in timm's weight-decay (or layer-decay) groups, each split into the classifiers at
    `lr` and the rest at `lr * backbone_lr_scale`; the classifiers' first (their lr is logged)."""
    heads = {id(p) for name, p in model.named_parameters() if name.startswith(classifier_prefixes(model))}
    groups = parameter_groups(model, weight_decay, layer_decay)
    return [{**group, 'params': params, 'lr': lr if head else lr * backbone_lr_scale}
            for head in (True, False) for group in groups
            if (params := [p for p in group['params'] if (id(p) in heads) == head])]


def transfer(model_name: str, dataset: str, data_dir: str, recipe: TransferRecipe, options: RunOptions,
             info: DistInfo, pretrained: str | None = None, use_ema: bool | None = None, split_seed: int = 0) -> dict:
    """Fine-tune `model_name` on CIFAR `dataset`; returns (and writes to OUTPUT/metrics.json) the run's metrics."""
    recipe, _ = recipe_at_start_size(recipe, model_name, pretrained)  # resolved before any check or work
    img_size, global_batch = recipe.img_size, options.global_batch(recipe.batch_size, info.world_size)
    optimization = recipe.optimization(global_batch)
    trainer = Trainer(options, info)
    with trainer.refusals_undone():  # a run refused while its data is read leaves no folder behind
        data = read_cifar(data_dir, dataset)
        train_idx, val_idx = hold_out(data.train.labels, recipe.val_fraction, split_seed)
        train_split, val_split = data.train.subset(train_idx), data.train.subset(val_idx)
        mean, std = channel_stats(train_split.images)
        train_loader, val_loader, test_loader = sharded_loaders(
            CifarDataset(train_split), [CifarDataset(val_split), CifarDataset(data.test)],
            Batching(recipe.batch_size, options.workers, options.seed, collate_skipping), info)
        num_classes = len(data.classes)
        seed_all(options.seed)  # the fresh classifiers do not depend on what ran before
        model, report = build_transfer_model(model_name, num_classes, img_size, recipe,
                                             None if trainer.resume else pretrained, use_ema, options.model_kwargs)
        backbone_lr = optimization.lr * recipe.backbone_lr_scale
        if backbone_lr < optimization.min_lr:
            logger.warning(f'warning: the backbone lr {backbone_lr:.3g} starts below the cosine floor '
                           f'{optimization.min_lr:.3g} (--min-lr) and would rise towards it')
        params = transfer_param_groups(bare_model(model), optimization.lr, recipe.backbone_lr_scale,
                                       optimization.weight_decay, recipe.layer_decay)
        objective = TokenLabelingObjective(num_classes, recipe.smoothing,
                                           token_loss=TokenLabelingLoss(recipe.dense_weight)) \
            if recipe.token_labeling else LabelObjective(num_classes, recipe.smoothing)
        config = {'model': model_name, 'dataset': dataset, 'classes': data.classes, 'mean': mean, 'std': std,
                  'split_seed': split_seed, 'pretrained': pretrained, **vars(recipe),
                  DATA_CONFIG: CifarInput.data_config(img_size, mean, std)}
        fit = trainer.start(model, params, optimization, objective, config, len(train_loader),
                            train_transform=CifarInput(img_size, mean, std, train=True, hflip=recipe.hflip,
                                                       padding=recipe.crop_padding),
                            eval_transform=CifarInput(img_size, mean, std, train=False))
    logger.info(f'{model_name} on {FORMATS[dataset].title}: {num_classes} classes, {len(train_idx)} train / '
                f'{len(val_idx)} held-out val / {len(data.test.labels)} test images at {img_size}px, '
                f'{info.world_size} process(es), global batch {global_batch}, head lr '
                f'{optimization.lr:.3g}, backbone lr {backbone_lr:.3g}, cosine to {optimization.min_lr:.3g}, '
                f'amp {fit.amp}')
    logger.info('normalisation (training split): mean ' + ', '.join(f'{m:.4f}' for m in mean) + '  std '
                + ', '.join(f'{s:.4f}' for s in std))
    if report is not None:
        logger.info(report.summary())
    elif not trainer.resume:
        logger.info('no --finetune or --pretrained: training from random initialisation')
    logger.info('recipe: ' + json.dumps(vars(recipe)))
    record = trainer.run(fit, train_loader, val_loader)

    bare_model(model).load_state_dict(read_training_checkpoint(trainer.output / BEST)['state_dict'])
    test = evaluate(model, test_loader, info, fit.amp, desc='test', transform=fit.eval_transform)
    metrics = {'model': model_name, 'dataset': dataset, 'val_top1': fit.best['top1'],
               'best_epoch': fit.best['epoch'], 'test_top1': test['top1'], 'test_top5': test['top5'],
               'epochs': trainer.num_epochs, 'last_val_top1': record['top1'], 'train_images': len(train_idx),
               'val_images': len(val_idx), 'test_images': test['images'], 'pretrained': pretrained}
    return trainer.finish(metrics, f'done: epoch {fit.best["epoch"]} chosen on the held-out split (val top-1 '
                                   f'{fit.best["top1"]:.2f}%): test top-1 {test["top1"]:.2f}%  top-5 '
                                   f'{test["top5"]:.2f}%')


def main(argv: list[str] | None = None, description: str | None = None,
         default_data: type[EmbeddedImageData] | None = None, prog: str = 'transfer.py') -> dict:
    """tools/transfer.py (and transfer_cifar.py): CIFAR's transfer, or a transfer set's (`transfer_set_main`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    refuse_pretrained_file(argv)
    dataset = given_dataset(argv, prog)
    if dataset in TRANSFER_SETS:
        return transfer_set_main(argv, dataset, default_data, description, prog)
    parser = build_parser(description, prog)
    args = parse_run_arguments(parser, argv, ('--opt',))
    check_model_name(args.model)
    recipe = resolve_recipe(args)
    options = RunOptions.from_args(args, f'output/transfer_cifar/{args.dataset}/{args.model}', parser.prog,
                                   run_settings(args, recipe))
    weights = start_weights(args)
    return run_distributed(lambda info: transfer(args.model, args.dataset, args.data_dir, recipe, options, info,
                                                 weights, args.use_ema, args.split_seed), args.device)


def given_dataset(argv: list[str], prog: str) -> str | None:
    """--dataset as typed, else as --config's args.yaml records it (None without either)."""
    first = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    first.add_argument('--dataset')
    first.add_argument('--config')
    given = first.parse_known_args(argv)[0]
    if given.dataset is None and given.config:
        return read_run_args(given.config, prog).get('dataset')
    return given.dataset


def transfer_set_main(argv: list[str], dataset: str, default_data: type[EmbeddedImageData] | None,
                      description: str | None, prog: str) -> dict:
    """A transfer set's run: train_cls with DeiT's transfer recipe for `dataset` and a new classifier."""
    parser = build_train_parser(default_data, description, prog, data_help=(
        'the data set in its published layout (docs/cifar.md: Flowers-102, Stanford Cars, Oxford-IIIT Pets, '
        'iNaturalist), or for --dataset folder train/CLASS/* and val/CLASS/*'),
        recipe_defaults='DeiT\'s transfer recipe for --dataset, at the embedded data\'s scale without --data-dir')
    # known already (typed, or recorded in --config's args.yaml): not required again, which --config could not give
    parser.add_argument('--dataset', choices=DATASETS, default=dataset, help=DATASET_HELP)
    args = parse_run_arguments(parser, argv, ('--preset',))
    if args.preset:
        raise UsageError(f'--preset {args.preset} is a train_cls recipe; the transfer recipe is --dataset '
                         f'{dataset}\'s (DeiT\'s): set its values with their options')
    if args.new_head:
        raise UsageError('--new-head: a transfer set\'s run always puts a new classifier for its classes on the '
                         '--finetune or --pretrained weights')
    fallback = check_arguments(args, default_data)
    if fallback is None and dataset in LAYOUTS:
        LAYOUTS[dataset].check(Path(args.data_dir))
    recipe = override_recipe(transfer_set_recipe(args.model, dataset, fallback.recipe_values if fallback else None),
                             args)
    if not (args.finetune or args.pretrained or args.resume):
        logger.info('no --finetune or --pretrained: training from random initialisation')
    return launch(args, parser.prog, recipe, fallback, f'output/transfer/{dataset}/{args.model}', None,
                  new_head=bool(args.finetune or args.pretrained))
