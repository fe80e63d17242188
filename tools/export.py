#!/usr/bin/env python
"""Export a checkpoint for other tools and runtimes; every file checked against the model's outputs first.

    # a classifier: safetensors + timm's config.json, torch.export's program, ONNX
    python tools/export.py classifier lvvit_s --checkpoint runs/lvvit_s/best.pth --out exported/lvvit_s \\
        --torch-export --onnx
    # then, wherever timm and the suite are installed:  import backbones, timm
    #     model = timm.create_model('local-dir:exported/lvvit_s', pretrained=True)

    # a segmentor: safetensors + its config + export.json; torch.export and ONNX of its test window's forward
    python tools/export.py segmentor seg_configs/upernet_lvvit_m.py work_dirs/upernet_lvvit_m/iter_160000.pth \\
        --out exported/upernet_lvvit_m --onnx

A classifier's folder holds one weight set: the trained weights, as eval_cls and predict_cls load them, or the EMA
copy with --use-ema (config.json's "suite_weights" says which). classification/export.py and
backbones/segmentation/export.py say what each file holds.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from classification import export as classifier_export
from backbones.common.cli import check_output_folder, run_command
from backbones.common.exporting import MARKER, check_export_folder
from classification.digits.seg_data import EmbeddedPages
from backbones.segmentation import export as segmentor_export


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    kinds = parser.add_subparsers(dest='kind', required=True)
    for kind, module, what in (
            ('classifier', classifier_export, 'MODEL --checkpoint C: safetensors + timm config.json'),
            ('segmentor', segmentor_export, 'CONFIG CHECKPOINT: safetensors + config.py + export.json')):
        sub = kinds.add_parser(kind, help=what)
        module.add_arguments(sub)
        sub.add_argument('--out', required=True, help=f'the folder to write: a new or empty one, or an earlier '
                         f'export (its {MARKER}), which is replaced')
        sub.add_argument('--torch-export', action='store_true', help="also model.pt2, torch.export's program")
        sub.add_argument('--onnx', action='store_true', help='also model.onnx, checked in onnxruntime')
        if kind == 'segmentor':
            EmbeddedPages.add_arguments(sub)
    return parser


def main(argv: list[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    check_export_folder(out, args.kind)
    check_output_folder(out.parent)
    if args.kind == 'classifier':
        return classifier_export.export_from_args(args, out)
    return segmentor_export.export_from_args(args, out, EmbeddedPages.from_args(args))


if __name__ == '__main__':
    run_command(main)
