"""Parameters and MACs of the suite's models.

    python tools/model_info.py lvvit_s [--img-size 384] [--json]
    python tools/model_info.py --all
    python tools/model_info.py --seg-config seg_configs/*.py     # segmentation models: parameters per part
"""
from __future__ import annotations

import argparse
import json

import backbones
from backbones.complexity import measure_complexity
from backbones.common.cli import positive_int, run_command


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('model', nargs='?', help='registered model name, e.g. lvvit_s, t2t_vit_14, cait_s24_224')
    parser.add_argument('--img-size', type=positive_int, default=None,
                        help="input resolution (default: the model's own)")
    parser.add_argument('--json', action='store_true', help='print {"params", "trainable_params", "macs"}')
    parser.add_argument('--all', action='store_true', help='print the table of every model of the suite')
    parser.add_argument('--seg-config', nargs='+', metavar='CONFIG', help='segmentation configs to count')
    args = parser.parse_args(argv)
    if sum((args.all, bool(args.model), bool(args.seg_config))) != 1:
        parser.error('give a model name, --all or --seg-config')
    return args


def table(img_size: int | None) -> str:
    rows = [f"{'family':<8} {'model':<30} {'params (M)':>11} {'trainable (M)':>14} {'GMACs':>8}"]
    for family, names in backbones.families().items():
        for name in names:
            info = measure_complexity(name, img_size)
            rows.append(f'{family:<8} {name:<30} {info.params / 1e6:>11.2f} {info.trainable_params / 1e6:>14.2f} '
                        f'{info.macs / 1e9:>8.2f}')
    return '\n'.join(rows)


def seg_table(configs: list[str]) -> str:
    import backbones.segmentation  # noqa: F401  (registers the suite's mmseg modules)
    from backbones.segmentation.complexity import PARTS, segmentor_parameters
    from backbones.segmentation.config import load_config
    rows = [f"{'config':<40} " + ' '.join(f'{part:>15}' for part in PARTS) + f" {'total (M)':>10}"]
    for path in configs:
        counts = segmentor_parameters(load_config(path))
        rows.append(f'{path:<40} ' + ' '.join(f'{counts.get(part, 0) / 1e6:>15.2f}' for part in PARTS)
                    + f" {counts['total'] / 1e6:>10.2f}")
    return '\n'.join(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.seg_config:
        print(seg_table(args.seg_config))
        return 0
    if args.all:
        print(table(args.img_size))
        return 0
    info = measure_complexity(args.model, args.img_size)
    if args.json:
        print(json.dumps(info.as_dict()))
    else:
        print(f'{args.model}: {info.params:,} parameters ({info.trainable_params:,} trainable), '
              f'{info.macs / 1e9:.2f} GMACs')
    return 0


if __name__ == '__main__':
    run_command(main)
