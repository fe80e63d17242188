"""Classification probes of a frozen model's features, as DINOv2 evaluates its backbones (dinov2/eval/knn.py and
linear.py): features extracted once (eval mode, the eval transform), then a weighted k-NN vote over the L2-normalised
pooled features and a grid of linear heads trained together in one pass over the cached features; k and each head's
(learning rate, features) are chosen on a seeded, stratified held-out part of the training split and the chosen ones
evaluated on the test split. The logic of tools/probe_features.py; docs/frozen_features.md gives the definitions
and where they depart from DINOv2's."""
from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

from backbones import bare_model
from backbones.common.cli import (
    add_model_kwargs_argument,
    add_seed_argument,
    add_weights_argument,
    add_workers_argument,
    fraction,
    model_parser,
    non_negative_int,
    open_fraction,
    parse_model_kwargs,
    positive_float,
    positive_int,
)
from backbones.common.devices import add_device_argument, device_name, torch_threads
from backbones.common.distributed import DistInfo
from backbones.common.errors import UsageError
from backbones.common.files import write_json_atomic
from backbones.common.log import logger
from backbones.common.outputs import output_file, output_folder
from backbones.common.random_state import seed_all
from backbones.registry import check_model_name
from classification.data.cifar import hold_out
from classification.data.folders import ImageFolderDataset, collate_skipping, config_eval_transform
from classification.feature_cache import cached_features, feature_identity, weights_digest
from classification.loaders import EmbeddedImageData
from classification.models import (
    PRETRAINED_HELP,
    checkpoint_file,
    create_classifier,
    load_trained_classifier,
    trained_data_config,
)
from classification.recipes import recipe_for

KNN_KS = (10, 20, 100, 200)
TEMPERATURE = 0.07
# DINOv2's learning rates (linear.py), each scaled by batch / 256
LEARNING_RATES = (1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1)
BLOCKS = 4  # DINOv2's "last 4 blocks" variant
HEAD_INIT_STD = 0.01  # DINOv2's LinearClassifier: weights N(0, 0.01), bias 0


@dataclass
class Features:
    """One split's cached features: `pooled` (N, D), the model's pre-logits feature (the class token after the final
    norm, or the pooled features of a model without one); `blocks` (N, 4, D), the class tokens of the last 4 blocks
    after the final norm; `patch_mean` (N, D), the mean of the last block's normalised patch tokens (None where the
    model has no such tokens); `labels` (N,)."""

    pooled: torch.Tensor
    blocks: torch.Tensor | None
    patch_mean: torch.Tensor | None
    labels: torch.Tensor

    def take(self, rows: np.ndarray | torch.Tensor) -> Features:
        rows = torch.as_tensor(rows, dtype=torch.long)
        return Features(*(None if t is None else t[rows] for t in (self.pooled, self.blocks, self.patch_mean,
                                                                    self.labels)))


def linear_inputs(features: Features) -> dict[str, torch.Tensor]:
    """DINOv2's `create_linear_input` variants the features allow: the class token of the last block (`cls1`) or of
    the last 4 concatenated (`cls4`), each without and with the mean patch token concatenated (`+avgpool`)."""
    tokens = {'cls1': features.pooled}
    if features.blocks is not None:
        tokens['cls4'] = features.blocks.flatten(1)
    inputs = dict(tokens)
    if features.patch_mean is not None:
        inputs.update({f'{name}+avgpool': torch.cat([x, features.patch_mean], dim=1) for name, x in tokens.items()})
    return inputs


class BlockTaps:
    """Forward hooks keeping the outputs (all tokens) of a token model's last `BLOCKS` blocks."""

    def __init__(self, blocks: Sequence[nn.Module]) -> None:
        self.outputs: list[torch.Tensor] = []
        self.handles = [block.register_forward_hook(lambda _m, _i, out: self.outputs.append(out))
                        for block in list(blocks)[-BLOCKS:]]

    def take(self) -> list[torch.Tensor]:
        outputs, self.outputs = self.outputs, []
        return outputs

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def has_class_token(model: nn.Module) -> bool:
    """Whether the model is a token model with a class token in front, blocks, a final norm and timm's
    `forward_intermediates` (a ViT of timm's or of the suite's)."""
    return all(getattr(model, name, None) is not None for name in ('cls_token', 'blocks', 'norm')) and \
        hasattr(model, 'forward_intermediates')


@torch.no_grad()
def batch_features(model: nn.Module, images: torch.Tensor, tokens: bool, taps: BlockTaps | None
                   ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(pooled, last blocks' normalised class tokens, mean normalised patch token) of one batch: the patch tokens'
    mean for a class-token model (`tokens`), the blocks' class tokens where `taps` keeps them."""
    if not tokens:
        return model.forward_head(model.forward_features(images), pre_logits=True), None, None
    final, patches = model.forward_intermediates(images, indices=1, norm=True, output_fmt='NLC')
    blocks = None if taps is None else torch.stack([model.norm(out)[:, 0] for out in taps.take()], dim=1)
    return model.forward_head(final, pre_logits=True), blocks, patches[-1].mean(dim=1)


def blocks_tap_the_class_token(model: nn.Module, pooled: torch.Tensor, blocks: torch.Tensor) -> bool:
    """Whether the last tapped block's normalised class token is the model's pooled feature: not so where the class
    token joins late (CaiT) or the pooled feature is another (a distillation token's mean), where the 4-block
    variants are not DINOv2's."""
    same = pooled.shape == blocks[:, -1].shape and torch.allclose(pooled, blocks[:, -1], atol=1e-5, rtol=1e-4)
    if not same:
        logger.info(f'{type(model).__name__}: the class tokens of its blocks are not its pooled feature: no '
                    f'{BLOCKS}-block variants')
    return same


@torch.no_grad()
def extract_features(model: nn.Module, loader: DataLoader, device: torch.device) -> Features:
    """Every image's features, the model frozen in eval mode; the 4-block variants only for a class-token model of
    at least 4 blocks whose tapped class token is its pooled feature."""
    model.eval()
    tokens = has_class_token(model)
    taps = BlockTaps(model.blocks) if tokens and len(model.blocks) >= BLOCKS else None
    if tokens and taps is None:
        logger.info(f'{type(model).__name__} has fewer than {BLOCKS} blocks: no {BLOCKS}-block variants')
    parts: list[tuple] = []
    keep_blocks = taps is not None
    try:
        for batch in loader:
            pooled, blocks, patch_mean = batch_features(model, batch['image'].to(device), tokens, taps)
            if not parts and keep_blocks:
                keep_blocks = blocks_tap_the_class_token(model, pooled, blocks)
            parts.append((pooled.float().cpu(), blocks.float().cpu() if keep_blocks else None,
                          None if patch_mean is None else patch_mean.float().cpu(), batch['label']))
    finally:
        if taps is not None:
            taps.remove()
    if not parts:
        raise UsageError('no images to extract features from')
    return Features(*(None if column[0] is None else torch.cat(column) for column in zip(*parts)))


def capped_ks(ks: Iterable[int], train_size: int) -> list[int]:
    """The k's, each at most the number of training features (a larger one is capped, and said)."""
    capped = sorted({min(k, train_size) for k in ks})
    over = sorted(k for k in ks if k > train_size)
    if over:
        logger.warning(f'warning: k {", ".join(map(str, over))} > the {train_size} training features: capped at '
                       f'{train_size}')
    return capped


def knn_predictions(train: torch.Tensor, train_labels: torch.Tensor, queries: torch.Tensor, ks: Sequence[int],
                    num_classes: int, temperature: float = TEMPERATURE, chunk: int = 1024) -> dict[int, torch.Tensor]:
    """DINOv2's weighted k-NN vote for every k: cosine similarities of the L2-normalised features, the top k
    neighbours of each query, each weighted exp(similarity / T), a class's score the sum of its neighbours' weights.
    (DINOv2 normalises the weights with a softmax over the k, which leaves the argmax as it is.)"""
    train, queries = F.normalize(train, dim=1), F.normalize(queries, dim=1)
    found: dict[int, list[torch.Tensor]] = {k: [] for k in ks}
    for part in queries.split(chunk):
        similarity, neighbours = (part @ train.T).topk(max(ks), dim=1)
        weights, labels = (similarity / temperature).exp(), train_labels[neighbours]
        for k in ks:
            scores = weights.new_zeros(len(part), num_classes).scatter_add_(1, labels[:, :k], weights[:, :k])
            found[k].append(scores.argmax(dim=1))
    return {k: torch.cat(found[k]) for k in ks}


def accuracy(predictions: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 accuracy in percent."""
    return 100.0 * (predictions == labels).double().mean().item()


@dataclass(frozen=True)
class HeadSpec:
    """One linear head of the grid: the features it reads and its (unscaled) learning rate."""

    variant: str
    lr: float


def new_head(in_features: int, num_classes: int, seed: int) -> nn.Linear:
    """A head initialised as DINOv2's, from its own seeded stream: the same whichever other heads train beside it."""
    head = nn.Linear(in_features, num_classes)
    with torch.no_grad():
        head.weight.normal_(0.0, HEAD_INIT_STD, generator=torch.Generator().manual_seed(seed))
        head.bias.zero_()
    return head


def train_linear_heads(inputs: dict[str, torch.Tensor], labels: torch.Tensor, specs: Sequence[HeadSpec],
                       num_classes: int, epochs: int, batch_size: int, seed: int) -> list[nn.Linear]:
    """All heads trained together on the cached features as DINOv2's linear.py trains them: SGD (momentum 0.9, no
    weight decay), each head at its lr x batch / 256 on a cosine schedule to 0, one cross-entropy per head, summed.
    Each head's gradient is its own loss's, so a head trains here as it would alone (same seed, same batches)."""
    heads = [new_head(inputs[spec.variant].shape[1], num_classes, seed) for spec in specs]
    optimizer = torch.optim.SGD([{'params': head.parameters(), 'lr': spec.lr * batch_size / 256}
                                 for head, spec in zip(heads, specs)], momentum=0.9, weight_decay=0.0)
    steps_per_epoch = math.ceil(len(labels) / batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs * steps_per_epoch, eta_min=0)
    order = torch.Generator().manual_seed(seed)
    # One thread: the heads' products are tiny, and threads sharing them wait on each other longer than they compute
    # (an epoch of the 52 heads on LV-ViT-S's features of the embedded scans: 15.7 s on 2 threads with the other core
    # busy, 0.8 s on one)
    with torch_threads(1):
        for _ in range(epochs):
            for rows in torch.randperm(len(labels), generator=order).split(batch_size):
                batch = {variant: x[rows] for variant, x in inputs.items()}  # gathered once for all its heads
                loss = sum(F.cross_entropy(head(batch[spec.variant]), labels[rows])
                           for head, spec in zip(heads, specs))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                schedule.step()
    return heads


@torch.no_grad()
def head_accuracy(head: nn.Linear, inputs: torch.Tensor, labels: torch.Tensor) -> float:
    return accuracy(head(inputs).argmax(dim=1), labels)


def best(scores: dict) -> object:
    """The key of the highest score (the first of equals, in the grid's order)."""
    return max(scores, key=scores.get)


@dataclass(frozen=True)
class ProbeSettings:
    """The probes' hyperparameters: the k's and temperature of the k-NN vote; the learning rates, epochs, batch and
    seed of the linear heads; the held-out fraction of the training split and the seed of its draw."""

    ks: tuple[int, ...] = KNN_KS
    temperature: float = TEMPERATURE
    learning_rates: tuple[float, ...] = LEARNING_RATES
    epochs: int = 50
    batch_size: int = 128
    seed: int = 0
    held_out: float = 0.1
    split_seed: int = 0


def knn_results(fit: Features, held_out: Features, test: Features, num_classes: int,
                settings: ProbeSettings) -> dict:
    """Per-k accuracy on the held-out part and on the test split (neighbours from the training part alone), and the
    k chosen on the held-out part."""
    ks = capped_ks(settings.ks, len(fit.labels))

    def per_k(queries: Features) -> dict[int, float]:
        found = knn_predictions(fit.pooled, fit.labels, queries.pooled, ks, num_classes, settings.temperature)
        return {k: accuracy(predicted, queries.labels) for k, predicted in found.items()}

    held, tested = per_k(held_out), per_k(test)
    k = best(held)
    return {'temperature': settings.temperature, 'ks': ks, 'held_out': held, 'test': tested,
            'chosen': {'k': k, 'held_out': held[k], 'test': tested[k]}}


def linear_results(fit: Features, held_out: Features, test: Features, num_classes: int,
                   settings: ProbeSettings) -> dict:
    """Every head's held-out accuracy, and the head chosen on it with its test accuracy."""
    inputs = {name: linear_inputs(part) for name, part in (('fit', fit), ('held_out', held_out), ('test', test))}
    specs = [HeadSpec(variant, lr) for variant in inputs['fit'] for lr in settings.learning_rates]
    logger.info(f'training {len(specs)} linear heads for {settings.epochs} epochs on {len(fit.labels)} features')
    heads = train_linear_heads(inputs['fit'], fit.labels, specs, num_classes, settings.epochs, settings.batch_size,
                               settings.seed)
    held = {i: head_accuracy(head, inputs['held_out'][spec.variant], held_out.labels)
            for i, (head, spec) in enumerate(zip(heads, specs))}
    i = best(held)
    chosen = specs[i]
    return {'epochs': settings.epochs, 'batch_size': settings.batch_size,
            'grid': [{'features': spec.variant, 'lr': spec.lr, 'held_out': held[n]} for n, spec in enumerate(specs)],
            'chosen': {'features': chosen.variant, 'lr': chosen.lr, 'held_out': held[i],
                       'test': head_accuracy(heads[i], inputs['test'][chosen.variant], test.labels)}}


def hold_out_part(train: Features, settings: ProbeSettings) -> tuple[Features, Features]:
    """(training part, held-out part) of the training split's features: `settings.held_out` of every class, drawn
    with `settings.split_seed` (`classification.data.cifar.hold_out`)."""
    fit_rows, held_rows = hold_out(train.labels.numpy(), settings.held_out, settings.split_seed)
    return train.take(fit_rows), train.take(held_rows)


def run_probes(train: Features, test: Features, num_classes: int, settings: ProbeSettings) -> dict:
    """Both probes on cached features: hyperparameters chosen on the held-out part of `train`, the chosen
    classifiers (fit on the rest of it) evaluated on `test`."""
    fit, held_out = hold_out_part(train, settings)
    return {'chosen_on': f'a held-out {settings.held_out:g} of each class of the training split '
                         f'(seed {settings.split_seed}): {len(held_out.labels)} images; the classifiers fit on the '
                         f'other {len(fit.labels)}',
            'knn': knn_results(fit, held_out, test, num_classes, settings),
            'linear': linear_results(fit, held_out, test, num_classes, settings)}


def results_table(results: dict) -> str:
    """The results as a few lines of text: k-NN per k, the best head of each feature variant, the chosen ones."""
    knn, linear = results['knn'], results['linear']

    def row(name: str, held_out: float, test: float | None = None) -> str:
        return f'{name:<30} {held_out:>9.2f} ' + ('' if test is None else f'{test:>7.2f}')

    lines = [f'{"probe":<30} {"held-out":>9} {"test":>7}']
    lines += [row(f'k-NN k={k}', knn['held_out'][k], knn['test'][k]) for k in knn['ks']]
    for variant in dict.fromkeys(head['features'] for head in linear['grid']):
        top = max((head for head in linear['grid'] if head['features'] == variant), key=lambda h: h['held_out'])
        lines.append(row(f'linear {variant} lr={top["lr"]:g}', top['held_out']))
    k, head = knn['chosen'], linear['chosen']
    lines += [f'chosen on {results["chosen_on"]}:', row(f'k-NN k={k["k"]}', k['held_out'], k['test']),
              row(f'linear {head["features"]} lr={head["lr"]:g}', head['held_out'], head['test'])]
    return '\n'.join(lines)


def build_parser(default_data: type[EmbeddedImageData] | None = None,
                 description: str | None = None) -> argparse.ArgumentParser:
    """tools/probe_features.py's options (`description`: its usage text), `default_data`'s among them."""
    p = model_parser('probe_features.py', description)
    weights = p.add_mutually_exclusive_group()
    weights.add_argument('--checkpoint', help='a checkpoint of train_cls/transfer or a release file (default, and '
                                              'without --pretrained: the model\'s random initialisation)')
    weights.add_argument('--pretrained', action='store_true', help=PRETRAINED_HELP)
    add_weights_argument(p)
    without = f' (default: {default_data.description})' if default_data else ''
    p.add_argument('--data-dir', required=default_data is None,
                   help='a classification data set: ImageNet-layout folders, tars, shards, a saved Hugging Face '
                        'data set or a transfer set (docs/imagenet.md)' + without)
    p.add_argument('--train-split', default='train', help='the split the probes learn from (and choose on)')
    p.add_argument('--split', default='val', help='the split the chosen probes are evaluated on')
    p.add_argument('--json', type=output_file, help='write the results to this file (default: '
                                                    'output/probes/MODEL.json)')
    p.add_argument('--feature-cache', type=output_folder,
                   help='keep each split\'s features in this folder (SPLIT.pt) and read them from there when the '
                        'weights, pipeline and images are the same')
    p.add_argument('--img-size', type=positive_int, help='default: the checkpoint\'s, else the model\'s own')
    p.add_argument('--crop-pct', type=fraction, help='default: the checkpoint\'s, else the model\'s own')
    p.add_argument('--batch-size', type=positive_int, default=64, help='images per forward pass')
    p.add_argument('--ks', type=positive_int, nargs='+', default=list(KNN_KS), help='the k-NN k\'s')
    p.add_argument('--temperature', type=positive_float, default=TEMPERATURE, help='the k-NN vote\'s T')
    p.add_argument('--lrs', type=positive_float, nargs='+', default=list(LEARNING_RATES),
                   help='the linear heads\' learning rates, each scaled by --linear-batch-size / 256')
    p.add_argument('--epochs', type=positive_int, default=ProbeSettings.epochs, help='epochs of the linear heads')
    p.add_argument('--linear-batch-size', type=positive_int, default=ProbeSettings.batch_size,
                   help='features per step of the linear heads')
    p.add_argument('--held-out', type=open_fraction, default=ProbeSettings.held_out,
                   help='the fraction of each class of the training split held out to choose k and the head')
    p.add_argument('--split-seed', type=non_negative_int, default=0, help='seed of the held-out draw')
    add_seed_argument(p, 'the random initialisation and the linear heads\' start and batches')
    add_workers_argument(p)
    add_model_kwargs_argument(p)
    add_device_argument(p)
    if default_data:
        default_data.add_arguments(p)
    return p


def frozen_model(args: argparse.Namespace, data_cfg: dict) -> nn.Module:
    """The model whose features are probed: the checkpoint's weights (as eval_cls loads them), else the model's
    random initialisation; frozen, in eval mode."""
    kwargs = parse_model_kwargs(args.model_kwargs)
    if args.checkpoint:
        model = load_trained_classifier(args.model, args.checkpoint, data_cfg, args.use_ema, kwargs)
    else:
        logger.warning(f'warning: no --checkpoint or --pretrained: the features of {args.model}\'s random '
                       f'initialisation (seed {args.seed})')
        model = create_classifier(args.model, 0, data_cfg['input_size'][-1], **kwargs)
    return bare_model(model).eval().requires_grad_(False)


def split_features(model: nn.Module, dataset: ImageFolderDataset, args: argparse.Namespace,
                   device: torch.device) -> Features:
    """The features of one split (one line naming it where it has no images)."""
    if not len(dataset):
        raise UsageError(f'{dataset.data_dir}: the split has no images')
    loader = DataLoader(dataset, args.batch_size, num_workers=args.workers, collate_fn=collate_skipping)
    start = time.perf_counter()
    features = extract_features(model, loader, device)
    logger.info(f'features of {len(dataset)} images in {time.perf_counter() - start:.1f} s')
    return features


def features_of(model: nn.Module, dataset: ImageFolderDataset, split: str, args: argparse.Namespace,
                data_cfg: dict, device: torch.device, weights: str | None) -> Features:
    """A split's features: extracted, or with --feature-cache (`weights`: the model's `weights_digest`) read from (or
    first written to) DIR/SPLIT.pt."""
    if not args.feature_cache:
        return split_features(model, dataset, args, device)
    described = {'name': args.model, 'kwargs': args.model_kwargs, 'device': device.type}
    identity = feature_identity(described, weights, data_cfg, dataset.data_dir, dataset.paths, dataset.labels)
    return Features(**cached_features(Path(args.feature_cache) / f'{split}.pt', identity,
                                      lambda: vars(split_features(model, dataset, args, device))))


def main(argv: list[str] | None = None, default_data: type[EmbeddedImageData] | None = None,
         description: str | None = None) -> dict:
    """tools/probe_features.py: without --data-dir, the data is `default_data`'s (the tool gives its embedded set)."""
    args = build_parser(default_data, description).parse_args(argv)
    check_model_name(args.model)
    args.checkpoint = checkpoint_file(args)
    seed_all(args.seed)
    data_dir = args.data_dir or default_data.from_args(args).image_data(recipe_for(args.model), DistInfo()).root
    data_cfg = trained_data_config(args.model, args.checkpoint, args.img_size, args.crop_pct)
    transform = config_eval_transform(data_cfg)
    train_set = ImageFolderDataset(data_dir, args.train_split, transform)
    test_set = ImageFolderDataset(data_dir, args.split, transform, classes=train_set.classes,
                                  classes_from=f'the split {args.train_split}')
    device = torch.device(device_name(args.device))
    model = frozen_model(args, data_cfg).to(device)
    weights = weights_digest(model) if args.feature_cache else None
    train, test = (features_of(model, dataset, split, args, data_cfg, device, weights)
                   for dataset, split in ((train_set, args.train_split), (test_set, args.split)))
    settings = ProbeSettings(tuple(args.ks), args.temperature, tuple(args.lrs), args.epochs, args.linear_batch_size,
                             args.seed, args.held_out, args.split_seed)
    results = {'model': args.model, 'checkpoint': args.checkpoint or 'random initialisation',
               'data': str(data_dir), 'train_split': args.train_split, 'test_split': args.split,
               'img_size': data_cfg['input_size'][-1], 'crop_pct': data_cfg['crop_pct'],
               **run_probes(train, test, len(train_set.classes), settings)}
    logger.info(results_table(results))
    path = Path(args.json or Path('output') / 'probes' / f'{args.model}.json')
    path.parent.mkdir(parents=True, exist_ok=True)  # the default folder, on first use
    write_json_atomic(path, results)
    logger.info(f'results: {path}')
    return results
