"""Top-k classes of new images with a classification checkpoint: the logic of tools/predict_cls.py.

The images go through the checkpoint's eval transform and the eval-mode model as tools/eval_cls.py builds them. The
class names are the ones the checkpoint records; an official 1000-class release is named with ImageNet's classes
(timm's ImageNetInfo), its WordNet id and its description."""
from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from timm.data import ImageNetInfo

from backbones.common.cli import (
    add_model_kwargs_argument,
    add_weights_argument,
    fraction,
    model_parser,
    parse_model_kwargs,
    positive_int,
)
from backbones.common.devices import add_device_argument, device_name
from backbones.common.files import write_json_atomic
from backbones.common.images import image_files, read_image
from backbones.common.log import logger
from backbones.common.outputs import output_file
from backbones.registry import check_model_name
from backbones.weights import checkpoint_class_count
from classification.data.folders import config_eval_transform
from classification.engine.checkpoints import checkpoint_classes
from classification.models import (
    add_checkpoint_arguments,
    check_finite,
    checkpoint_file,
    load_trained_classifier,
    trained_data_config,
)

IMAGENET_CLASSES = 1000


def class_names(checkpoint: str, count: int) -> tuple[list[str], list[str] | None]:
    """The checkpoint's class names (ImageNet's ids for an official release) and their descriptions where known."""
    names = checkpoint_classes(checkpoint)
    if names is None:
        names = ImageNetInfo().label_names() if count == IMAGENET_CLASSES else [str(i) for i in range(count)]
    info = ImageNetInfo()
    known = set(info.label_names())
    descriptions = [info.label_name_to_description(n) for n in names] if all(n in known for n in names) else None
    return names, descriptions


class ClassPredictor:
    """A classification checkpoint ready to name the top-k classes of images: `predictor(paths, k)`."""

    def __init__(self, model_name: str, checkpoint: str, img_size: int | None = None, crop_pct: float | None = None,
                 use_ema: bool | None = None, model_kwargs: dict | None = None, device: str = 'cpu') -> None:
        check_model_name(model_name)
        self.checkpoint = checkpoint
        self.data_config = trained_data_config(model_name, checkpoint, img_size, crop_pct)
        self.transform = config_eval_transform(self.data_config)
        count = checkpoint_class_count(model_name, checkpoint, use_ema)
        self.classes, self.descriptions = class_names(checkpoint, count)
        self.device = torch.device(device)
        self.model = load_trained_classifier(model_name, checkpoint, self.data_config, use_ema, model_kwargs,
                                             count).to(self.device).eval()

    def probabilities(self, paths: Sequence[Path], batch_size: int = 32) -> Iterator[torch.Tensor]:
        """The softmax over the classes of each image, in batches (an unreadable image is an error naming it)."""
        for start in range(0, len(paths), batch_size):
            images = torch.stack([self.transform(read_image(Path(p))) for p in paths[start:start + batch_size]])
            with torch.no_grad():
                yield check_finite(self.model(images.to(self.device)).float(), self.checkpoint).softmax(-1).cpu()

    def __call__(self, paths: Sequence[str | Path], k: int = 5) -> list[dict]:
        """For each image: {'image', 'top': [{'class', 'index', 'probability'[, 'description']}, ...]}, best first."""
        k = min(k, len(self.classes))
        results = []
        probabilities = torch.cat(list(self.probabilities(paths))) if paths else torch.empty(0)
        for path, p in zip(paths, probabilities):
            top = p.topk(k)
            results.append({'image': str(path), 'top': [self.entry(int(i), float(v))
                                                        for v, i in zip(top.values, top.indices)]})
        return results

    def entry(self, index: int, probability: float) -> dict:
        entry = {'class': self.classes[index], 'index': index, 'probability': probability}
        if self.descriptions is not None:
            entry['description'] = self.descriptions[index]
        return entry


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """tools/predict_cls.py's options (`description`: its usage text)."""
    p = model_parser('predict_cls.py', description)
    p.add_argument('images', nargs='+', help='image files, or folders (their images, sorted by name)')
    add_checkpoint_arguments(p)
    p.add_argument('--topk', type=positive_int, default=5, help='classes given per image, best first')
    p.add_argument('--json', type=output_file,
                   help="write the predictions to this file: [{'image', 'top': [{'class', 'index', 'probability'"
                        "[, 'description']}]}]")
    p.add_argument('--img-size', type=positive_int, help='default: the size the checkpoint was trained at, else the '
                   'model\'s own')
    p.add_argument('--crop-pct', type=fraction, help='default: the checkpoint\'s, else the model\'s own')
    add_weights_argument(p)
    add_model_kwargs_argument(p)
    add_device_argument(p)
    p.add_foreign_flags("timm's inference.py", {'--data': 'the images as arguments', '--data-dir': 'the images as '
                        'arguments', '-b': None, '--topk': None, '--num-classes': None, '--results-dir': '--json',
                        '--results-file': '--json', '--label-type': None, '--include-index': None})
    return p


def main(argv: list[str] | None = None, description: str | None = None) -> list[dict]:
    """tools/predict_cls.py."""
    args = build_parser(description).parse_args(argv)
    check_model_name(args.model)
    args.checkpoint = checkpoint_file(args)
    paths = image_files(args.images)
    predictor = ClassPredictor(args.model, args.checkpoint, args.img_size, args.crop_pct, args.use_ema,
                               parse_model_kwargs(args.model_kwargs), device_name(args.device))
    results = predictor(paths, args.topk)
    for result in results:
        best = ', '.join(f"{e.get('description', e['class']).split(',')[0]} {e['probability']:.1%}"
                         for e in result['top'])
        logger.info(f"{result['image']}: {best}")
    if args.json:
        write_json_atomic(args.json, results)
    return results
