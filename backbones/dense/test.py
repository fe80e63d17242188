"""The evaluator behind tools/test_seg.py: single-scale or the papers' multi-scale + flip mIoU of a segmentor; COCO's
box and mask AP of a detector; the depth metrics of a depth model; each task's test-time augmentation (--ms, --tta)
as its config's tta_pipeline and tta_model set it."""
from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import torch
from mmengine.config import Config
from mmseg.registry import DATASETS

from backbones.common.cli import command_parser
from backbones.common.devices import add_amp_argument, device_name, pick_amp, use_tf32
from backbones.common.errors import UsageError
from backbones.common.log import logger
from backbones.common.outputs import check_output_folder, output_file, output_folder
from backbones.dense.config import load_config
from backbones.dense.data_check import check_data
from backbones.dense.predict import mask_paths
from backbones.dense.run_data import EmbeddedSegData, resolve_trained_data
from backbones.dense.runner import SuiteRunner
from backbones.dense.tasks import task_of
from backbones.dense.train import (
    AMP_DTYPES,
    MMSEG_FLAGS,
    add_common_options,
    add_multi_scale_arguments,
    parse_with_fallback,
    work_dir_for,
)
from backbones.dense.trained_checkpoints import load_trained_config
from backbones.dense.tta import check_tta_settings, drop_tta_flips, test_mode


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """tools/test_seg.py's options (`description`: its usage text)."""
    parser = command_parser(description, 'test_seg.py')
    parser.add_argument('config', help='the config the checkpoint was trained with')
    parser.add_argument('checkpoint', help=(
        'a checkpoint of tools/train_seg.py (or mmseg\'s train.py), read by torch\'s weights-only unpickler with the '
        'few types mmengine stores (unpickling more could run code). Evaluate only checkpoints you trust.'))
    add_common_options(parser)
    add_multi_scale_arguments(parser)
    add_amp_argument(parser, alone='fp16')  # as train_seg's
    parser.add_argument('--out', type=scores_file, help=(
        'write the scores to this JSON file (percent): a segmentor\'s mIoU, aAcc, mAcc, per_class and confusion, a '
        'detector\'s box_AP, mask_AP, ..., per_class, a depth model\'s d1, abs_rel, rmse, log10, ...'))
    parser.add_argument('--pred-dir', help=(
        'save the predictions here: label maps (PNG) for a segmentor, COCO results (predictions.json) for a '
        'detector, depth maps (16-bit PNG in the data set\'s scale) for a depth model'))
    parser.add_argument('--show-dir', type=output_folder, help=(
        'as mmseg\'s --show-dir: a picture of each test image, its ground truth and a segmentor\'s prediction'))
    parser.add_foreign_flags("mmseg's tools", MMSEG_FLAGS)
    return parser


def scores_file(value: str) -> str:
    """--out's type: a JSON file to write; a folder is refused, naming --pred-dir, which takes one."""
    if Path(value).is_dir():
        raise argparse.ArgumentTypeError(f'{value} is a folder; --out writes the scores to a JSON file (--pred-dir DIR '
                                         'saves the predictions in a folder)')
    return output_file(value)


def use_multi_scale(cfg: Config, flip: bool) -> None:
    """Test with the config's `tta_pipeline` (the papers' scales) and `tta_model`; without flip if asked."""
    check_tta_settings(cfg)
    if not flip:
        drop_tta_flips(cfg)
    cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
    cfg.tta_model['module'] = cfg.model
    cfg.model = cfg.tta_model


def test_files(cfg: Config) -> list[dict]:
    """The test set's entries: each image's path, and its annotation's."""
    dataset = DATASETS.build({**cfg.test_dataloader.dataset, 'pipeline': [], 'serialize_data': False})
    return [dataset.get_data_info(i) for i in range(len(dataset))]


def check_outside_data(files: list[dict], folder: Path, option: str) -> None:
    """An output folder holds none of the test set's files (`test_files`): it would replace them."""
    data = {Path(info[key]).resolve().parent for info in files for key in ('img_path', 'seg_map_path')
            if info.get(key)}
    if folder.resolve() in data:
        raise UsageError(f'{option} {folder} holds the test set\'s images or annotations; write into another folder')


def check_arguments(args: argparse.Namespace, cfg: Config) -> None:
    """The refusals the command line and `cfg` alone decide, before any work."""
    if args.no_flip and not args.ms:
        raise UsageError('--no-flip applies to the multi-scale test (--ms, --tta); the single-scale test has no flip')
    task_of(cfg).check_test_options(args, args.config)
    if args.pred_dir:
        check_output_folder(args.pred_dir)


def prepare(args: argparse.Namespace, fallback: EmbeddedSegData | None = None) -> Config:
    loaded = load_config(args.config)
    check_arguments(args, loaded)
    cfg, data = load_trained_config(args.config, args.checkpoint, args.cfg_options, args.data_root, fallback,
                                    loaded=loaded)
    cfg.launcher = args.launcher
    cfg.work_dir = work_dir_for(cfg, args.config, args.work_dir)
    cfg.load_from = args.checkpoint
    resolve_trained_data(cfg, args.checkpoint, data, fallback, args.cfg_options)
    task = task_of(cfg)
    if args.ms:
        use_multi_scale(cfg, flip=not args.no_flip)
    if args.show_dir:
        cfg.custom_hooks = [*cfg.get('custom_hooks', []), dict(type='PredictionPictures', folder=str(args.show_dir))]
    check_data(cfg, ['test_dataloader'], task, args.skip_unreadable)
    folders = {option: Path(folder) for option, folder in (('--pred-dir', args.pred_dir), ('--show-dir', args.show_dir))
               if folder}
    if folders and task.outputs_per_image:
        files = test_files(cfg)
        images = [Path(info['img_path']) for info in files]
        for option, folder in folders.items():
            check_outside_data(files, folder, option)
            mask_paths(images, folder)  # a file an image: two images of one name are refused
    cfg.test_evaluator = task.test_evaluator(cfg, args.out, args.pred_dir)
    return cfg


def testing_precision(cfg: Config, amp: str, device: torch.device) -> contextlib.AbstractContextManager:
    """The test loop in `amp`'s precision (the returned autocast context); none leaves the config's float32 loop."""
    if amp == 'none':
        return contextlib.nullcontext()
    cfg.test_cfg = {**(cfg.get('test_cfg') or {}), 'fp16': True}
    return torch.autocast(device.type, dtype=getattr(torch, AMP_DTYPES[amp]))


def main(argv: list[str] | None = None, fallback: type[EmbeddedSegData] | None = None,
         description: str | None = None) -> dict[str, float]:
    """tools/test_seg.py: without ADE20K on disk, the data is `fallback`'s (the tool gives its embedded set)."""
    args, data_fallback = parse_with_fallback(build_parser(description), argv, fallback)
    cfg = prepare(args, data_fallback)
    mode = test_mode(cfg, args.ms)
    device = torch.device(device_name(None))  # mmengine's: the GPU where there is one
    use_tf32(device)
    with testing_precision(cfg, pick_amp(args.amp, device), device):
        metrics = SuiteRunner.from_cfg(cfg).test()
    logger.info(f'{mode}: {task_of(cfg).summary(metrics)}')
    return metrics
