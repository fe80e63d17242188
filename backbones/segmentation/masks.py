"""The predictions of new images, written as files: the logic of tools/predict_seg.py, on `predict.SegPredictor`.
A segmentor's label maps as PNG files (with the classes over the image, if asked); a detector's instances as one
COCO-format file, instances.json (with each image's instances drawn over it, if asked); a depth model's depth maps
as 16-bit PNGs in the data set's scale, each with a coloured picture."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from backbones.common.cli import add_device_argument, check_output_folder, command_parser, device_name, probability
from backbones.common.drawing import write_png
from backbones.common.errors import UsageError
from backbones.common.files import write_atomic, write_json_atomic
from backbones.common.images import image_files
from backbones.common.log import logger
from backbones.segmentation.config import EmbeddedSegData, dense_task, load_config
from backbones.segmentation.data_check import TURNS, file_orientation
from backbones.segmentation.depth.metric import write_depth_png
from backbones.segmentation.instances.metric import coco_results
from backbones.segmentation.pictures import colour_depth, draw_instances, draw_labels
from backbones.segmentation.predict import SegPredictor, check_multi_scale_task, check_opencv_reads, mask_paths
from backbones.segmentation.train import add_multi_scale_arguments, parse_with_fallback


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
    parser.add_foreign_flags("mmseg's demo/image_demo.py and tools/test.py", MMSEG_PREDICT_FLAGS)
    return parser


# mmseg's flags for predictions on images that predict_seg does not take, and what it takes instead
MMSEG_PREDICT_FLAGS = {
    '--out-file': '--out FOLDER (a mask per image, NAME.png)',
    '--show': '--overlay (NAME_overlay.png; predict_seg opens no window)',
    '--show-dir': '--overlay (NAME_overlay.png beside each mask in --out)',
    '--with-labels': '--overlay (it names the classes on their regions)',
    '--opacity': None,
    '--title': None,
}


def write_mask(values: np.ndarray, path: Path) -> None:
    """A label map as a PNG of 8 bits (16 beyond 255 classes), written atomically."""
    image = Image.fromarray(values.astype(np.uint8 if values.max(initial=0) < 256 else np.uint16))
    write_atomic(path, lambda f: image.save(f, format='PNG'))


INSTANCES = 'instances.json'  # a detector's predictions in --out
OVERLAY_TAIL, PICTURE_TAIL = '_overlay.png', '_color.png'  # NAME_overlay.png (--overlay), a depth map's picture
# the files each image gets in --out besides overlays: a mask, a depth map and its picture; a detector's instances
# all go into INSTANCES
OUTPUT_TAILS = {'semantic': ('.png',), 'depth': ('.png', PICTURE_TAIL), 'instances': ()}


def check_inputs_kept(images: list[Path], outputs: list[Path]) -> None:
    """No file the command may write is one of its input images (--out their own folder, an image named as a
    mask)."""
    inputs = {image.resolve() for image in images}
    clash = next((path for path in outputs if path.resolve() in inputs), None)
    if clash is not None:
        raise UsageError(f'{clash} is an input image, and a prediction would be written over it: give --out another '
                         f'folder')


PREDICTIONS_FIT = {'semantic': 'mask fits', 'instances': 'instances fit', 'depth': 'depth map fits'}


def warn_orientation(image: Path, task: str) -> None:
    """One line for an image whose EXIF orientation turns it in viewers: its prediction fits the stored pixels."""
    orientation = file_orientation(image)
    if orientation != 1:
        logger.warning(f'warning: {image} has EXIF orientation {orientation}: its {PREDICTIONS_FIT[task]} the pixels '
                       f'as stored, which viewers show {TURNS.get(orientation, "turned")}')


def write_instances(predictor: SegPredictor, images: list[Path], overlays: list[Path], path: Path, threshold: float,
                    overlay: bool) -> Path:
    """Every image's instances scoring `threshold` or more as one COCO-format file (images, the categories with the
    ids the checkpoint was trained with, annotations with RLE masks and scores); with `overlay`, each image's
    instances drawn over it (at the overlay paths, NAME.png becoming NAME_overlay.png)."""
    content = dict(images=[], categories=[dict(id=i, name=n) for i, n in zip(predictor.cat_ids, predictor.classes)],
                   annotations=[])
    for image_id, (image, picture) in enumerate(zip(images, overlays), start=1):
        try:
            pixels, sample = predictor.predict(image)
        except BaseException:
            if content['images']:  # the instances found so far are kept
                write_json_atomic(path, content)
                logger.warning(f'warning: stopped at {image}: the instances of the {len(content["images"])} '
                               f'image(s) before it are in {path}')
            raise
        found = sample.pred_instances[sample.pred_instances.scores >= threshold]
        content['images'].append(dict(id=image_id, file_name=str(image), height=pixels.shape[0],
                                      width=pixels.shape[1]))
        areas = found.masks.flatten(1).sum(1).tolist()
        for entry, area in zip(coco_results(image_id, found, predictor.cat_ids), areas):
            content['annotations'].append(dict(entry, id=len(content['annotations']) + 1, iscrowd=0,
                                               area=float(area)))
        if overlay:
            write_png(draw_instances(pixels, found.bboxes.cpu().numpy(), found.labels.tolist(),
                                     found.masks.cpu().numpy(), predictor.classes, predictor.palette,
                                     found.scores.tolist()), picture.with_name(f'{picture.stem}{OVERLAY_TAIL}'))
        names = [predictor.classes[label] for label in found.labels.tolist()]
        logger.info(f'{image}: {len(names)} instance(s)' + (f' ({", ".join(names[:8])})' if names else ''))
    write_json_atomic(path, content)
    logger.info(f'instances of {len(images)} image(s) -> {path}')
    return path


def write_depth_maps(predictor: SegPredictor, images: list[Path], paths: list[Path]) -> list[Path]:
    """Each image's depth as a 16-bit PNG in the data set's scale (`predictor.depth_scale` per metre), and beside it
    NAME_color.png, near bright and far dark over 0 .. the model's largest depth."""
    top = float(predictor.model.decode_head.max_depth)
    for image, path in zip(images, paths):
        _, sample = predictor.predict(image)
        depth = sample.pred_depth_map.data[0].cpu().numpy()
        write_depth_png(path, depth, predictor.depth_scale)
        write_png(colour_depth(depth, top), path.with_name(f'{path.stem}{PICTURE_TAIL}'))
        logger.info(f'{image} -> {path}: {depth.min():.2f} .. {depth.max():.2f} m')
    return paths


def main(argv: list[str] | None = None, description: str | None = None,
         fallback: type[EmbeddedSegData] | None = None) -> list[Path]:
    """tools/predict_seg.py: without the config's data on disk, its classes are `fallback`'s (the tool gives its
    embedded set)."""
    args, data_fallback = parse_with_fallback(build_parser(description), argv, fallback)
    if args.no_flip and not args.ms:
        raise UsageError('--no-flip applies to the multi-scale test (--ms, --tta); the single-scale test has no flip')
    task = dense_task(load_config(args.config))
    if args.ms:
        check_multi_scale_task(args.config, task)
    if args.overlay and task == 'depth':
        raise UsageError(f'--overlay draws classes or instances over an image; {args.config} is a depth config (its '
                         f'maps come with NAME_color.png)')
    images = image_files(args.images)
    out = Path(args.out)
    check_output_folder(out)
    tails = OUTPUT_TAILS[task] + ((OVERLAY_TAIL,) if args.overlay else ())
    masks = mask_paths(images, out, tails)
    # an input image is kept from any name predict_seg gives an output, whichever the task
    check_inputs_kept(images, [out / INSTANCES] + [out / f'{image.stem}{tail}' for image in images
                                                   for tail in ('.png', OVERLAY_TAIL, PICTURE_TAIL)])
    for image in images:
        check_opencv_reads(image)  # before any mask is written
    predictor = SegPredictor(args.config, args.checkpoint, args.ms, not args.no_flip, args.data_root,
                             fallback=data_fallback, device=device_name(args.device))
    for image in images:
        predictor.check_image(image)
        warn_orientation(image, predictor.task)
    out.mkdir(parents=True, exist_ok=True)
    if predictor.task == 'instances':
        return [write_instances(predictor, images, masks, out / INSTANCES, args.score_threshold, args.overlay)]
    if predictor.task == 'depth':
        return write_depth_maps(predictor, images, masks)
    for image, mask in zip(images, masks):
        pixels, prediction = predictor.segment(image)
        write_mask(predictor.label_values(prediction), mask)
        if args.overlay:
            write_png(draw_labels(pixels, prediction, predictor.classes, predictor.palette),
                      mask.with_name(f'{mask.stem}{OVERLAY_TAIL}'))
        found = np.unique(prediction)
        logger.info(f'{image} -> {mask}: ' + ', '.join(predictor.classes[c] for c in found[:8])
                    + (f', ... ({len(found)} classes)' if len(found) > 8 else ''))
    return masks
