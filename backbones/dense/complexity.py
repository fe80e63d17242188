"""Parameter counts of a segmentation config's model, per part, and its MACs at an input size (built and run on
the meta device: no memory, no weights); and tools/model_info.py, which also gives the models' own counts
(`backbones.complexity`)."""
from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmseg.registry import MODELS

from backbones.common.cli import command_parser, positive_int
from backbones.common.commands import write_document
from backbones.complexity import forward_macs, measure_complexity, model_table
from backbones.dense.config import load_config
from backbones.dense.tasks import task_of

PARTS = ('backbone', 'neck', 'decode_head', 'auxiliary_head', 'rpn', 'roi_heads')  # segmentors' and detectors'


def build_meta_model(cfg: Config) -> nn.Module:
    """A config's model on the meta device, in eval mode, its backbone without pretrained weights."""
    init_default_scope(cfg.get('default_scope', 'mmseg'))
    model_cfg = cfg.model.copy()
    model_cfg.backbone = {**model_cfg.backbone, 'pretrained': None}
    with torch.device('meta'):
        model = MODELS.build(model_cfg)
    return model.eval().requires_grad_(False)  # autograd hooks of the counter do not work on meta leaves


def segmentor_parameters(model: nn.Module) -> dict[str, int]:
    """Parameter counts of each part a model has (PARTS) and 'total' (the papers count all)."""
    counts = {part: sum(p.numel() for p in getattr(model, part).parameters())
              for part in PARTS if getattr(model, part, None) is not None}
    return {**counts, 'total': sum(p.numel() for p in model.parameters())}


def input_shape(cfg: Config, shape: Sequence[int] | None) -> tuple[int, int]:
    """The (height, width) counted: `shape` (one side: a square), else the backbone's training size."""
    if not shape:
        side = cfg.model.backbone.get('img_size', 512)
        return (side, side) if isinstance(side, int) else tuple(side)
    return (shape[0], shape[-1])


def segmentor_macs(cfg: Config, model: nn.Module, shape: tuple[int, int]) -> int | None:
    """MACs of the forward on one image of `shape`, as mmseg's get_flops runs it; None for a detector."""
    if not task_of(cfg).macs_counted:
        return None
    image = torch.zeros(1, 3, *shape, device='meta')
    return forward_macs(lambda: model(image, mode='tensor'))


def config_table(configs: list[str], shape: Sequence[int] | None = None) -> str:
    """Each config's parameters per part (millions) and GMACs at `shape` (default: its backbone's training size)."""
    rows = [f"{'config':<40} " + ' '.join(f'{part:>15}' for part in PARTS) + f" {'total (M)':>10} {'GMACs':>8}"
            + f" {'at HxW':>10}"]
    for path in configs:
        cfg = load_config(path)
        model = build_meta_model(cfg)
        counts, size = segmentor_parameters(model), input_shape(cfg, shape)
        macs = segmentor_macs(cfg, model, size)
        rows.append(f'{path:<40} ' + ' '.join(f'{counts.get(part, 0) / 1e6:>15.2f}' for part in PARTS)
                    + f" {counts['total'] / 1e6:>10.2f} {'-' if macs is None else f'{macs / 1e9:.2f}':>8}"
                    + f" {f'{size[0]}x{size[1]}':>10}")
    return '\n'.join(rows)


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """tools/model_info.py's options (`description`: its usage text)."""
    parser = command_parser(description, 'model_info.py')
    parser.add_argument('model', nargs='?', help='registered model name, e.g. lvvit_s, t2t_vit_14, cait_s24_224')
    parser.add_argument('--img-size', type=positive_int, default=None,
                        help="input resolution (default: the model's own)")
    parser.add_argument('--json', action='store_true', help='print {"params", "trainable_params", "macs"}')
    parser.add_argument('--all', action='store_true', help='print the table of every model of the suite')
    parser.add_argument('--seg-config', nargs='+', metavar='CONFIG', help=(
        'segmentation configs to count: parameters per part, and MACs of one image through backbone, neck and '
        'decode head, attention included (FLOPs are twice that; a detector\'s depend on its proposals: -)'))
    parser.add_argument('--shape', nargs='+', type=positive_int, metavar='SIZE', help=(
        '--seg-config\'s input: HEIGHT WIDTH, or one side (default: the backbone\'s training size)'))
    return parser


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    """tools/model_info.py: a model's counts (one line, or JSON), every suite model's, or segmentation configs'."""
    parser = build_parser(description)
    args = parser.parse_args(argv)
    if sum((args.all, bool(args.model), bool(args.seg_config))) != 1:
        parser.error('give a model name, --all or --seg-config')
    if args.shape and (not args.seg_config or len(args.shape) > 2):
        parser.error('--shape takes HEIGHT WIDTH or one side, for --seg-config (a model\'s is --img-size)')
    if args.seg_config:
        write_document(config_table(args.seg_config, args.shape))
    elif args.all:
        write_document(model_table(args.img_size))
    else:
        info = measure_complexity(args.model, args.img_size)
        write_document(json.dumps(info.as_dict()) if args.json else
                       f'{args.model}: {info.params:,} parameters ({info.trainable_params:,} trainable), '
                       f'{info.macs / 1e9:.2f} GMACs')
    return 0
