#!/usr/bin/env python
"""Dense token labels for token-labeling training: a machine annotator's top-k scores at every map position.

    python tools/generate_token_labels.py --data-dir /data/imagenet --annotator dm_nfnet_f6 \\
        --output /data/imagenet_token_labels --img-size 576 --topk 5
    torchrun --nproc-per-node 8 tools/generate_token_labels.py ...     # the same, data-parallel

The annotator is any model of the suite's or timm's registry: timm's pretrained weights, or --checkpoint. The
map describes the whole image resized to --img-size (no crop), so that training crops anywhere in the image
find their labels. Run the same command again after an interruption: finished shards are kept. With several
nodes, --output must be on a file system all of them share.
"""
import argparse

from backbones.common.cli import (DEFAULT_WORKERS, add_device_argument, check_output_folder, non_negative_int,
                        parse_model_kwargs, positive_int, run_command)
from backbones.common.distributed import run_distributed
from backbones.common.log import logger
from classification.token_labeling.annotate import AMP_CHOICES, DEFAULT_SHARD_SIZE, generate_token_labels


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--data-dir', required=True, help='ImageNet-layout folder (labels are made for SPLIT/)')
    p.add_argument('--annotator', required=True, help='model name in the timm registry (suite models included)')
    p.add_argument('--checkpoint', help='annotator weights (default: timm pretrained weights)')
    p.add_argument('--output', required=True, help='folder of the token-label store')
    p.add_argument('--img-size', type=positive_int,
                   help='annotator input size (default: the size --checkpoint was trained at, else its own)')
    p.add_argument('--topk', type=positive_int, default=5, help='classes kept per position (paper: 5)')
    p.add_argument('--split', default='train')
    p.add_argument('--batch-size', type=positive_int, default=64)
    p.add_argument('--workers', type=non_negative_int, default=DEFAULT_WORKERS)
    p.add_argument('--shard-size', type=positive_int,
                   help=f'images per resumable shard (default: the store\'s own, else {DEFAULT_SHARD_SIZE})')
    p.add_argument('--skip-unreadable', action='store_true',
                   help='give images that cannot be decoded an empty row and list them in meta.json (default: stop, '
                        'naming the file)')
    p.add_argument('--amp', choices=AMP_CHOICES, default='none',
                   help='bf16: the annotator under bf16 autocast (on an H100 about 1.5x faster, unmeasured in the '
                        'steady state; top-k classes agree with fp32 at nearly every position, docs/speed.md)')
    p.add_argument('--model-kwargs', nargs='*', default=[], metavar='KEY=VALUE',
                   help='annotator arguments, e.g. output_stride=16 for a denser map')
    add_device_argument(p)
    args = p.parse_args()
    check_output_folder(args.output)
    meta = run_distributed(lambda info: generate_token_labels(
        args.data_dir, args.annotator, args.output, info, checkpoint=args.checkpoint, img_size=args.img_size,
        topk=args.topk, split=args.split, batch_size=args.batch_size, workers=args.workers,
        shard_size=args.shard_size, model_kwargs=parse_model_kwargs(args.model_kwargs),
        skip_unreadable=args.skip_unreadable, amp=args.amp), args.device)
    h, w = meta['grid']
    logger.info(f'{args.output}: {h}x{w} x top-{meta["topk"]} maps of {meta["num_classes"]} classes for the '
                f'{args.split} split ({h * w * meta["topk"] * 4} bytes per image); every image has its row, verified'
                + (f'; {len(meta["unreadable"])} unreadable image(s) skipped, listed in meta.json'
                   if meta['unreadable'] else ''))


if __name__ == '__main__':
    run_command(main)
