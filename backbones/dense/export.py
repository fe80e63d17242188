"""A segmentation, detection or depth checkpoint as files for runtimes without mmseg: the logic of tools/export.py
segmentor (`export_segmentor`; `segmentor_from` reads a folder back).

The folder gets `model.safetensors`, `config.py` (data and classes resolved as test_seg resolves them) and
`export.json` (what a runtime needs besides the network); with `torch_export` and `onnx`, `model.pt2` and
`model.onnx`, the task's network (`DenseTask.exported_network`) at a fixed H and W (any whole strides with
`dynamic_size`) and a dynamic batch. Each file is checked against the model's outputs before the folder is given its
name. docs/export.md gives each task's inputs, outputs and bounds."""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmseg.registry import MODELS
from safetensors.torch import load_model, save_model

from backbones.common.cli import positive_int
from backbones.common.errors import UsageError
from backbones.common.exporting import (
    BATCH,
    CHECKED_BATCHES,
    EXPORTED_PROGRAM,
    ONNX_MODEL,
    WEIGHTS,
    DynamicDims,
    batch_examples,
    check_exported_file,
    check_same_outputs,
    example_images,
    staged_folder,
    write_exported_program,
    write_onnx,
)
from backbones.common.files import write_json_atomic
from backbones.common.log import logger
from backbones.dense.backbone import TokenBackbone
from backbones.dense.config import load_config, read_config
from backbones.dense.predict import SegPredictor
from backbones.dense.run_data import EmbeddedSegData
from backbones.dense.tasks import ExportChoice, ExportedNetwork, task_of


def window_size(cfg: Config) -> tuple[int, int]:
    """(H, W) a segmentor is exported at: its sliding test window, or (a whole-image test) its preprocessor's size."""
    test_cfg = cfg.model.get('test_cfg') or {}
    if test_cfg.get('mode') == 'slide':
        return tuple(test_cfg['crop_size'])
    size = cfg.model.data_preprocessor.get('size')
    if size is None:
        raise UsageError('this config tests images at their own size: give the exported input size, --size H W')
    return tuple(size)


def smallest_side(stride: int, least_side: int) -> int:
    """The smallest side an export at any size takes: whole `stride`s, two or more, from `least_side` on."""
    return max(2, -(-least_side // stride)) * stride


def checked_images(size: tuple[int, int], stride: int, dynamic_size: bool, least_side: int = 0
                   ) -> tuple[list[torch.Tensor], DynamicDims]:
    """The images an export is traced on (the first) and checked on, and their dynamic dimensions."""
    if not dynamic_size:
        return batch_examples(*size), BATCH
    if size[0] % stride or size[1] % stride:
        raise UsageError(f'--dynamic-size: the traced size {size[0]}x{size[1]} must be whole {stride} px patches')
    smallest = smallest_side(stride, least_side)
    if min(size) < smallest:
        raise UsageError(f'--dynamic-size: trace at a size of {smallest} px or more a side (--size): this network '
                         f'runs at any size from {smallest} px on, and torch.export fixes a program traced below '
                         f'that to the size traced')
    h, w = size
    others = [(h, w), (h + stride, w + 2 * stride), (max(smallest, h - stride), w + stride)]
    examples = [example_images(count, *other) for count, other in zip(CHECKED_BATCHES, others)]
    return examples, {**BATCH, 2: ('height', stride, smallest // stride), 3: ('width', stride, smallest // stride)}


def check_dynamic_size(backbone: nn.Module) -> None:
    """--dynamic-size refused at once for a backbone whose traced program would hold at its traced size only."""
    reason = backbone.fixed_size_reason() if isinstance(backbone, TokenBackbone) else None
    if reason:
        raise UsageError(f'--dynamic-size: {reason}; export it at a fixed size (--size H W)')


def description(predictor: SegPredictor, exported: ExportedNetwork, checkpoint: str, size: tuple[int, int],
                stride: int, dynamic_size: bool) -> dict:
    """export.json: what a runtime needs besides the network."""
    preprocessor = predictor.cfg.model.data_preprocessor
    return {
        'task': predictor.task.name, **predictor.task.export_facts(predictor),
        'input': {'size': f'any multiple of the stride from {smallest_side(stride, exported.least_side)}'
                          if dynamic_size else list(size), 'stride': stride,
                  'channels': 'RGB', 'scale': '0-255, then (x - mean) / std',
                  'mean': list(preprocessor['mean']), 'std': list(preprocessor['std'])},
        **exported.facts,
        'checkpoint': str(checkpoint),
    }


def export_segmentor(config: str, checkpoint: str, out: Path, size: tuple[int, int] | None = None,
                     torch_export: bool = False, onnx: bool = False, dynamic_size: bool = False,
                     data_root: str | None = None, fallback: EmbeddedSegData | None = None,
                     top_k: int | None = None, pyramid_only: bool = False) -> Path:
    """Write the export folder `out` (see the module's docstring); returns it."""
    if dynamic_size and onnx:
        raise UsageError('--dynamic-size takes --torch-export only: torch\'s ONNX exporter fails on the whole-patch '
                         'sizes (multiples of the stride) the backbones need; export ONNX at a fixed size (--size)')
    choice = ExportChoice(top_k, pyramid_only, dynamic_size)
    cfg = load_config(config)
    task_of(cfg).check_export_choice(choice, config)
    predictor = SegPredictor(config, checkpoint, data_root=data_root, fallback=fallback, loaded=cfg)
    if dynamic_size:
        check_dynamic_size(predictor.model.backbone)
    task = predictor.task
    exported = task.exported_network(predictor.model, choice)
    model = exported.network.eval()
    size = size or window_size(predictor.cfg)
    stride = task.input_stride(predictor.model, size)
    images, dynamic = checked_images(size, stride, dynamic_size, exported.least_side)
    examples = [(batch, *exported.other_inputs(batch)) for batch in images]
    dynamic = (dynamic, *[BATCH] * (len(examples[0]) - 1))
    with staged_folder(out, {'export': 'segmentor', 'checkpoint': str(checkpoint)}) as staging:
        save_model(predictor.model, str(staging / WEIGHTS))
        predictor.cfg.dump(str(staging / 'config.py'))
        write_json_atomic(staging / 'export.json',
                          description(predictor, exported, checkpoint, size, stride, dynamic_size))
        with torch.no_grad():
            rebuilt = task.exported_network(segmentor_from(staging), choice).network.eval()
            check_same_outputs(model(*examples[0]), rebuilt(*examples[0]), f'{WEIGHTS} with config.py')
        if torch_export:
            write_exported_program(model, examples, staging / EXPORTED_PROGRAM, dynamic)
        if onnx:
            write_onnx(model, examples, staging / ONNX_MODEL, dynamic, exported.output_names, exported.input_names)
    shape = 'any multiple of the stride' if dynamic_size else f'{size[0]}x{size[1]}'
    logger.info(f'{out}: {task.describe_outputs(predictor)}, inputs {shape}, from {checkpoint}: '
                f'{", ".join(sorted(p.name for p in out.iterdir()))}')
    return out


def segmentor_from(folder: Path) -> nn.Module:
    """The segmentor an export folder holds: its config's model with the safetensors weights (strictly)."""
    cfg = read_config(folder / 'config.py')
    init_default_scope(cfg.get('default_scope', 'mmseg'))
    cfg.model.backbone.pretrained = None
    segmentor = MODELS.build(cfg.model)
    check_exported_file(folder / WEIGHTS)
    load_model(segmentor, str(folder / WEIGHTS), strict=True)
    return segmentor.eval()


def add_arguments(p: argparse.ArgumentParser) -> None:
    """tools/export.py segmentor's arguments."""
    p.add_argument('config', help='the config the checkpoint was trained with')
    p.add_argument('checkpoint', help='a checkpoint of tools/train_seg.py (or a release file)')
    p.add_argument('--size', type=positive_int, nargs=2, metavar=('H', 'W'),
                   help="the exported input size (default: the config's test window; detectors and depth models "
                        'need it)')
    p.add_argument('--dynamic-size', action='store_true',
                   help='any input height and width (multiples of the backbone\'s stride), not only the window\'s')
    p.add_argument('--data-root', help='the data set the config names, elsewhere (its classes are the export\'s)')
    p.add_argument('--top-k', type=positive_int, metavar='K',
                   help='a detector\'s export: the detections it gives per image, best first, padded (default: its '
                        'RoI heads\' detections_per_img, 100 unless its config says otherwise)')
    p.add_argument('--pyramid-only', action='store_true',
                   help='a detector\'s export: its backbone and feature pyramid only (no RPN, heads or NMS)')


def export_from_args(args: argparse.Namespace, out: Path, fallback: EmbeddedSegData | None = None) -> Path:
    return export_segmentor(args.config, args.checkpoint, out, tuple(args.size) if args.size else None,
                            args.torch_export, args.onnx, args.dynamic_size, args.data_root, fallback, args.top_k,
                            args.pyramid_only)
