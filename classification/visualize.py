"""Pictures of what the models see, as PNG files: the logic of tools/visualize.py, one subcommand per picture (token
labels, attention, segmentations, training curves), drawn by `classification.pictures` and
`backbones.dense.pictures`."""
from __future__ import annotations

import argparse
from pathlib import Path
from textwrap import fill

import numpy as np
import torch

from backbones import create_model
from backbones.common.cli import (
    add_model_argument,
    add_model_kwargs_argument,
    add_seed_argument,
    add_weights_argument,
    command_parser,
    parse_model_kwargs,
    positive_int,
    probability,
)
from backbones.common.drawing import write_png
from backbones.common.errors import DataError, UsageError
from backbones.common.files import write_json_atomic
from backbones.common.images import check_same_classes, read_image
from backbones.common.log import logger
from backbones.common.outputs import output_file, png_file
from backbones.common.random_state import seed_all
from backbones.dense.run_data import EmbeddedSegData
from classification.recipes import none_or, rand_augment_spec
from classification.sources.source import open_split

TRAINING_AUGMENTATION = 'rand-m9-mstd0.5-inc1'
WIDTH = 116  # of the subcommands' descriptions (the tools' usage texts keep their own lines)


def add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--out', required=True, type=png_file, help='the PNG file to write')
    parser.add_argument('--show', action='store_true', help='also open the picture (where there is a display)')


def build_parser(description: str | None = None, fallback: type[EmbeddedSegData] | None = None
                 ) -> argparse.ArgumentParser:
    """tools/visualize.py's options, a subcommand per picture (the segmentation's takes `fallback`'s options)."""
    parser = command_parser(description, 'visualize.py')
    commands = parser.add_subparsers(dest='command', required=True, metavar='PICTURE')

    p = commands.add_parser('token-labels', help='an annotator map and the token targets of one augmentation',
                            description=fill('A token-label store\'s map of an image (the annotator\'s top classes '
                                             'over it), one augmented training crop of it and the target each token '
                                             'of that crop is trained on.', WIDTH))
    p.add_argument('--data-dir', required=True, help='the ImageNet-layout folder (or its tars) the store was made for')
    p.add_argument('--token-label-dir', required=True, help='its token-label store')
    p.add_argument('--image', help='an image of the store (default: the first), relative to --data-dir or not')
    p.add_argument('--img-size', type=positive_int, help='training input size (default: the store\'s, at most 224)')
    p.add_argument('--auto-augment', default=TRAINING_AUGMENTATION, type=none_or(rand_augment_spec),
                   help='RandAugment string, or none')
    p.add_argument('--scale-min', type=probability, default=0.08, help='RandomResizedCrop\'s smallest area')
    p.add_argument('--hflip', type=probability, default=0.5, help='probability of a horizontal flip')
    add_seed_argument(p, 'which augmentation is drawn')
    p.add_argument('--no-verify', action='store_true', help='do not check the store against its digests')
    add_output(p)

    what = 'attention rollout or CaiT class attention, attention distance, position-embedding similarity'
    p = commands.add_parser('attention', help=what, description=fill(
        f'What a model attends to (random weights or a checkpoint\'s), on images: {what}.', WIDTH))
    add_model_argument(p)
    p.add_argument('--checkpoint', help='weights (default: the model\'s random initialisation, said in the title)')
    add_weights_argument(p)
    p.add_argument('--image', nargs='+', required=True,
                   help='images: maps of the first; attention distance averaged over all')
    p.add_argument('--img-size', type=positive_int,
                   help='default: the size the checkpoint was trained at when it records it, else the model\'s own')
    add_model_kwargs_argument(p)
    p.add_argument('--json', type=output_file, help='also write the numbers drawn to this file: the rollout (or '
                   'class attention) over the patch grid, the mean attention distance per block and head, the '
                   'position-embedding similarity')
    add_output(p)

    p = commands.add_parser('segmentation', help='ground truth and prediction over an image; per-class IoU',
                            description=fill('A trained segmentor\'s prediction over an image, as tools/test_seg.py '
                                             'makes it, beside the ground truth; with --report, the per-class IoU of '
                                             'a test as bars.', WIDTH))
    p.add_argument('config', help='the config the checkpoint was trained with')
    p.add_argument('checkpoint', help='a checkpoint of tools/train_seg.py (or a release file)')
    p.add_argument('--image', help='an image (default: the first of the config\'s test set)')
    p.add_argument('--report', help='a tools/test_seg.py --out JSON: its per-class IoU as bars')
    p.add_argument('--data-root', help='data set folder in ADE20K layout, instead of the config\'s')
    p.add_argument('--alpha', type=probability, default=0.6, help='opacity of the class colours')
    p.add_argument('--no-labels', action='store_true', help='no class names on the regions')
    if fallback:
        fallback.add_arguments(p)
    add_output(p)

    p = commands.add_parser('confusion', help='the confusion matrix of a tools/test_seg.py report',
                            description=fill('The confusion matrix a tools/test_seg.py --out report holds, its rows '
                                             'normalised, and its largest confusions listed.', WIDTH))
    p.add_argument('report', help='a tools/test_seg.py --out JSON')
    p.add_argument('--top', type=positive_int, default=20, help='how many of the largest confusions to list')
    add_output(p)

    what = 'loss, accuracy and lr of runs (log.jsonl or mmengine logs)'
    p = commands.add_parser('curves', help=what, description=f'Training curves: {what}, one line per run.')
    p.add_argument('runs', nargs='+', metavar='RUN_DIR', help='run folders of train_cls, transfer or train_seg')
    add_output(p)
    return parser


def token_labels_picture(args: argparse.Namespace) -> np.ndarray:
    from classification.data.augment import TrainTransform
    from classification.pictures.token_labels import token_label_figure, token_labels
    from classification.token_labeling.label_store import TokenLabelStore

    data_dir, store = Path(args.data_dir), TokenLabelStore(args.token_label_dir, verify=not args.no_verify)
    split = store.meta.get('split', 'train')
    listing = open_split(data_dir, split)  # the store must be this folder's, as training checks
    check_same_classes(store.classes, listing.classes, f'the token-label store {store.root}', str(data_dir / split))
    names = [name for name, _ in listing.samples]
    store.rows_of(names)
    path = store_path(data_dir, args.image) if args.image else store.paths[0]
    row = store.row_of(path)
    scores, classes = store.read(row)
    size = args.img_size or min(store.meta['img_size'], 224)
    seed_all(args.seed)  # the augmentation drawn: the trainer's draws from these streams
    transform = TrainTransform(size, scale=(args.scale_min, 1.0), hflip=args.hflip, auto_augment=args.auto_augment,
                               reprob=0.0)
    if path not in names:
        raise DataError(f'{path}: in the token-label store {store.root} but not among the images of '
                        f'{data_dir / split}')
    labels = token_labels(read_image(listing.reader.open(names.index(path), path)), scores, classes, transform,
                          store.num_classes, extent=store.extent(row))
    return token_label_figure(labels, store.classes, f'{path}: {store.meta["annotator"]} map, {size} px training crop')


def store_path(data_dir: Path, image: str) -> str:
    """An image's key in a label store: its path relative to the data folder."""
    path = Path(image)
    if path.is_absolute() or path.exists():
        try:
            return str(path.resolve().relative_to(data_dir.resolve()))
        except ValueError:
            raise UsageError(f'{image} is not inside {data_dir}') from None
    return image


def attention_picture(args: argparse.Namespace) -> np.ndarray:
    from backbones import bare_model
    from classification.data.folders import config_eval_transform
    from classification.models import load_trained_classifier, takes_input_size, trained_data_config
    from classification.pictures.attention import attention_figure, attention_values, model_attention
    from classification.pictures.token_labels import to_pixels

    kwargs = parse_model_kwargs(args.model_kwargs)
    cfg = trained_data_config(args.model, args.checkpoint, args.img_size)
    size = cfg['input_size'][-1]
    if args.checkpoint:
        model = bare_model(load_trained_classifier(args.model, args.checkpoint, cfg, args.use_ema, kwargs))
        source = args.checkpoint
    else:
        model = create_model(args.model, **({'img_size': size} if takes_input_size(args.model) else {}), **kwargs)
        source = 'random weights'
    transform = config_eval_transform(cfg)
    images = torch.stack([transform(read_image(Path(p))) for p in args.image])
    maps, distances, similarity, patch_size = model_attention(model.eval(), images)
    if args.json:
        write_json_atomic(args.json, attention_values(maps, distances, similarity, patch_size))
    return attention_figure(to_pixels(images[0], cfg['mean'], cfg['std']), maps, distances, similarity, patch_size,
                            f'{args.model} ({source}), {Path(args.image[0]).name}; distances over '
                            f'{len(args.image)} image(s)')


def segmentation_picture(args: argparse.Namespace, fallback: EmbeddedSegData | None) -> np.ndarray:
    from backbones.dense.pictures import prediction_picture
    return prediction_picture(args.config, args.checkpoint, args.image, args.data_root, args.report, args.alpha,
                              not args.no_labels, fallback)


def confusion_picture(args: argparse.Namespace) -> np.ndarray:
    from backbones.dense.semantic.pictures import confusion_picture as picture
    return picture(args.report, args.top)


def curves_picture(args: argparse.Namespace) -> np.ndarray:
    from classification.pictures.curves import curves_figure, read_run
    return curves_figure([read_run(run) for run in args.runs])


PICTURES = {'token-labels': token_labels_picture, 'attention': attention_picture, 'confusion': confusion_picture,
            'curves': curves_picture}


def main(argv: list[str] | None = None, description: str | None = None,
         fallback: type[EmbeddedSegData] | None = None) -> Path:
    """tools/visualize.py (a segmentation's config runs on `fallback`'s data without ADE20K)."""
    args = build_parser(description, fallback).parse_args(argv)
    if args.command == 'segmentation':
        picture = segmentation_picture(args, fallback.from_args(args) if fallback else None)
    else:
        picture = PICTURES[args.command](args)
    path = write_png(picture, args.out, args.show)
    logger.info(f'{args.command}: {path}')
    return path
