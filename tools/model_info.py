"""Parameters and MACs of the suite's models.

    python tools/model_info.py lvvit_s [--img-size 384] [--json]
    python tools/model_info.py --all
"""
from __future__ import annotations

import argparse
import json
import sys

import backbones
from backbones.complexity import measure_complexity


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('model', nargs='?', help='registered model name, e.g. lvvit_s, t2t_vit_14, cait_s24_224')
    parser.add_argument('--img-size', type=int, default=None, help="input resolution (default: the model's own)")
    parser.add_argument('--json', action='store_true', help='print {"params", "trainable_params", "macs"}')
    parser.add_argument('--all', action='store_true', help='print the table of every model of the suite')
    args = parser.parse_args(argv)
    if args.all == bool(args.model):
        parser.error('give a model name or --all')
    return args


def table(img_size: int | None) -> str:
    rows = [f"{'family':<8} {'model':<30} {'params (M)':>11} {'trainable (M)':>14} {'GMACs':>8}"]
    for family, names in backbones.families().items():
        for name in names:
            info = measure_complexity(name, img_size)
            rows.append(f'{family:<8} {name:<30} {info.params / 1e6:>11.2f} {info.trainable_params / 1e6:>14.2f} '
                        f'{info.macs / 1e9:>8.2f}')
    return '\n'.join(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.all:
        print(table(args.img_size))
        return 0
    try:
        info = measure_complexity(args.model, args.img_size)
    except ValueError as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(info.as_dict()))
    else:
        print(f'{args.model}: {info.params:,} parameters ({info.trainable_params:,} trainable), '
              f'{info.macs / 1e9:.2f} GMACs')
    return 0


if __name__ == '__main__':
    sys.exit(main())
