"""Top-1 / top-5 of a classification checkpoint on an ImageNet-layout split, with its eval transform (what the
checkpoint's run recorded: `classification.engine.checkpoints.checkpoint_data_config`); the logic of tools/eval_cls.py.
Models with a token head predict with the LV-ViT rule (class logits + 0.5 x the class-wise max over the token
logits), distilled models with DeiT's (the mean of the class and distillation heads)."""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch
from timm.data import RealLabelsImagenet
from torch.utils.data import DataLoader

from backbones.common.cli import (
    add_model_kwargs_argument,
    add_weights_argument,
    add_workers_argument,
    fraction,
    model_parser,
    parse_model_kwargs,
    positive_int,
)
from backbones.common.devices import add_amp_argument, add_device_argument, device_name
from backbones.common.distributed import DistInfo
from backbones.common.errors import UsageError
from backbones.common.files import write_json_atomic
from backbones.common.log import logger
from backbones.common.outputs import output_file
from backbones.registry import check_model_name
from classification.data.folders import ImageFolderDataset, collate_skipping, config_eval_transform
from classification.engine.checkpoints import checkpoint_classes
from classification.engine.steps import evaluate
from classification.models import (
    add_checkpoint_arguments,
    check_finite,
    checkpoint_file,
    load_trained_classifier,
    trained_data_config,
)
from classification.sources.source import split_classes


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """tools/eval_cls.py's options (`description`: its usage text)."""
    p = model_parser('eval_cls.py', description)
    add_checkpoint_arguments(p)
    p.add_argument('--data-dir', required=True,
                   help='an ImageNet-layout folder (SPLIT/CLASS/*.JPEG), or tars of one (docs/imagenet.md)')
    p.add_argument('--split', default='val', help='the folder of --data-dir evaluated')
    p.add_argument('--json', type=output_file, help='write the metrics to this file')
    p.add_argument('--img-size', type=positive_int, help='default: the size the checkpoint was trained at, else the '
                   'model\'s own')
    p.add_argument('--crop-pct', type=fraction, help='default: the checkpoint\'s, else the model\'s own (LV-ViT 0.9, '
                   'bicubic)')
    p.add_argument('--batch-size', type=positive_int, default=100, help='images per forward pass')
    add_workers_argument(p)
    add_weights_argument(p)
    p.add_argument('--real-labels', nargs='?', const='timm', metavar='REAL_JSON',
                   help='also ImageNet-ReaL accuracy (timm ships the labels; or give real.json)')
    add_model_kwargs_argument(p)
    add_device_argument(p)
    add_amp_argument(p, 'none', "a checkpoint's figures in float32 are the same on every device",
                     ('none', 'bf16', 'fp16'))
    p.add_foreign_flags("timm's validate.py", TIMM_VALIDATE_FLAGS)
    return p


# timm's validate.py flags the command does not take, and what it takes instead
TIMM_VALIDATE_FLAGS = {
    '--data': 'the data folder as --data-dir', '--model': 'the model name as the first argument',
    '-b': '--batch-size', '-j': '--workers', '--input-size': '--img-size', '--num-classes': None,
    '--results-file': '--json', '--amp-dtype': '--amp bf16 or --amp fp16', '--channels-last': None,
    '--torchscript': None, '--torchcompile': None, '--test-pool': None, '--no-prefetcher': None,
    '--valid-labels': None, '--class-map': None, '--crop-mode': None, '--mean': None, '--std': None,
    '--interpolation': None,
}


def class_order(data_dir: Path, split: str, recorded: list[str] | None) -> tuple[list[str] | None, str]:
    """The class list that labels a split (None: its sorted class folders), and in words which order that is.
    ImageNet-V2's numeric class folders the checkpoint does not name are read folder i as class i."""
    found = split_classes(data_dir, split)
    if all(name.isdigit() for name in found) and not (recorded and set(found) <= set(recorded)):
        count = len(recorded) if recorded else max(map(int, found)) + 1
        order = f'ImageNet-V2 layout: folder i is class i of the model\'s {count} classes'
        return [str(i) for i in range(count)], order + (f' ({recorded[0]}, {recorded[1]}, ...)' if recorded else '')
    if recorded:
        return recorded, f'the class names the checkpoint records ({len(recorded)})'
    return None, f'the {len(found)} class folders, sorted by name'


def load_split(data_dir: str, split: str, checkpoint: str, transform) -> tuple[ImageFolderDataset, str]:
    """The split labelled by `class_order` (a class the checkpoint does not know is an error), and that order."""
    classes, order = class_order(Path(data_dir), split, checkpoint_classes(checkpoint))
    return ImageFolderDataset(data_dir, split, transform, classes=classes,
                              classes_from=f'the checkpoint {checkpoint}'), order


REAL_NAME = re.compile(r'ILSVRC2012_val_\d{8}\.JPEG')


def real_labels(files: list[str], source: str) -> RealLabelsImagenet:
    """timm's ReaL labels for ImageNet's validation images (`source`: 'timm', its bundled file, or a real.json)."""
    unknown = [Path(f).name for f in files if not REAL_NAME.fullmatch(Path(f).name)]
    try:
        if not unknown:
            return RealLabelsImagenet(files, None if source == 'timm' else source)
    except AssertionError:
        pass  # timm's check that there is one image per label
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f'--real-labels {source}: not a readable ReaL label file ({e})') from None
    raise UsageError(f'--real-labels: the ReaL labels are for ImageNet\'s 50,000 validation images, by file name '
                     f'(ILSVRC2012_val_00000001.JPEG, ...); this split has {len(files)} image(s)'
                     + (f', e.g. {unknown[0]}' if unknown else ''))


def main(argv: list[str] | None = None, description: str | None = None) -> dict:
    """tools/eval_cls.py."""
    args = build_parser(description).parse_args(argv)
    check_model_name(args.model)
    args.checkpoint = checkpoint_file(args)
    data_cfg = trained_data_config(args.model, args.checkpoint, args.img_size, args.crop_pct)
    img_size, crop_pct = data_cfg['input_size'][-1], data_cfg['crop_pct']
    dataset, order = load_split(args.data_dir, args.split, args.checkpoint, config_eval_transform(data_cfg))
    logger.info(f'class order: {order}')
    model = load_trained_classifier(args.model, args.checkpoint, data_cfg, args.use_ema,
                                    parse_model_kwargs(args.model_kwargs), num_classes=len(dataset.classes))
    info = DistInfo(device=torch.device(device_name(args.device)))
    model.to(info.device)
    loader = DataLoader(dataset, args.batch_size, num_workers=args.workers, collate_fn=collate_skipping)
    real = real_labels(list(dataset.paths), args.real_labels) if args.real_labels else None

    def on_batch(logits: torch.Tensor, _) -> None:
        check_finite(logits, args.checkpoint)
        if real is not None:
            real.add_result(logits)

    metrics = evaluate(model, loader, info, args.amp, on_batch=on_batch)
    metrics.update(model=args.model, checkpoint=args.checkpoint, img_size=img_size, crop_pct=crop_pct,
                   class_order=order)
    if real is not None:
        metrics.update(real_top1=real.get_accuracy(1), real_top5=real.get_accuracy(5))
    logger.info(' '.join(f'{k} {v:.3f}' if isinstance(v, float) else f'{k} {v}' for k, v in metrics.items()))
    if args.json:
        write_json_atomic(args.json, metrics)
    return metrics
