"""The trainer behind tools/train_seg.py: a config, mmengine's Runner, and the suite's data fallback.

On the fallback's data a run whose config names ImageNet weights that are not on disk asks for a pretraining first
(`prepare` returns it): its caller runs it and hands `train` the checkpoint. This module trains nothing else."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from mmengine.config import Config, DictAction

from backbones.common.cli import command_parser, non_negative_int, positive_float, positive_int
from backbones.common.devices import add_amp_argument, device_name, pick_amp, use_tf32
from backbones.common.errors import UsageError
from backbones.common.files import remove_partial_writes
from backbones.common.lifecycle import restarted_by_torchrun
from backbones.common.log import logger
from backbones.common.outputs import check_output_folder
from backbones.common.trackers import add_tracker_arguments, check_trackers, mlflow_tracking_uri
from backbones.dense.backbone import check_backbone_model, check_frozen_backbone
from backbones.dense.cfg_options import merge_options
from backbones.dense.config import check_loader_sizes, check_model_type, load_config
from backbones.dense.data_check import check_data
from backbones.dense.own_data import is_own_data_config, sized_iterations
from backbones.dense.preemption import make_resumable, run_seed
from backbones.dense.run_data import EmbeddedSegData, data_roots, missing_data, resolve_data, trained_data_record
from backbones.dense.runner import TRAINED_DATA, SuiteRunner, check_training_batch
from backbones.dense.schedule import accumulate_gradients, describe_schedule, drop_one_step_warmup, shorten_schedule
from backbones.dense.tasks import DenseTask, task_of
from backbones.dense.trained_checkpoints import check_pretrained, check_resumed_run
from backbones.weights import TIMM_RELEASE

AMP_DTYPES = {'bf16': 'bfloat16', 'fp16': 'float16'}  # --amp's precisions as AmpOptimWrapper's dtype names


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """Options train_seg and test_seg share."""
    parser.add_argument('--work-dir', help='output folder (default: work_dirs/<config name>)')
    parser.add_argument('--data-root', help=(
        'the data set\'s folder, instead of the config\'s (the own-data configs\' layout: docs/segmentation.md)'))
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
                        help='override config values, e.g. train_dataloader.batch_size=4')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm'], default='none',
                        help='"pytorch" under torchrun, "slurm" under srun; "none" for one process')
    parser.add_argument('--skip-unreadable', action='store_true',
                        help='leave out images that cannot be decoded and say how many (default: stop, naming them)')


# torch.distributed.launch's flag, which mmseg's tools take; torchrun sets LOCAL_RANK in the environment instead
LAUNCHER_FLAGS = dict.fromkeys(('--local_rank', '--local-rank'),
                               'torchrun --nproc-per-node N tools/... --launcher pytorch (torchrun sets LOCAL_RANK; '
                               'python -m torch.distributed.launch passes this flag)')
# mmseg's flags (tools/train.py, tools/test.py and demo/image_demo.py, 1.x and 0.x) that the dense tools do not take,
# and what they take instead: one table for train_seg, test_seg and predict_seg (a flag a tool takes is its own)
NO_WINDOW = 'the pictures as files: no window opens'
MMSEG_FLAGS = {
    '--options': '--cfg-options',
    '--load-from': '--cfg-options load_from=CHECKPOINT',
    '--resume-from': '--resume (from the work dir\'s newest checkpoint)',
    '--auto-resume': '--resume',
    '--no-validate': '--cfg-options train_cfg.val_interval=N (N beyond the run: no validation)',
    '--gpus': 'torchrun --nproc-per-node N tools/train_seg.py ... --launcher pytorch',
    '--gpu-ids': 'CUDA_VISIBLE_DEVICES=... torchrun --nproc-per-node N tools/train_seg.py ... --launcher pytorch',
    '--gpu-id': 'CUDA_VISIBLE_DEVICES=ID',
    '--seed': '--cfg-options randomness.seed=N',
    '--deterministic': '--cfg-options randomness.deterministic=True',
    '--show': f'--show-dir DIR with test_seg, --overlay with predict_seg ({NO_WINDOW})',
    '--wait-time': f'--show-dir DIR with test_seg ({NO_WINDOW})',
    '--show-dir': '--overlay with predict_seg (NAME_overlay.png beside each mask in --out)',
    '--aug-test': '--tta (or --ms)',
    '--eval': '--out FILE with test_seg (mIoU, mAcc, aAcc; the config\'s test_evaluator for mDice or mFscore)',
    '--eval-options': '--cfg-options test_evaluator.KEY=VALUE',
    '--format-only': '--pred-dir DIR with test_seg (the predictions as the data set\'s files)',
    '--out-file': '--out FOLDER with predict_seg (a prediction per image, NAME.png)',
    '--with-labels': '--overlay with predict_seg (it names the classes on their regions)',
    '--opacity': None,
    '--title': None,
    '--gpu-collect': None,
    '--tmpdir': None,
    **LAUNCHER_FLAGS,
}


def add_multi_scale_arguments(parser: argparse.ArgumentParser) -> None:
    """--ms (alias --tta, mmseg's name) and --no-flip: test_seg's and predict_seg's multi-scale test."""
    parser.add_argument('--ms', '--tta', dest='ms', action='store_true', help=(
        'test-time augmentation with the config\'s tta_pipeline and tta_model, as mmseg\'s --tta: each scale and '
        'its mirror image, merged as the task does (docs/segmentation.md)'))
    parser.add_argument('--no-flip', action='store_true', help='test-time augmentation without the mirror images')


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """tools/train_seg.py's options (`description`: its usage text)."""
    parser = command_parser(description, 'train_seg.py')
    parser.add_argument('config', help='config file, e.g. seg_configs/upernet_lvvit_m.py')
    add_common_options(parser)
    parser.add_argument('--resume', action='store_true',
                        help='continue from the latest checkpoint in the work dir')
    parser.add_argument('--iters', type=positive_int,
                        help='shorten the schedule to this many iterations (warm-up, decay, intervals scale along)')
    parser.add_argument('--grad-accum-steps', type=positive_int, default=1, metavar='N', help=(
        'one update every N iterations (global batch: GPUs x images per GPU x N); --iters and the config\'s '
        'schedule count updates, the lr stays the config\'s'))
    # bf16 and fp16 train through mmengine's AmpOptimWrapper (dynamic loss scale) in place of the configs' OptimWrapper
    add_amp_argument(parser, alone='fp16', gpus_only=True)
    parser.add_argument('--checkpoint-minutes', type=positive_float, metavar='M',
                        help='also write a checkpoint at most every M minutes (each replacing the previous timed one); '
                             'SIGTERM and SIGUSR1 always write one, then exit with status 75')
    parser.add_argument('--pictures', type=non_negative_int, default=4, metavar='N',
                        help='validation images drawn into TensorBoard and vis_data/ at every validation (0: none)')
    add_tracker_arguments(parser, 'the run named after the work dir, in WANDB_PROJECT (mmengine\'s WandbVisBackend)',
                          'the run named after the work dir, in an experiment named after the config, in a file '
                          'store in WORK_DIR/mlruns (mmengine\'s MLflowVisBackend)')
    parser.add_foreign_flags("mmseg's tools", MMSEG_FLAGS)
    return parser


def work_dir_for(cfg: Config, config_path: str, work_dir: str | None) -> str:
    return work_dir or cfg.get('work_dir') or os.path.join('work_dirs', Path(config_path).stem)


def processes(launcher: str) -> int:
    """How many processes train together (torchrun and srun say it in the environment)."""
    if launcher == 'none':
        return 1
    return int(os.environ.get('WORLD_SIZE') or os.environ.get('SLURM_NTASKS') or 1)


@dataclass(frozen=True)
class Pretraining:
    """The first stage a run on the fallback's data asks of its tool: the config's backbone (`model_name` with
    `model_kwargs`) pretrained on that data, because the config's ImageNet weights are not on disk (`reason`)."""

    model_name: str
    model_kwargs: dict
    reason: str


@dataclass(frozen=True)
class PretrainedBackbone:
    """What the first stage hands the second: the backbone's checkpoint, and one line saying what it is."""

    checkpoint: Path
    origin: str


@dataclass(frozen=True)
class PreparedRun:
    """A run's config, its task, and the pretraining it needs first (None: its backbone's weights are the config's)."""

    cfg: Config
    task: DenseTask
    pretraining: Pretraining | None = None


def choose_backbone(cfg: Config, config_pretrained: str | None, on_fallback: bool) -> Pretraining | None:
    """The backbone's start: on the fallback's data, the same model pretrained for it (the Pretraining returned) in
    place of the config's absent ImageNet weights. A path given must exist; None means random initialisation."""
    backbone = cfg.model.backbone
    pretrained = backbone.get('pretrained')
    if not on_fallback:
        check_pretrained(cfg)
    elif pretrained is None:
        logger.info('backbone: random initialisation (model.backbone.pretrained=None)')
    elif Path(pretrained).is_file():
        logger.info(f'backbone: {pretrained}')
    elif pretrained != config_pretrained:
        check_pretrained(cfg)  # a URL or timm's release: downloaded when the model is built
        logger.info(f'backbone: {pretrained}')
    else:
        said = (f'{pretrained} (the ImageNet release) left aside on the embedded data' if pretrained == TIMM_RELEASE
                else f'{pretrained} not found')
        return Pretraining(backbone.model_name, dict(backbone.get('model_kwargs') or {}), said)
    return None


def prepare(args: argparse.Namespace, fallback: EmbeddedSegData | None = None) -> PreparedRun:
    """The config a run takes (data, options, schedule), and the pretraining it needs first."""
    check_trackers(args.log_wandb, args.log_mlflow)  # before any work, the embedded data's writing included
    training_precision(args.amp)  # likewise: a precision this machine cannot train in
    cfg = load_config(args.config)
    config_pretrained = cfg.model.backbone.get('pretrained')
    options = args.cfg_options or {}
    if fallback is not None and missing_data(data_roots(cfg, args.data_root, options), fallback):
        fallback.use_schedule(cfg)  # under the command line's options: they win
        fallback.use_model(cfg)
    merge_options(cfg, options)  # once; the data is resolved on the config they made, as test_seg does
    check_loader_sizes(cfg, args.config)
    check_model_type(cfg, args.config)
    check_backbone_model(cfg.model.backbone)
    check_frozen_backbone(cfg)
    task = task_of(cfg)
    cfg.launcher = args.launcher
    cfg.work_dir = work_dir_for(cfg, args.config, args.work_dir)
    check_output_folder(cfg.work_dir)
    on_fallback = resolve_data(cfg, args.data_root, fallback)
    cfg[TRAINED_DATA] = trained_data_record(cfg, on_fallback)  # in every checkpoint: what tests and predictions take
    pretraining = choose_backbone(cfg, config_pretrained, on_fallback)
    if not on_fallback and is_own_data_config(cfg) and not args.iters:
        shorten_schedule(cfg, sized_iterations(cfg, processes(args.launcher), args.grad_accum_steps), options,
                         validate_at_checkpoints=True)  # save_best needs scores
    if args.iters:
        shorten_schedule(cfg, args.iters, options)
    accumulate_gradients(cfg, args.grad_accum_steps)
    check_training_batch(cfg, processes(args.launcher))
    if args.resume or restarted_by_torchrun():  # a run of another task, or a finished one: before anything is written
        check_resumed_run(cfg.work_dir, task, args.config, cfg.train_cfg['max_iters'])
    drop_one_step_warmup(cfg)
    logger.info(f'schedule: {describe_schedule(cfg)}')
    task.training_hooks(cfg, args.pictures)
    use_amp(cfg, args.amp)
    use_trackers(cfg, args.config, wandb=args.log_wandb, mlflow=args.log_mlflow)
    started = (Path(cfg.work_dir) / 'last_checkpoint').is_file()
    resume = args.resume or (started and restarted_by_torchrun())
    if started and not args.resume and resume:
        logger.info(f'torchrun restarted the run: resuming from the latest checkpoint in {cfg.work_dir}')
    if started and not resume:
        raise UsageError(f'{cfg.work_dir} already holds a run: add --resume to continue it, '
                         'or choose another --work-dir')
    remove_partial_writes(cfg.work_dir)  # checkpoint writes a kill interrupted (the first one too)
    cfg.resume = resume and started
    # the run's own seed, also on resume: the sampler's order and the workers' augmentation follow it
    cfg.randomness = {**cfg.get('randomness', {}),
                      'seed': run_seed(cfg.get('randomness', {}).get('seed'), cfg.work_dir, cfg.resume)}
    make_resumable(cfg, args.checkpoint_minutes)
    if args.resume and not started:
        logger.warning(f'warning: --resume: {cfg.work_dir} holds no checkpoint (the run wrote none yet, or was '
                       f'stopped while writing its first): starting from iteration 0')
    check_data(cfg, ['train_dataloader', 'val_dataloader'], task, args.skip_unreadable)
    return PreparedRun(cfg, task, pretraining)


def use_trackers(cfg: Config, config_path: str, wandb: bool = False, mlflow: bool = False) -> None:
    """mmengine's Weights & Biases and MLflow backends added to the config's visualizer, as asked."""
    backends = list(cfg.visualizer.get('vis_backends', []))
    run_name = Path(cfg.work_dir).name
    if wandb:
        backends.append(dict(type='WandbVisBackend', init_kwargs=dict(name=run_name)))
    if mlflow:
        # At its end the backend uploads the work dir's files of these suffixes (mmengine's default adds .py and
        # yaml: the file store in the work dir would upload its own files into itself); the config is logged already.
        backends.append(dict(type='MLflowVisBackend', exp_name=Path(config_path).stem, run_name=run_name,
                             tracking_uri=mlflow_tracking_uri(Path(cfg.work_dir, 'mlruns')),
                             artifact_suffix=('.json', '.log')))
    cfg.visualizer.vis_backends = backends


def training_precision(amp: str, gpu: bool | None = None) -> str:
    """`--amp` resolved (`gpu`: whether the run has one): 'none', 'bf16' or 'fp16', which need a GPU here."""
    gpu = torch.cuda.is_available() if gpu is None else gpu
    if not gpu:
        if amp not in ('none', 'auto'):
            raise UsageError(f"--amp {amp}: mmengine's AmpOptimWrapper trains on GPUs only, and PyTorch sees none "
                             'here (leave --amp out)')
        return 'none'
    return pick_amp(amp, torch.device('cuda'))


def use_amp(cfg: Config, amp: str, gpu: bool | None = None) -> None:
    """`--amp`: bf16 and fp16 train through mmengine's AmpOptimWrapper; none leaves the config's optimizer."""
    amp = training_precision(amp, gpu)
    if amp != 'none':
        cfg.optim_wrapper.update(type='AmpOptimWrapper', loss_scale='dynamic', dtype=AMP_DTYPES[amp])


def parse_with_fallback(parser: argparse.ArgumentParser, argv: list[str] | None,
                        fallback: type[EmbeddedSegData] | None) -> tuple[argparse.Namespace, EmbeddedSegData | None]:
    """The command line, with the fallback's own options; and the fallback those options make."""
    if fallback is None:
        return parser.parse_args(argv), None
    fallback.add_arguments(parser)
    args = parser.parse_args(argv)
    return args, fallback.from_args(args)


def train(run: PreparedRun, backbone: PretrainedBackbone | None = None) -> None:
    """Train the segmentor with mmengine's Runner, its backbone from `backbone` where a pretraining came first."""
    cfg = run.cfg
    if run.pretraining is not None:
        if backbone is None:
            raise UsageError(f'backbone: {run.pretraining.reason}: pretrain {run.pretraining.model_name} first and '
                             'pass its checkpoint, or set model.backbone.pretrained')
        cfg.model.backbone.pretrained = str(backbone.checkpoint)
        logger.info(f'stage 2 of 2: the segmentor, its backbone from {backbone.checkpoint}')
        logger.info(f'backbone: {run.pretraining.reason}; {backbone.origin}')
    use_tf32(torch.device(device_name(None)))  # mmengine's device: the GPU where there is one
    SuiteRunner.from_cfg(cfg).train()
