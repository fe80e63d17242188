"""A classification checkpoint as files other tools load: the logic of tools/export.py (`export_classifier`, `main`).

The model is built as tools/eval_cls.py builds it, with one weight set (`suite_weights` in config.json says which).
The folder gets `model.safetensors` and `config.json` (timm's `save_for_hf`, which
`timm.create_model('local-dir:FOLDER')` builds), optionally `model.pt2` and `model.onnx`, and `suite_export.json`, the
suite's mark; each file is checked against the eval model's outputs before the folder is given its name.
docs/export.md ("Classifiers") shows how each file is loaded."""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config
from timm.models import create_model, save_for_hf

from backbones.common.cli import (
    add_model_argument,
    add_model_kwargs_argument,
    add_weights_argument,
    command_parser,
    parse_model_kwargs,
    positive_int,
)
from backbones.common.errors import UsageError
from backbones.common.exporting import (
    BATCH,
    EXPORTED_PROGRAM,
    MARKER,
    ONNX_MODEL,
    TOLERANCE,
    batch_examples,
    check_export_folder,
    check_same_outputs,
    run_checked,
    staged_folder,
    write_exported_program,
    write_onnx,
)
from backbones.common.images import read_image
from backbones.common.log import logger
from backbones.common.outputs import check_output_folder
from backbones.dense import export as segmentor_export
from backbones.dense.run_data import EmbeddedSegData
from backbones.registry import check_model_name
from backbones.token_head import TokenLabelingModel, bare_model
from backbones.weights import checkpoint_class_count
from classification.data.folders import config_eval_transform
from classification.engine.checkpoints import weights_taken
from classification.models import check_finite, load_trained_classifier, trained_data_config
from classification.predict import class_names

# the preprocessing config.json records: what the export was checked with, as timm's resolve_data_config reads it
TIMM_DATA_KEYS = ('input_size', 'crop_pct', 'crop_mode', 'interpolation', 'mean', 'std')


def check_image(path: Path, size: int) -> Path:
    """A PNG that an eval transform both resizes and crops (wider than tall): colour gradients and noise."""
    height, width = size + size // 3 + 5, 2 * size + 7
    y, x = np.mgrid[0:height, 0:width] + 0.5
    rgb = np.stack([255 * x / width, 255 * y / height, 128 + 100 * np.sin(x / 5.0) * np.cos(y / 7.0)], axis=-1)
    noisy = rgb + np.random.default_rng(0).normal(0, 20, rgb.shape)
    Image.fromarray(np.uint8(np.clip(noisy, 0, 255))).save(path)
    return path


def check_timm_preprocessing(folder: Path, model: torch.nn.Module, data_cfg: dict) -> None:
    """timm's own way with the folder (its model and preprocessing) gives the suite's prediction on an image file."""
    timm_model = create_model(f'local-dir:{folder}', pretrained=True).eval()  # as a user's create_model builds it
    timm_transform = create_transform(**resolve_data_config({}, model=timm_model))
    with tempfile.TemporaryDirectory() as tmp:
        image = check_image(Path(tmp) / 'check.png', data_cfg['input_size'][-1])
        with Image.open(image) as img:
            timm_input = timm_transform(img.convert('RGB'))[None]
        suite_input = config_eval_transform(data_cfg)(read_image(image))[None]
    what = f'timm\'s model and preprocessing from {folder.name}/config.json, on an image,'
    with torch.no_grad():
        check_same_outputs(model(suite_input), run_checked(timm_model, timm_input, what), what)


def timm_model(model: torch.nn.Module, checkpoint: str, model_name: str, images: torch.Tensor,
               expected: torch.Tensor) -> torch.nn.Module:
    """The eval model as timm builds it: without the token-labeling wrapper where the model predicts the same alone."""
    if not isinstance(model, TokenLabelingModel):
        return model
    bare = bare_model(model)
    with torch.no_grad():
        if torch.allclose(bare(images), expected, **TOLERANCE):
            return bare
    raise UsageError(f'{checkpoint}: {model_name} trained with token labeling predicts through the suite\'s token-head '
                     'wrapper, which timm cannot rebuild (LV-ViT has its token head built in); export its model '
                     'trained without token labeling, or an LV-ViT')


def export_classifier(model_name: str, checkpoint: str, out: Path, use_ema: bool | None = None,
                      img_size: int | None = None,
                      torch_export: bool = False, onnx: bool = False, model_kwargs: dict | None = None) -> Path:
    """Write the export folder `out`, complete or not at all (written and checked beside it, then renamed)."""
    check_model_name(model_name)
    count = checkpoint_class_count(model_name, checkpoint, use_ema)
    data_cfg = trained_data_config(model_name, checkpoint, img_size)
    size = data_cfg['input_size'][-1]
    model = load_trained_classifier(model_name, checkpoint, data_cfg, use_ema, model_kwargs, count)
    examples = batch_examples(size, size)  # the batch is dynamic
    images = examples[0]
    with torch.no_grad():
        expected = check_finite(model(images), checkpoint)
    model = timm_model(model, checkpoint, model_name, images, expected)
    names, descriptions = class_names(checkpoint, count)
    weights = weights_taken(checkpoint, use_ema)
    model_config = {'label_names': names, 'suite_weights': weights,
                    'suite_checkpoint': str(checkpoint)}
    if descriptions:
        model_config['label_descriptions'] = dict(zip(names, descriptions))
    with staged_folder(out, {'export': 'classifier', 'checkpoint': str(checkpoint)}) as staging:
        save_for_hf(model, str(staging), model_config=model_config, safe_serialization=True,
                    data_config={key: data_cfg[key] for key in TIMM_DATA_KEYS if key in data_cfg})
        check_timm_preprocessing(staging, model, data_cfg)
        if torch_export:
            write_exported_program(model, examples, staging / EXPORTED_PROGRAM, BATCH)
        if onnx:
            write_onnx(model, examples, staging / ONNX_MODEL, BATCH, 'logits')
    logger.info(f'{out}: {model_name}, {count} classes, the {"EMA" if weights == "ema" else "trained"} weights of '
                f'{checkpoint}: {", ".join(sorted(p.name for p in out.iterdir()))}')
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_argument(p)
    p.add_argument('--checkpoint', required=True, help='a checkpoint of train_cls/transfer or a release')
    add_weights_argument(p)
    p.add_argument('--img-size', type=positive_int, help='default: the size the checkpoint was trained at, else the '
                   'model\'s own')
    add_model_kwargs_argument(p)


def export_from_args(args: argparse.Namespace, out: Path) -> Path:
    return export_classifier(args.model, args.checkpoint, out, args.use_ema, args.img_size, args.torch_export,
                             args.onnx, parse_model_kwargs(args.model_kwargs))


KINDS = {  # tools/export.py's subcommands: what each exports, in a line and in full
    'classifier': ('MODEL --checkpoint C: safetensors + timm config.json',
                   'A classification checkpoint as safetensors + timm\'s config.json (timm.create_model('
                   '"local-dir:OUT")\nbuilds it), with torch.export\'s program and ONNX if asked; every file checked '
                   'against the\nmodel\'s outputs first.'),
    'segmentor': ('CONFIG CHECKPOINT: safetensors + config.py + export.json',
                  'A segmentation checkpoint as safetensors + its config + export.json, with torch.export and ONNX\n'
                  'of its test window\'s forward if asked; every file checked against the segmentor\'s outputs first.'),
}


def build_parser(description: str | None = None, fallback: type[EmbeddedSegData] | None = None
                 ) -> argparse.ArgumentParser:
    """tools/export.py's options, a subcommand per kind of checkpoint (the segmentor's takes `fallback`'s options)."""
    parser = command_parser(description, 'export.py')
    kinds = parser.add_subparsers(dest='kind', required=True)
    for kind, (what, described) in KINDS.items():
        sub = kinds.add_parser(kind, help=what, description=described)
        (add_arguments if kind == 'classifier' else segmentor_export.add_arguments)(sub)
        sub.add_argument('--out', required=True, help=f'the folder to write: a new or empty one, or an earlier '
                         f'export (its {MARKER}), which is replaced')
        sub.add_argument('--torch-export', action='store_true', help="also model.pt2, torch.export's program")
        sub.add_argument('--onnx', action='store_true', help='also model.onnx, checked in onnxruntime')
        if kind == 'segmentor' and fallback:
            fallback.add_arguments(sub)
    return parser


def main(argv: list[str] | None = None, description: str | None = None,
         fallback: type[EmbeddedSegData] | None = None) -> Path:
    """tools/export.py: a classifier or a segmentor (whose config runs on `fallback`'s data without ADE20K)."""
    args = build_parser(description, fallback).parse_args(argv)
    out = Path(args.out)
    check_export_folder(out, args.kind)
    check_output_folder(out.parent)
    if args.kind == 'classifier':
        return export_from_args(args, out)
    return segmentor_export.export_from_args(args, out, fallback.from_args(args) if fallback else None)
