"""The two commands that make a token-label store: generation by a machine annotator (tools/generate_token_labels.py,
`annotate.generate_token_labels`) and the import of a released label set (tools/import_token_labels.py,
`released_labels.import_released_labels`), each data-parallel under torchrun."""
from __future__ import annotations

import argparse

from backbones.common.cli import (
    add_model_kwargs_argument,
    add_workers_argument,
    command_parser,
    parse_model_kwargs,
    positive_int,
)
from backbones.common.devices import add_amp_argument, add_device_argument
from backbones.common.distributed import run_distributed
from backbones.common.log import logger
from backbones.common.outputs import check_output_folder
from classification.token_labeling.annotate import ANNOTATOR_AMP, generate_token_labels
from classification.token_labeling.label_store import DEFAULT_SHARD_SIZE
from classification.token_labeling.released_labels import FORMATS, import_released_labels


def generation_parser(description: str | None = None) -> argparse.ArgumentParser:
    """tools/generate_token_labels.py's options (`description`: its usage text)."""
    p = command_parser(description, 'generate_token_labels.py')
    p.add_argument('--data-dir', required=True,
                   help='ImageNet-layout folder, or tars of one (labels are made for SPLIT/)')
    p.add_argument('--annotator', required=True, help='model name in the timm registry (suite models included)')
    p.add_argument('--checkpoint', help='annotator weights (default: timm pretrained weights)')
    p.add_argument('--output', required=True, help='folder of the token-label store')
    p.add_argument('--img-size', type=positive_int,
                   help='annotator input size (default: the size --checkpoint was trained at, else its own)')
    p.add_argument('--topk', type=positive_int, default=5, help='classes kept per position (paper: 5)')
    p.add_argument('--split', default='train', help='the folder of --data-dir labelled')
    p.add_argument('--batch-size', type=positive_int, default=64, help='images per forward pass of the annotator')
    add_workers_argument(p)
    p.add_argument('--shard-size', type=positive_int,
                   help=f'images per resumable shard (default: the store\'s own, else {DEFAULT_SHARD_SIZE})')
    p.add_argument('--skip-unreadable', action='store_true',
                   help='give images that cannot be decoded an empty row and list them in meta.json (default: stop, '
                        'naming the file)')
    add_amp_argument(p, 'none', 'the stores compare across devices (bf16: on an H100 about 1.5x faster, unmeasured '
                     'in the steady state; top-k classes agree with fp32 at nearly every position, docs/speed.md)',
                     ANNOTATOR_AMP)
    add_model_kwargs_argument(p, 'output_stride=16 (a CNN annotator\'s denser map)', whose='the annotator')
    add_device_argument(p)
    return p


def generate(argv: list[str] | None = None, description: str | None = None) -> dict:
    """tools/generate_token_labels.py: the store written (or finished) and verified; its meta data."""
    args = generation_parser(description).parse_args(argv)
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
    return meta


def import_parser(description: str | None = None) -> argparse.ArgumentParser:
    """tools/import_token_labels.py's options (`description`: its usage text)."""
    p = command_parser(description, 'import_token_labels.py')
    p.add_argument('--data-dir', required=True,
                   help='ImageNet-layout folder, or tars of one (labels are imported for SPLIT/)')
    p.add_argument('--release-dir', required=True, help='the released tree: <wnid>/<image stem>.pt')
    p.add_argument('--output', required=True, help='folder of the token-label store')
    p.add_argument('--format', choices=FORMATS, default='auto', help=(
        'tokenlabeling: NFNet-F6 maps of the centre square ([2, 5, 18, 18]); relabel: EfficientNet-L2 maps of the '
        'whole image ([2, 5, 15, 15]); auto: from the first file\'s map size'))
    p.add_argument('--split', default='train', help='the folder of --data-dir the release labels')
    add_workers_argument(p)
    p.add_argument('--shard-size', type=positive_int, default=DEFAULT_SHARD_SIZE, help='images per resumable shard')
    p.add_argument('--skip-missing', action='store_true',
                   help='give images without a file an empty row (listed in meta.json; they train on their label)')
    return p


def import_release(argv: list[str] | None = None, description: str | None = None) -> dict:
    """tools/import_token_labels.py: the store written (or finished) and verified; its meta data."""
    args = import_parser(description).parse_args(argv)
    check_output_folder(args.output)
    meta = run_distributed(lambda info: import_released_labels(
        args.data_dir, args.release_dir, args.output, info, fmt=args.format, split=args.split, workers=args.workers,
        shard_size=args.shard_size, skip_missing=args.skip_missing), 'cpu')
    h, w = meta['grid']
    logger.info(f'{args.output}: {meta["format"]} release, {h}x{w} x top-{meta["topk"]} maps of {meta["num_classes"]} '
                f'classes covering {meta["coverage"]}; every row verified'
                + (f'; {len(meta["missing"])} image(s) without a file have empty rows, listed in meta.json'
                   if meta['missing'] else ''))
    return meta
