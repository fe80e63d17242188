#!/usr/bin/env python
"""Segment new images with a trained checkpoint: one PNG label map per image, in the image's own size.

    python tools/predict_seg.py seg_configs/upernet_lvvit_m.py work_dirs/upernet_lvvit_m/iter_160000.pth \\
        photos/ --out masks/ --overlay
    python tools/predict_seg.py CONFIG CHECKPOINT a.jpg b.jpg --out masks/ --ms      # the papers' multi-scale + flip

A mask holds the data set's label values, as its annotations and `tools/test_seg.py --pred-dir` do (ADE20K: class
index + 1, 0 being 'other'); `--overlay` also writes NAME_overlay.png, the classes in the data set's palette over
the image. The config is read as test_seg reads it (`--data-root`; without ADE20K on disk, the embedded digits set),
so the classes are the ones the checkpoint was trained on. From Python:
`backbones.segmentation.predict.SegPredictor(config, checkpoint)(path)` gives the class index of every pixel.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from backbones.common.images import image_files
from backbones.common.cli import check_output_folder, device_name, run_command
from backbones.common.errors import UsageError
from backbones.common.files import write_atomic
from backbones.common.log import logger
from classification.digits.seg_data import EmbeddedPages
from backbones.segmentation.data_check import TURNS, file_orientation
from backbones.segmentation.pictures import draw_labels
from backbones.segmentation.predict import SegPredictor, check_opencv_reads, mask_paths
from backbones.segmentation.train import parse_with_fallback
from backbones.common.drawing import write_png


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='the config the checkpoint was trained with')
    parser.add_argument('checkpoint', help='a checkpoint of tools/train_seg.py (or a release file)')
    parser.add_argument('images', nargs='+', help='image files, or folders (their images, sorted by name)')
    parser.add_argument('--out', required=True, help='the folder for the masks (made if absent)')
    parser.add_argument('--ms', action='store_true', help="the config's multi-scale test (tta_pipeline), with flip")
    parser.add_argument('--no-flip', action='store_true', help='the multi-scale test without the flipped copies')
    parser.add_argument('--overlay', action='store_true', help='also NAME_overlay.png: the classes over the image')
    parser.add_argument('--data-root', help='the data set the config names, elsewhere (its classes are the masks\')')
    parser.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    return parser


def write_mask(values: np.ndarray, path: Path) -> None:
    """A label map as a PNG of 8 bits (16 beyond 255 classes), written atomically."""
    image = Image.fromarray(values.astype(np.uint8 if values.max(initial=0) < 256 else np.uint16))
    write_atomic(path, lambda f: image.save(f, format='PNG'))


def main(argv: list[str] | None = None) -> list[Path]:
    args, fallback = parse_with_fallback(build_parser(), argv, EmbeddedPages)
    if args.no_flip and not args.ms:
        raise UsageError('--no-flip applies to the multi-scale test (--ms); the single-scale test has no flip')
    images = image_files(args.images)
    out = Path(args.out)
    check_output_folder(out)
    masks = mask_paths(images, out)
    for image in images:
        check_opencv_reads(image)  # before any mask is written
    predictor = SegPredictor(args.config, args.checkpoint, args.ms, not args.no_flip, args.data_root,
                             fallback=fallback, device=device_name(args.device))
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


if __name__ == '__main__':
    run_command(main)
