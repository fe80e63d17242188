#!/usr/bin/env python
"""Import a released dense-label set (one .pt file per image) into the suite's token-label store.

    python tools/import_token_labels.py --data-dir /data/imagenet --release-dir /data/label_top5_train_nfnet \\
        --output /data/imagenet_labels_nfnet                          # TokenLabeling's NFNet-F6 maps (auto-detected)
    python tools/import_token_labels.py --data-dir /data/imagenet \\
        --release-dir /data/imagenet_efficientnet_l2_sz475_top5 --output /data/imagenet_labels_relabel
    torchrun --nproc-per-node 8 tools/import_token_labels.py ...      # the same, shards spread over processes

Every file is checked (shape, dtype, finite scores, class indices in range), the release's class folders must be the
data folder's classes, and images without a file are named (--skip-missing gives them an empty row: they train on
their image label). Run the same command again after an interruption: finished shards are kept.
"""
import argparse

from backbones.common.cli import check_output_folder, non_negative_int, positive_int, run_command
from backbones.common.distributed import run_distributed
from backbones.common.log import logger
from classification.token_labeling.label_store import DEFAULT_SHARD_SIZE
from classification.token_labeling.released_labels import FORMATS, import_released_labels


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--data-dir', required=True, help='ImageNet-layout folder (labels are imported for SPLIT/)')
    p.add_argument('--release-dir', required=True, help='the released tree: <wnid>/<image stem>.pt')
    p.add_argument('--output', required=True, help='folder of the token-label store')
    p.add_argument('--format', choices=FORMATS, default='auto', help=(
        'tokenlabeling: NFNet-F6 maps of the centre square ([2, 5, 18, 18]); relabel: EfficientNet-L2 maps of the '
        'whole image ([2, 5, 15, 15]); auto: from the first file\'s map size'))
    p.add_argument('--split', default='train')
    p.add_argument('--workers', type=non_negative_int, default=8, help='processes reading the files (0: this one)')
    p.add_argument('--shard-size', type=positive_int, default=DEFAULT_SHARD_SIZE, help='images per resumable shard')
    p.add_argument('--skip-missing', action='store_true',
                   help='give images without a file an empty row (listed in meta.json; they train on their label)')
    args = p.parse_args()
    check_output_folder(args.output)
    meta = run_distributed(lambda info: import_released_labels(
        args.data_dir, args.release_dir, args.output, info, fmt=args.format, split=args.split, workers=args.workers,
        shard_size=args.shard_size, skip_missing=args.skip_missing), 'cpu')
    h, w = meta['grid']
    logger.info(f'{args.output}: {meta["format"]} release, {h}x{w} x top-{meta["topk"]} maps of {meta["num_classes"]} '
                f'classes covering {meta["coverage"]}; every row verified'
                + (f'; {len(meta["missing"])} image(s) without a file have empty rows, listed in meta.json'
                   if meta['missing'] else ''))


if __name__ == '__main__':
    run_command(main)
