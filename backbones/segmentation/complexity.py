"""Parameter counts of a segmentation config's model, per part (built on the meta device: no memory, no weights);
and tools/model_info.py, which also gives the models' own counts (`backbones.complexity`)."""
from __future__ import annotations

import argparse
import json

import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

from backbones.common.cli import command_parser, positive_int, write_document
from backbones.complexity import measure_complexity, model_table
from backbones.segmentation.config import load_config
from mmseg.registry import MODELS

PARTS = ('backbone', 'neck', 'decode_head', 'auxiliary_head', 'rpn', 'roi_heads')  # segmentors' and detectors'


def segmentor_parameters(cfg: Config) -> dict[str, int]:
    """Parameter counts of each part a model has (PARTS) and 'total' (the papers count all)."""
    init_default_scope(cfg.get('default_scope', 'mmseg'))
    model_cfg = cfg.model.copy()
    model_cfg.backbone = {**model_cfg.backbone, 'pretrained': None}
    with torch.device('meta'):
        model = MODELS.build(model_cfg)
    counts = {part: sum(p.numel() for p in getattr(model, part).parameters())
              for part in PARTS if getattr(model, part, None) is not None}
    return {**counts, 'total': sum(p.numel() for p in model.parameters())}


def config_table(configs: list[str]) -> str:
    """Each config's parameter counts per part, in millions."""
    rows = [f"{'config':<40} " + ' '.join(f'{part:>15}' for part in PARTS) + f" {'total (M)':>10}"]
    for path in configs:
        counts = segmentor_parameters(load_config(path))
        rows.append(f'{path:<40} ' + ' '.join(f'{counts.get(part, 0) / 1e6:>15.2f}' for part in PARTS)
                    + f" {counts['total'] / 1e6:>10.2f}")
    return '\n'.join(rows)


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """tools/model_info.py's options (`description`: its usage text)."""
    parser = command_parser(description, 'model_info.py')
    parser.add_argument('model', nargs='?', help='registered model name, e.g. lvvit_s, t2t_vit_14, cait_s24_224')
    parser.add_argument('--img-size', type=positive_int, default=None,
                        help="input resolution (default: the model's own)")
    parser.add_argument('--json', action='store_true', help='print {"params", "trainable_params", "macs"}')
    parser.add_argument('--all', action='store_true', help='print the table of every model of the suite')
    parser.add_argument('--seg-config', nargs='+', metavar='CONFIG', help='segmentation configs to count')
    return parser


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    """tools/model_info.py: a model's counts (one line, or JSON), every suite model's, or segmentation configs'."""
    parser = build_parser(description)
    args = parser.parse_args(argv)
    if sum((args.all, bool(args.model), bool(args.seg_config))) != 1:
        parser.error('give a model name, --all or --seg-config')
    if args.seg_config:
        write_document(config_table(args.seg_config))
    elif args.all:
        write_document(model_table(args.img_size))
    else:
        info = measure_complexity(args.model, args.img_size)
        write_document(json.dumps(info.as_dict()) if args.json else
                       f'{args.model}: {info.params:,} parameters ({info.trainable_params:,} trainable), '
                       f'{info.macs / 1e9:.2f} GMACs')
    return 0
