"""The masks of new images, written as PNG files (with the classes over the image, if asked): the logic of
tools/predict_seg.py, on `predict.SegPredictor`."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from backbones.common.cli import add_device_argument, check_output_folder, command_parser, device_name
from backbones.common.drawing import write_png
from backbones.common.errors import UsageError
from backbones.common.files import write_atomic
from backbones.common.images import image_files
from backbones.common.log import logger
from backbones.segmentation.config import EmbeddedSegData
from backbones.segmentation.data_check import TURNS, file_orientation
from backbones.segmentation.pictures import draw_labels
from backbones.segmentation.predict import SegPredictor, check_opencv_reads, mask_paths
from backbones.segmentation.train import parse_with_fallback


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """tools/predict_seg.py's options (`description`: its usage text)."""
    parser = command_parser(description, 'predict_seg.py')
    parser.add_argument('config', help='the config the checkpoint was trained with')
    parser.add_argument('checkpoint', help='a checkpoint of tools/train_seg.py (or a release file)')
    parser.add_argument('images', nargs='+', help='image files, or folders (their images, sorted by name)')
    parser.add_argument('--out', required=True, help='the folder for the masks (made if absent)')
    parser.add_argument('--ms', action='store_true', help="the config's multi-scale test (tta_pipeline), with flip")
    parser.add_argument('--no-flip', action='store_true', help='the multi-scale test without the flipped copies')
    parser.add_argument('--overlay', action='store_true', help='also NAME_overlay.png: the classes over the image')
    parser.add_argument('--data-root', help='the data set the config names, elsewhere (its classes are the masks\')')
    add_device_argument(parser)
    return parser


def write_mask(values: np.ndarray, path: Path) -> None:
    """A label map as a PNG of 8 bits (16 beyond 255 classes), written atomically."""
    image = Image.fromarray(values.astype(np.uint8 if values.max(initial=0) < 256 else np.uint16))
    write_atomic(path, lambda f: image.save(f, format='PNG'))


def main(argv: list[str] | None = None, description: str | None = None,
         fallback: type[EmbeddedSegData] | None = None) -> list[Path]:
    """tools/predict_seg.py: without the config's data on disk, its classes are `fallback`'s (the tool gives its
    embedded set)."""
    args, data_fallback = parse_with_fallback(build_parser(description), argv, fallback)
    if args.no_flip and not args.ms:
        raise UsageError('--no-flip applies to the multi-scale test (--ms); the single-scale test has no flip')
    images = image_files(args.images)
    out = Path(args.out)
    check_output_folder(out)
    masks = mask_paths(images, out)
    for image in images:
        check_opencv_reads(image)  # before any mask is written
    predictor = SegPredictor(args.config, args.checkpoint, args.ms, not args.no_flip, args.data_root,
                             fallback=data_fallback, device=device_name(args.device))
    out.mkdir(parents=True, exist_ok=True)
    for image, mask in zip(images, masks):
        pixels, prediction = predictor.segment(image)
        orientation = file_orientation(image)
        if orientation != 1:
            logger.warning(f'warning: {image} has EXIF orientation {orientation}: its mask fits the pixels as stored, '
                           f'which viewers show {TURNS.get(orientation, "turned")}')
        write_mask(predictor.label_values(prediction), mask)
        if args.overlay:
            write_png(draw_labels(pixels, prediction, predictor.classes, predictor.palette),
                      mask.with_name(f'{mask.stem}_overlay.png'))
        found = np.unique(prediction)
        logger.info(f'{image} -> {mask}: ' + ', '.join(predictor.classes[c] for c in found[:8])
                    + (f', ... ({len(found)} classes)' if len(found) > 8 else ''))
    return masks
