"""The predictions of new images, written as files: the logic of tools/predict_seg.py, on `predict.SegPredictor`.
A segmentor's label maps as PNG files (with the classes over the image, if asked); a detector's instances as one
COCO-format file, instances.json (with each image's instances drawn over it, if asked); a depth model's depth maps
as 16-bit PNGs in the data set's scale, each with a coloured picture."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from backbones.common.cli import command_parser, probability
from backbones.common.devices import add_device_argument, device_name
from backbones.common.errors import UsageError
from backbones.common.files import write_atomic
from backbones.common.images import image_files
from backbones.common.log import logger
from backbones.common.outputs import check_output_folder
from backbones.dense.config import load_config
from backbones.dense.data_check import TURNS, file_orientation
from backbones.dense.predict import SegPredictor, check_opencv_reads, mask_paths
from backbones.dense.run_data import EmbeddedSegData
from backbones.dense.tasks import DenseTask, PredictionRequest, task_of, tasks
from backbones.dense.train import MMSEG_FLAGS, add_multi_scale_arguments, parse_with_fallback


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """tools/predict_seg.py's options (`description`: its usage text)."""
    parser = command_parser(description, 'predict_seg.py')
    parser.add_argument('config', help='the config the checkpoint was trained with')
    parser.add_argument('checkpoint', help='a checkpoint of tools/train_seg.py (or a release file)')
    parser.add_argument('images', nargs='+', help='image files, or folders (their images, sorted by name)')
    parser.add_argument('--out', required=True, help='the folder for the predictions (made if absent)')
    add_multi_scale_arguments(parser)
    parser.add_argument('--overlay', action='store_true',
                        help='also NAME_overlay.png: the classes (a detector\'s instances) over the image')
    parser.add_argument('--score-threshold', type=probability, default=0.5, metavar='S',
                        help='a detector\'s instances scoring at least S are written and drawn (default 0.5)')
    parser.add_argument('--data-root', help='the data set the config names, elsewhere (its classes are the masks\')')
    add_device_argument(parser)
    parser.add_foreign_flags("mmseg's tools", MMSEG_FLAGS)
    return parser


def write_mask(values: np.ndarray, path: Path) -> None:
    """A label map as a PNG of 8 bits (16 beyond 255 classes), written atomically."""
    image = Image.fromarray(values.astype(np.uint8 if values.max(initial=0) < 256 else np.uint16))
    write_atomic(path, lambda f: image.save(f, format='PNG'))


INSTANCES = 'instances.json'  # a detector's predictions in --out
OVERLAY_TAIL, PICTURE_TAIL = '_overlay.png', '_color.png'  # NAME_overlay.png (--overlay), a depth map's picture


def check_inputs_kept(images: list[Path], outputs: list[Path]) -> None:
    """No file the command may write is one of its input images."""
    inputs = {image.resolve() for image in images}
    clash = next((path for path in outputs if path.resolve() in inputs), None)
    if clash is not None:
        raise UsageError(f'{clash} is an input image, and a prediction would be written over it: give --out another '
                         f'folder')


def warn_orientation(image: Path, task: DenseTask) -> None:
    """One line for an image whose EXIF orientation turns it in viewers: its prediction fits the stored pixels."""
    orientation = file_orientation(image)
    if orientation != 1:
        logger.warning(f'warning: {image} has EXIF orientation {orientation}: its {task.predictions_fit} the pixels '
                       f'as stored, which viewers show {TURNS.get(orientation, "turned")}')


def main(argv: list[str] | None = None, description: str | None = None,
         fallback: type[EmbeddedSegData] | None = None) -> list[Path]:
    """tools/predict_seg.py: without the config's data on disk, its classes are `fallback`'s."""
    args, data_fallback = parse_with_fallback(build_parser(description), argv, fallback)
    if args.no_flip and not args.ms:
        raise UsageError('--no-flip applies to the multi-scale test (--ms, --tta); the single-scale test has no flip')
    cfg = load_config(args.config)
    task = task_of(cfg)
    if args.ms:
        task.check_multi_scale(args.config)
    if args.overlay and task.no_overlay:
        raise UsageError(f'--overlay draws classes or instances over an image; {args.config} is a {task.title} config '
                         f'({task.no_overlay})')
    images = image_files(args.images)
    out = Path(args.out)
    check_output_folder(out)
    tails = task.output_tails + ((OVERLAY_TAIL,) if args.overlay else ())
    masks = mask_paths(images, out, tails)
    # an input image is kept from any name predict_seg gives an output, whichever the task
    any_tail = sorted({OVERLAY_TAIL, *(tail for each in tasks() for tail in each.output_tails)})
    check_inputs_kept(images, [out / INSTANCES] + [out / f'{image.stem}{tail}' for image in images
                                                   for tail in any_tail])
    for image in images:
        check_opencv_reads(image)  # before any mask is written
    predictor = SegPredictor(args.config, args.checkpoint, args.ms, not args.no_flip, args.data_root,
                             fallback=data_fallback, device=device_name(args.device), loaded=cfg)
    for image in images:
        predictor.check_image(image)
        warn_orientation(image, predictor.task)
    out.mkdir(parents=True, exist_ok=True)
    return predictor.task.write_predictions(predictor, PredictionRequest(images, masks, out, args.overlay,
                                                                         args.score_threshold))
