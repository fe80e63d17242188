"""A classification checkpoint as files other tools load: the logic of tools/export.py.

The model is built as tools/eval_cls.py builds it, with one of the checkpoint's two weight sets: the trained weights
(what eval_cls, predict_cls and the segmentation backbones load), or with `use_ema` the EMA copy. The folder gets:

- `model.safetensors` and `config.json`, written by timm's own `save_for_hf`: the architecture, the arguments that
  rebuild it (class count, input size, LV-ViT's token head, a distillation token), the preprocessing, the class
  names, and which weight set it holds (`suite_weights`). `timm.create_model('local-dir:FOLDER')` builds the model
  from it (with the suite's models registered: `import backbones`), and so does
  `create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file='FOLDER/model.safetensors', num_classes=N),
  **model_args)` (without `num_classes` in the overlay timm drops the head as one of ImageNet's 1000 classes);
  the file holds one weight set only, so every loader takes the same model.
- with `torch_export`, `model.pt2`: the eval-mode model traced by torch.export with a dynamic batch size, for
  runtimes without the suite (`torch.export.load(path).module()(images)`).

Each written file is checked against the eval model's outputs before the folder is given its name.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import torch
from timm.models import create_model
from timm.models._hub import load_model_config_from_path, save_for_hf

from backbones.registry import check_model_name
from backbones.token_head import TokenLabelingModel, bare_model
from backbones.weights import checkpoint_class_count
from common.cli import check_output_folder, model_parser, parse_model_kwargs, positive_int
from common.errors import CheckpointError, UsageError
from common.log import logger

from .models import build_eval_model, model_data_config
from .predict import class_names

WEIGHTS = 'model.safetensors'
EXPORTED_PROGRAM = 'model.pt2'
TOLERANCE = dict(rtol=1e-4, atol=1e-5)  # float32, the same weights: the graphs may order sums differently


def example_images(img_size: int, count: int = 2) -> torch.Tensor:
    """Normalised-looking inputs the exported files are checked on."""
    return torch.randn(count, 3, img_size, img_size, generator=torch.Generator().manual_seed(0))


def check_same_outputs(expected: torch.Tensor, got: torch.Tensor, what: str) -> None:
    if not torch.allclose(expected, got, **TOLERANCE):
        raise CheckpointError(f'{what} gives other outputs than the model (largest difference '
                              f'{(expected - got).abs().max().item():.3g}): nothing was written')


def timm_model_from(folder: Path) -> torch.nn.Module:
    """The model timm builds from an export folder, as a user's `create_model('local-dir:FOLDER')` does."""
    return create_model(f'local-dir:{folder}', pretrained=True).eval()


def timm_model(model: torch.nn.Module, checkpoint: str, model_name: str, images: torch.Tensor,
               expected: torch.Tensor) -> torch.nn.Module:
    """The eval model as timm builds it: without the suite's token-labeling wrapper, when the model predicts the same
    by itself (LV-ViT, whose token head is its own); any other model trained with token labeling needs the wrapper's
    inference rule, which timm cannot rebuild."""
    if not isinstance(model, TokenLabelingModel):
        return model
    bare = bare_model(model)
    with torch.no_grad():
        if torch.allclose(bare(images), expected, **TOLERANCE):
            return bare
    raise UsageError(f'{checkpoint}: {model_name} trained with token labeling predicts through the suite\'s token-head '
                     'wrapper, which timm cannot rebuild (LV-ViT has its token head built in); export its model '
                     'trained without token labeling, or an LV-ViT')


def export_classifier(model_name: str, checkpoint: str, out: Path, use_ema: bool = False, img_size: int | None = None,
                      torch_export: bool = False, model_kwargs: dict | None = None) -> Path:
    """Write the export folder `out` (see the module's docstring); returns it. The files are written into a
    temporary folder beside `out` and checked there, then renamed: `out` is complete or absent."""
    check_model_name(model_name)
    count = checkpoint_class_count(model_name, checkpoint, use_ema)
    data_cfg = model_data_config(model_name)
    size = img_size or data_cfg['input_size'][-1]
    model = build_eval_model(model_name, checkpoint, count, size, use_ema, model_kwargs or {})
    images = example_images(size)
    with torch.no_grad():
        expected = model(images)
    model = timm_model(model, checkpoint, model_name, images, expected)
    names, descriptions = class_names(checkpoint, count)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f'.{out.name}.', dir=out.parent))
    try:
        model_config = {'label_names': names, 'suite_weights': 'ema' if use_ema else 'trained',
                        'suite_checkpoint': str(checkpoint)}
        if descriptions:
            model_config['label_descriptions'] = dict(zip(names, descriptions))
        save_for_hf(model, str(staging), model_config=model_config, safe_serialization=True)
        with torch.no_grad():
            check_same_outputs(expected, timm_model_from(staging)(images), f'timm\'s model from {WEIGHTS}')
        if torch_export:
            write_exported_program(model, images, staging / EXPORTED_PROGRAM, expected)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info(f'{out}: {model_name}, {count} classes, the {"EMA" if use_ema else "trained"} weights of '
                f'{checkpoint}: {", ".join(sorted(p.name for p in out.iterdir()))}')
    return out


def write_exported_program(model: torch.nn.Module, images: torch.Tensor, path: Path, expected: torch.Tensor) -> None:
    """torch.export's program of the eval model, the batch size dynamic, checked on a batch of another size too."""
    batch = torch.export.Dim('batch', min=1, max=4096)
    program = torch.export.export(model, (images,), dynamic_shapes=({0: batch},))
    torch.export.save(program, path)
    loaded = torch.export.load(path).module()
    with torch.no_grad():
        check_same_outputs(expected, loaded(images), EXPORTED_PROGRAM)
        check_same_outputs(model(images[:1]), loaded(images[:1]), f'{EXPORTED_PROGRAM} at batch size 1')


def exported_config(folder: str | Path) -> dict:
    """An export folder's config.json (timm's reading of it: architecture, arguments, preprocessing)."""
    pretrained_cfg, name, model_args = load_model_config_from_path(folder)
    raw = json.loads((Path(folder) / 'config.json').read_text())
    return {'architecture': name, 'model_args': model_args, 'pretrained_cfg': pretrained_cfg,
            'suite_weights': raw.get('suite_weights')}


def build_parser() -> argparse.ArgumentParser:
    p = model_parser('export.py', __doc__.split('\n')[0])
    p.add_argument('--checkpoint', required=True, help='a checkpoint of train_cls/transfer_cifar or a release')
    p.add_argument('--out', required=True, help='the folder to write (replaced if it holds an earlier export)')
    p.add_argument('--use-ema', action='store_true',
                   help='the EMA weights of a training checkpoint (default: the trained weights, as eval_cls)')
    p.add_argument('--img-size', type=positive_int, help='default: the model\'s own')
    p.add_argument('--torch-export', action='store_true', help='also model.pt2, torch.export\'s program')
    p.add_argument('--model-kwargs', nargs='*', default=[], metavar='KEY=VALUE')
    return p


def main(argv: list[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    if out.exists() and not (out / 'config.json').is_file():
        raise UsageError(f'--out {out} exists and is not an export folder: choose a new folder')
    check_output_folder(out.parent)
    return export_classifier(args.model, args.checkpoint, out, args.use_ema, args.img_size, args.torch_export,
                             parse_model_kwargs(args.model_kwargs))
