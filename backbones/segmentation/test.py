"""The evaluator behind tools/test_seg.py: single-scale or the papers' multi-scale + flip mIoU of a segmentor; COCO's
box and mask AP of a detector; the depth metrics of a depth model."""
from __future__ import annotations

import argparse
from pathlib import Path

from mmengine.config import Config

from backbones.common.errors import UsageError
from backbones.common.cli import check_output_folder, command_parser, output_file, output_folder
from backbones.common.log import logger
from mmseg.registry import DATASETS, METRICS

from backbones.segmentation.config import (TASK_NAMES, EmbeddedSegData, dense_task, drop_tta_flips, load_config,
                                           load_trained_config, resolve_trained_data, tta_flips)
from backbones.segmentation.data_check import check_data
from backbones.segmentation.predict import check_multi_scale_task, mask_paths
from backbones.segmentation.runner import SuiteRunner
from backbones.segmentation.train import (LAUNCHER_FLAGS, add_common_options, add_multi_scale_arguments,
                                          parse_with_fallback, work_dir_for)


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """tools/test_seg.py's options (`description`: its usage text)."""
    parser = command_parser(description, 'test_seg.py')
    parser.add_argument('config', help='the config the checkpoint was trained with')
    parser.add_argument('checkpoint', help=(
        'a checkpoint written by tools/train_seg.py (or mmseg\'s train.py). mmengine checkpoints are pickles: '
        'they are read with torch\'s weights-only unpickler that also accepts the few types mmengine stores in '
        'them (its log buffers, NumPy arrays), and a file needing more is refused, as unpickling anything else '
        'could run code. Evaluate only checkpoints you trained or otherwise trust.'))
    add_common_options(parser)
    add_multi_scale_arguments(parser)
    parser.add_argument('--out', type=scores_file, help=(
        'write the scores to this JSON file: {"mIoU", "aAcc", "mAcc", "per_class", "confusion"} (percent; the '
        'confusion matrix\'s pixel counts and its rows normalised) for a segmentor; {"box_AP", ..., "mask_AP", ..., '
        '"per_class"} (percent) for a detector; {"d1", "abs_rel", "rmse", "log10", ...} for a depth model'))
    parser.add_argument('--pred-dir', help=(
        'save the predictions here: label maps (PNG, the data set\'s label values) for a segmentor, COCO-format '
        'results (predictions.json) for a detector, depth maps (16-bit PNG in the data set\'s scale) for a depth '
        'model'))
    parser.add_argument('--show-dir', type=output_folder, help=(
        'a segmentor\'s predictions as pictures here, as mmseg\'s --show-dir: NAME.png of each test image, the '
        'image, its ground truth and the prediction in the data set\'s palette side by side'))
    parser.add_foreign_flags("mmseg's tools/test.py", MMSEG_TEST_FLAGS)
    return parser


def scores_file(value: str) -> str:
    """--out's type: a JSON file to write; a folder is refused, naming --pred-dir, which takes one."""
    if Path(value).is_dir():
        raise argparse.ArgumentTypeError(f'{value} is a folder; --out writes the scores to a JSON file (--pred-dir DIR '
                                         'saves the predictions in a folder)')
    return output_file(value)


# mmseg's tools/test.py flags (1.x, and 0.x's) that test_seg does not take, and what it takes instead
MMSEG_TEST_FLAGS = {
    '--show': '--show-dir DIR (the pictures as files; test_seg opens no window)',
    '--wait-time': '--show-dir DIR (the pictures as files; test_seg opens no window)',
    '--aug-test': '--tta (or --ms)',
    '--eval': '--out FILE (mIoU, mAcc, aAcc; the config\'s test_evaluator for mDice or mFscore)',
    '--eval-options': '--cfg-options test_evaluator.KEY=VALUE',
    '--options': '--cfg-options',
    '--format-only': '--pred-dir DIR (the predictions as the data set\'s PNGs)',
    '--opacity': None,
    '--gpu-collect': None,
    '--tmpdir': None,
    **LAUNCHER_FLAGS,
}


def use_multi_scale(cfg: Config, flip: bool) -> None:
    """Test with the config's `tta_pipeline` (the papers' scales) and `tta_model`; without flip if asked."""
    missing = [key for key in ('tta_pipeline', 'tta_model') if not cfg.get(key)]
    if missing:
        raise UsageError(f'--ms (--tta) tests with the config\'s {" and ".join(missing)}, which it does not set '
                         f'(mmseg\'s multi-scale settings: see seg_configs/_base_/datasets)')
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
    """An output folder must not be one the test set's images or annotations (`test_files`) are in: its files would
    replace them (and a second test would score the predictions against themselves)."""
    data = {Path(info[key]).resolve().parent for info in files for key in ('img_path', 'seg_map_path')
            if info.get(key)}
    if folder.resolve() in data:
        raise UsageError(f'{option} {folder} holds the test set\'s images or annotations; write into another folder')


def check_arguments(args: argparse.Namespace) -> None:
    """The refusals the command line and the config alone decide, before any work: --no-flip without --ms, --ms
    and --show-dir on a detector's or a depth model's config, output folders that cannot be written."""
    if args.no_flip and not args.ms:
        raise UsageError('--no-flip applies to the multi-scale test (--ms, --tta); the single-scale test has no flip')
    task = dense_task(load_config(args.config))
    if args.ms:
        check_multi_scale_task(args.config, task)
    if args.show_dir and task != 'semantic':
        raise UsageError(f'--show-dir draws a segmentor\'s predictions; {args.config} is a {TASK_NAMES[task]} '
                         'config (tools/visualize.py segmentation draws its prediction for an image)')
    if args.pred_dir:
        check_output_folder(args.pred_dir)


def prepare(args: argparse.Namespace, fallback: EmbeddedSegData | None = None) -> Config:
    check_arguments(args)
    cfg, data = load_trained_config(args.config, args.checkpoint, args.cfg_options, args.data_root, fallback)
    cfg.launcher = args.launcher
    cfg.work_dir = work_dir_for(cfg, args.config, args.work_dir)
    cfg.load_from = args.checkpoint
    resolve_trained_data(cfg, args.checkpoint, data, fallback, args.cfg_options)
    task = dense_task(cfg)
    if args.ms:
        use_multi_scale(cfg, flip=not args.no_flip)
    if args.show_dir:
        cfg.custom_hooks = [*cfg.get('custom_hooks', []), dict(type='PredictionPictures', folder=str(args.show_dir))]
    check_data(cfg, ['test_dataloader'], args.skip_unreadable)
    folders = {option: Path(folder) for option, folder in (('--pred-dir', args.pred_dir), ('--show-dir', args.show_dir))
               if folder}
    if folders and task != 'instances':
        files = test_files(cfg)
        images = [Path(info['img_path']) for info in files]
        for option, folder in folders.items():
            check_outside_data(files, folder, option)
            mask_paths(images, folder)  # a file an image: two images of one name are refused
    cfg.test_evaluator = test_evaluator(cfg, task, args.out, args.pred_dir)
    return cfg


def test_evaluator(cfg: Config, task: str, out: str | None, pred_dir: str | None) -> dict | list:
    """The task's metric, writing its scores to `out` and its predictions into `pred_dir`; a depth config's own
    evaluation settings (depth range, crop, scale) kept, a segmentor's own evaluator honoured
    (`semantic_evaluator`)."""
    if task == 'instances':
        return dict(type='CocoAP', json_file=out, predictions_dir=pred_dir)
    if task == 'depth':
        own = cfg.get('test_evaluator') or {}
        return {**own, 'type': 'DepthReport', 'json_file': out, 'output_dir': pred_dir}
    return semantic_evaluator(cfg.get('test_evaluator') or {'type': 'IoUReport'}, out, pred_dir)


IOU_METRICS = ('IoUMetric', 'IoUReport')  # mmseg's, and the suite's that reports it
IOU_MEANS = ('mIoU', 'mDice', 'mFscore')  # what their `iou_metrics` may ask for


def semantic_evaluator(own: dict | list, out: str | None, pred_dir: str | None) -> dict | list:
    """A segmentation config's test_evaluator (a metric, or a list of them), as the config gives it: mmseg's
    IoUMetric becomes the suite's IoUReport with the same settings (its iou_metrics: mDice, mFscore; ignore_index,
    nan_to_num, beta), which also writes `out` and `pred_dir`; any other metric runs as it is. `out` and `pred_dir`
    need an IoU metric among them."""
    metrics = [dict(metric) for metric in (own if isinstance(own, (list, tuple)) else [own])]
    unknown = [str(metric.get('type')) for metric in metrics if METRICS.get(metric.get('type')) is None]
    if unknown:
        raise UsageError(f'the config\'s test_evaluator names {", ".join(unknown)}, which is no metric mmseg or the '
                         f'suite registers')
    iou = [metric for metric in metrics if metric.get('type') in IOU_METRICS]
    if len(iou) > 1:
        raise UsageError('the config\'s test_evaluator holds more than one IoU metric: their scores share their names')
    asked = [name for metric in iou for name in metric.get('iou_metrics', ()) if name not in IOU_MEANS]
    if asked:
        raise UsageError(f'the config\'s test_evaluator asks for {", ".join(map(str, asked))}: IoUMetric computes '
                         f'{", ".join(IOU_MEANS)}')
    if (out or pred_dir) and not iou:
        names = ', '.join(str(metric.get('type')) for metric in metrics)
        raise UsageError(f'--out and --pred-dir are written by the IoU metric; the config\'s test_evaluator is '
                         f"{names}: add dict(type='IoUMetric') to it, or leave them out")
    for metric in iou:
        metric.update(type='IoUReport', json_file=out, output_dir=pred_dir or metric.get('output_dir'))
    return metrics if isinstance(own, (list, tuple)) else metrics[0]


def summary(task: str, metrics: dict[str, float]) -> str:
    """The scores of a test in one line."""
    if task == 'instances':
        keys = ('box_AP', 'box_AP50', 'mask_AP', 'mask_AP50')
    elif task == 'depth':
        keys = ('d1', 'abs_rel', 'rmse', 'log10')
    else:
        keys = ('mIoU', 'mAcc', 'aAcc')
    return '  '.join(f'{key} {metrics[key]:.{3 if task == "depth" else 2}f}' for key in keys if key in metrics)


def main(argv: list[str] | None = None, fallback: type[EmbeddedSegData] | None = None,
         description: str | None = None) -> dict[str, float]:
    """tools/test_seg.py: without ADE20K on disk, the data is `fallback`'s (the tool gives its embedded set)."""
    args, data_fallback = parse_with_fallback(build_parser(description), argv, fallback)
    cfg = prepare(args, data_fallback)
    mode = 'multi-scale' + (' + flip' if tta_flips(cfg) else '') if args.ms else 'single-scale'
    metrics = SuiteRunner.from_cfg(cfg).test()
    logger.info(f'{mode}: {summary(dense_task(cfg), metrics)}')
    return metrics
