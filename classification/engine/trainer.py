"""The run sequence ImageNet training and CIFAR transfer share.

    trainer = Trainer(RunOptions.from_args(args, default_output), info)   # output folder, resume point, trackers
    fit = trainer.start(model, params, optimization, objective, config, updates_per_epoch)   # then args.yaml
    record = trainer.run(fit, train_loader, val_loader)
    return trainer.finish(metrics, 'done: ...')

`start` builds the optimizer, schedule, mixed precision, EMA and compiled model (`training_state`, which the loop
benchmark's steps share) and restores a resumed run; `run` is the epoch loop of `Fit`; `finish` writes the run's
metrics. The applications keep what is theirs: data, model, parameter groups, the loss, and what they report."""
from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
import torch.nn as nn
from timm.optim import create_optimizer_v2, param_groups_layer_decay, param_groups_weight_decay
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3

from backbones import bare_model
from backbones.common.cli import (
    DEFAULT_SEED,
    CommandParser,
    add_model_kwargs_argument,
    add_seed_argument,
    add_workers_argument,
    non_negative_int,
    parse_model_kwargs,
    positive_float,
    positive_int,
    typed_flags,
)
from backbones.common.devices import add_amp_argument, add_device_argument, pick_amp, use_tf32
from backbones.common.distributed import DistInfo, barrier
from backbones.common.errors import DataError, UsageError
from backbones.common.files import FolderAdditions, write_json_atomic
from backbones.common.lifecycle import resumable_on_ctrl_c
from backbones.common.log import logger
from backbones.common.trackers import add_tracker_arguments, check_trackers
from classification.engine.checkpoints import (
    ARGS,
    LAST,
    METRICS,
    UNRECORDED,
    read_run_args,
    run_arguments,
    write_run_args,
)
from classification.engine.fit import Fit, Pictures, RunLog, resume_path
from classification.engine.prefetch import BatchTransform, Objective
from classification.engine.steps import StepState
from classification.engine.trackers import StartedTrackers, start_trackers


@dataclass
class RunOptions:
    """What every training command takes besides its recipe: output, resume, model, workers, seed, device, amp."""

    output: Path
    resume: str | None = None  # 'auto' (OUTPUT/last.pth) or a checkpoint path
    model_kwargs: dict = field(default_factory=dict)
    workers: int = 2
    seed: int = DEFAULT_SEED
    device: str | None = None  # None: cuda when there is a GPU
    amp: str = 'auto'
    log_interval: int = 50
    grad_checkpointing: bool = False
    compile: bool = False
    pictures: int = 4  # images drawn into TensorBoard at every validation (where the run has some); 0: none
    grad_accum_steps: int = 1  # batches whose gradients make one update
    checkpoint_minutes: float | None = None  # a mid-epoch checkpoint at most this often; None: at epochs only
    serial_loop: bool = False  # each batch prepared between the steps, not ahead of them (for comparison)
    log_wandb: bool = False
    log_mlflow: bool = False
    experiment: str | None = None  # the trackers' project (wandb) or experiment (MLflow); None: the command's name
    command: str | None = None  # the command and its settings, written to OUTPUT/args.yaml on a run's first start
    settings: dict | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace, default_output: str, command: str | None = None,
                  settings: dict | None = None) -> 'RunOptions':
        """The options `add_run_arguments` declared; `settings` for args.yaml; the trackers' clients checked now."""
        own = ('output', 'model_kwargs', 'command', 'settings')
        taken = {f.name: getattr(args, f.name) for f in fields(cls) if f.name not in own}
        check_trackers(taken['log_wandb'], taken['log_mlflow'])
        return cls(output=Path(args.output or default_output), model_kwargs=parse_model_kwargs(args.model_kwargs),
                   command=command, settings=settings, **taken)

    def global_batch(self, batch_size: int, world_size: int) -> int:
        """Images per optimizer update, over all processes and accumulated batches."""
        return batch_size * world_size * self.grad_accum_steps


def run_settings(args: argparse.Namespace, recipe: object) -> dict:
    """What args.yaml records of a run: every option as given or defaulted (but --config and --resume, which say how
    it was launched), and every recipe value as resolved, so that a changed default cannot change it."""
    return {**{key: value for key, value in vars(args).items() if key not in UNRECORDED}, **vars(recipe)}


def parse_run_arguments(parser: argparse.ArgumentParser, argv: list[str] | None,
                        recipe_choices: Sequence[str] = ()) -> argparse.Namespace:
    """`parser`'s arguments, over `--config RUN/args.yaml`'s when given (`recipe_choices` refused with it)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    first = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    first.add_argument('--config')
    config = first.parse_known_args(argv)[0].config
    typed = set(typed_flags(argv))
    chosen = [option for option in recipe_choices if option in typed]
    if config and chosen:
        raise UsageError(f'{chosen[0]} chooses a recipe, and --config {config} holds its run\'s recipe resolved, '
                         f'value by value: set the values themselves, or start the run without --config')
    if not config:
        return parser.parse_args(argv)
    recorded = run_arguments(parser, read_run_args(config, parser.prog), config)
    return parse_over_recorded(parser, argv, check_recorded_arguments(parser, recorded, config), recorded, config)


def check_recorded_arguments(parser: argparse.ArgumentParser, recorded: list[str], source: str
                             ) -> argparse.Namespace:
    """An args.yaml's values, checked as typed ones are; a value this version refuses names the file."""
    def refuse(message: str) -> None:
        raise DataError(f'--config {source}: {message}')
    parser.error = refuse  # for this parse only: argparse's own would print the usage and exit
    try:
        return parser.parse_args(recorded)
    finally:
        del parser.error


def parse_over_recorded(parser: argparse.ArgumentParser, argv: list[str], recorded_values: argparse.Namespace,
                        recorded: list[str], source: str) -> argparse.Namespace:
    """The options typed (`argv`) over an args.yaml's values, parsed apart from the file's so that the checks of a
    command line see what was typed. The positional arguments are the file's: another one typed is a UsageError."""
    positionals = [action.dest for action in parser._actions if not action.option_strings]
    given = recorded[:len(positionals)]  # `run_arguments` gives them first
    namespace, rest = parser.parse_known_args(given + argv, recorded_values)
    other = [arg for arg in rest if not arg.startswith('-') and arg not in given]
    if other:
        dest = positionals[0]
        raise UsageError(f'{other[0]}: --config {source} gives the {dest} of its run ({given[0]}), for which its '
                         f'recipe was resolved; it cannot be changed on the command line: to train {other[0]}, give '
                         f'it without --config')
    leftover = [arg for arg in rest if arg not in given]
    if leftover:
        parser.error(f'unrecognized arguments: {" ".join(leftover)}')
    return namespace


# timm's train.py flags the command does not take, and what it takes instead
TIMM_TRAIN_FLAGS = {
    '--data': 'the data folder as --data-dir', '--dataset': '--data-dir (an ImageNet-layout folder or its tars)',
    '--model': 'the model name as the first argument', '--num-classes': None,  # the training split's classes
    '--initial-checkpoint': '--finetune CKPT',
    '--input-size': '--img-size', '-b': '--batch-size', '-j': '--workers', '--lr': '--lr-base with --lr-base-batch',
    '--lr-base-size': '--lr-base-batch', '--sched': None, '--opt-eps': None, '--opt-betas': None,
    '--clip-mode': None, '--drop': None, '--amp-dtype': '--amp bf16 or --amp fp16', '--channels-last': None,
    '--sync-bn': None, '--dist-bn': None, '--model-ema-force-cpu': None, '--mixup-off-epoch': None,
    '--checkpoint-hist': None, '--eval-metric': None, '--recovery-interval': '--checkpoint-minutes',
    '--no-prefetcher': '--serial-loop', '--train-split': None, '--val-split': None, '--log-interval-steps': None,
    '--remode': None, '--recount': None, '--color-jitter': None, '--vflip': None, '--crop-pct': None,
    '--wandb-project': '--experiment', '--train-interpolation': '--interpolation', '--scale': '--scale-min',
    '--pretrained-path': '--finetune CKPT', '-c': '--config (the args.yaml of a run of this suite)',
    '--model-ema-warmup': None, '--mixup-prob': None, '--decay-epochs': None,
}


def add_run_arguments(parser: CommandParser, default_output: str) -> None:
    """The command-line options of `RunOptions`; timm's train.py flags the command does not take are named."""
    parser.add_argument('--config', metavar='RUN/args.yaml',
                        help="an earlier run's settings (its args.yaml); options typed after it override them")
    parser.add_argument('--output', help=f'output folder (default {default_output})')
    parser.add_argument('--resume', nargs='?', const='auto', metavar='CKPT',
                        help='continue an interrupted run: from CKPT, or from OUTPUT/last.pth when no path is given')
    add_model_kwargs_argument(parser)
    add_workers_argument(parser)
    add_seed_argument(parser, 'the initialisation, the data order and the augmentation')
    add_device_argument(parser)
    add_amp_argument(parser, alone='fp16')  # timm's --amp
    parser.add_argument('--log-interval', type=positive_int, default=50,
                        help='updates between TensorBoard loss points')
    parser.add_argument('--grad-checkpointing', action='store_true',
                        help='recompute each block\'s activations in the backward pass: less memory, more compute')
    parser.add_argument('--compile', action='store_true',
                        help='torch.compile the model for the training and evaluation steps (the first steps compile)')
    parser.add_argument('--torchcompile', dest='compile', nargs='?', const='inductor', choices=['inductor'],
                        help='timm\'s name of --compile (torch.compile\'s default backend, inductor)')
    parser.add_argument('--grad-accum-steps', type=positive_int, default=1, metavar='N',
                        help='one optimizer update every N batches: the global batch, which the lr follows, is batch '
                             'size x processes x N')
    parser.add_argument('--checkpoint-minutes', type=positive_float, metavar='M',
                        help='also write last.pth mid-epoch, at most every M minutes (resumed at the next batch); '
                             'SIGTERM and SIGUSR1 always write one before stopping')
    parser.add_argument('--serial-loop', action='store_true',
                        help='prepare each batch between the steps, not two batches ahead on a thread and stream of '
                             'their own: the same numbers, slower on GPUs (for comparison)')
    add_tracker_arguments(parser, 'the run named after the output folder, in --experiment\'s project',
                          'the run named after the output folder, in --experiment, in a file store in OUTPUT/mlruns')
    parser.add_argument('--experiment', help='the wandb project or MLflow experiment the run is logged in (default: '
                                             'the command\'s name)')
    parser.add_argument('--pictures', type=non_negative_int, default=4,
                        help='images drawn into TensorBoard at every validation (0: none)')
    parser.add_foreign_flags("timm's train.py", TIMM_TRAIN_FLAGS)


@dataclass(frozen=True)
class Optimization:
    """How a run optimises: timm's optimizer and cosine schedule, gradient clipping, and the EMA's decay (0: none)."""

    opt: str
    lr: float
    weight_decay: float
    epochs: int
    warmup_epochs: int = 0
    warmup_lr: float = 1e-5  # timm's defaults
    min_lr: float = 0.0
    cooldown_epochs: int = 0
    momentum: float = 0.9
    clip_grad: float | None = None
    ema_decay: float = 0.0
    layer_decay: float | None = None  # timm's layer-wise lr decay of a model's parameters (groups given: theirs)


FUSED_OPTIMIZERS = ('adam', 'adamw')  # timm builds these as torch's, whose fused kernels exist


def fused_optimizer_device(model: nn.Module) -> bool:
    """Whether torch's fused Adam/AdamW runs where the model's parameters are (CUDA, CPU)."""
    return all(p.device.type in ('cuda', 'cpu') and p.is_floating_point() for p in model.parameters())


def use_channels_last(model: nn.Module) -> None:
    """Convolution weights and input in channels-last layout, for models with 2-D convolutions."""
    if any(isinstance(m, nn.Conv2d) for m in model.modules()):
        model.to(memory_format=torch.channels_last)
        model.register_forward_pre_hook(channels_last_input)


def channels_last_input(module: nn.Module, args: tuple) -> tuple:
    images = args[0]
    return (images.contiguous(memory_format=torch.channels_last) if images.dim() == 4 else images, *args[1:])


def parameter_groups(model: nn.Module, weight_decay: float, layer_decay: float | None = None) -> list[dict]:
    """timm's weight-decay groups of `model`, or with `layer_decay` its layer-wise groups (the top's first)."""
    skip = model.no_weight_decay() if hasattr(model, 'no_weight_decay') else ()
    if not layer_decay:
        return param_groups_weight_decay(model, weight_decay, no_weight_decay_list=skip)
    groups = param_groups_layer_decay(model, weight_decay, no_weight_decay_list=skip, layer_decay=layer_decay)
    return sorted(groups, key=lambda group: -group['lr_scale'])


def optimization_state(model: nn.Module, params: nn.Module | list, optimization: Optimization,
                       updates_per_epoch: int, amp: str, fused: bool = True) -> tuple[StepState, int]:
    """timm's optimizer over `params` and its per-update cosine schedule, the fp16 scaler, the EMA; the epochs."""
    o = optimization
    fused = {'fused': True} if fused and o.opt.lower() in FUSED_OPTIMIZERS and fused_optimizer_device(model) else {}
    if o.layer_decay and isinstance(params, nn.Module):
        params = parameter_groups(params, o.weight_decay, o.layer_decay)
    optimizer = create_optimizer_v2(params, opt=o.opt, lr=o.lr, weight_decay=o.weight_decay, momentum=o.momentum,
                                    **fused)
    scheduler, num_epochs = create_scheduler_v2(
        optimizer, 'cosine', num_epochs=o.epochs, warmup_epochs=o.warmup_epochs, warmup_lr=o.warmup_lr,
        min_lr=o.min_lr, cooldown_epochs=o.cooldown_epochs, step_on_epochs=False, updates_per_epoch=updates_per_epoch)
    scaler = torch.amp.GradScaler('cuda') if amp == 'fp16' else None
    ema = ModelEmaV3(model, decay=o.ema_decay, use_warmup=True) if o.ema_decay > 0 else None
    return StepState(optimizer, scheduler, scaler, ema), num_epochs


def use_grad_checkpointing(model: nn.Module) -> None:
    target = bare_model(model)
    if not hasattr(target, 'set_grad_checkpointing'):
        raise UsageError(f'{type(target).__name__} has no gradient checkpointing (--grad-checkpointing)')
    target.set_grad_checkpointing(True)


@dataclass(frozen=True)
class StepOptions:
    """How a training step runs besides its precision; the loop benchmark turns them off one by one."""

    fused_optimizer: bool = True  # Adam/AdamW in one kernel where the device has it
    channels_last: bool = True  # for models with convolutions
    compile: bool = False
    grad_checkpointing: bool = False


def training_state(model: nn.Module, params: nn.Module | list, optimization: Optimization, updates_per_epoch: int,
                   amp: str, device: torch.device, options: StepOptions = StepOptions()) -> tuple[StepState, int]:
    """`model` made ready to train, the one way every run and benchmark does it (gradient checkpointing, device,
    channels-last, `optimization_state`, the EMA before `torch.compile`), and the epochs of the schedule."""
    if options.grad_checkpointing:
        use_grad_checkpointing(model)
    model.to(device)
    if options.channels_last:
        use_channels_last(model)
    state, num_epochs = optimization_state(model, params, optimization, updates_per_epoch, amp,
                                           options.fused_optimizer)
    if options.compile:
        model.compile()
    return state, num_epochs


def file_stamp(path: Path) -> tuple[int, int] | None:
    """A file's modification time and size, None where there is none: whether it was written since."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_mtime_ns, stat.st_size


class Trainer:
    def __init__(self, options: RunOptions, info: DistInfo) -> None:
        """The run's folder made and its trackers started before any data is read (one that cannot start is refused)."""
        self.options, self.info = options, info
        self.resume = resume_path(options.resume, options.output)  # refuses to overwrite a run silently
        self.trackers = StartedTrackers([])
        self.additions = FolderAdditions(options.output) if info.is_main else None
        with self.refusals_undone():
            if info.is_main:
                options.output.mkdir(parents=True, exist_ok=True)
                experiment = options.experiment or Path(options.command or 'train').stem
                self.trackers = start_trackers(options.output, experiment, options.settings or {}, options.log_wandb,
                                               options.log_mlflow)
        barrier(info)
        self.num_epochs = 0

    @contextlib.contextmanager
    def refusals_undone(self) -> Iterator[None]:
        """Stopped by anything before `start`, the run leaves its folder as it found it (trackers closed as stopped)."""
        try:
            yield
        except BaseException:
            self.undo()
            raise

    def undo(self) -> None:
        """Close the trackers as stopped and remove what the run added to its folder (the main process)."""
        if self.additions is not None:
            self.trackers.close(False)
            self.additions.remove()

    @property
    def output(self) -> Path:
        return self.options.output

    def start(self, model: nn.Module, params: nn.Module | list, optimization: Optimization, objective: Objective,
              config: dict, updates_per_epoch: int, train_transform: BatchTransform | None = None,
              eval_transform: BatchTransform | None = None) -> Fit:
        """The run's optimisation state for `model` (its parameters: `params`), restored from the resume point if
        there is one; a resume with another `config` is refused. `updates_per_epoch` counts batches."""
        accumulate = self.options.grad_accum_steps
        if updates_per_epoch < accumulate:
            raise DataError(f'--grad-accum-steps {accumulate}: an epoch has only {updates_per_epoch} batch(es) per '
                            f'process, fewer than one update')
        updates_per_epoch //= accumulate
        amp = pick_amp(self.options.amp, self.info.device)
        use_tf32(self.info.device)
        config = {**config, 'grad_accum_steps': accumulate, 'amp': amp}
        if optimization.lr < optimization.min_lr:
            logger.warning(f'warning: the lr for this global batch, {optimization.lr:.3g}, is below the schedule\'s '
                           f'floor (min lr {optimization.min_lr:.3g}): the cosine schedule will raise it; give a '
                           f'larger batch, --lr-base, or --min-lr')
        step = StepOptions(compile=self.options.compile, grad_checkpointing=self.options.grad_checkpointing)
        state, self.num_epochs = training_state(model, params, optimization, updates_per_epoch, amp, self.info.device,
                                                step)
        fit = Fit(model, state, objective, self.info, self.output, config, amp, optimization.clip_grad,
                  train_transform, eval_transform, accumulate, self.options.checkpoint_minutes,
                  overlap=not self.options.serial_loop)
        fit.start(self.resume, self.options.seed)
        self.record_settings()
        return fit

    def record_settings(self) -> None:
        """OUTPUT/args.yaml, on a run's first start, once its data and model are there."""
        o = self.options
        if self.info.is_main and o.settings is not None and not (self.resume and (o.output / ARGS).exists()):
            write_run_args(o.output, o.command, o.settings)

    def run(self, fit: Fit, train_loader, val_loader: Iterable[dict], pictures: Pictures | None = None) -> dict:
        """Train to the last epoch, validating, checkpointing and drawing `pictures` each; the last epoch's record."""
        o = self.options
        runlog = RunLog(self.output, self.info, o.log_interval, pictures if o.pictures else None, [self.trackers])
        last = self.output / LAST
        resumed_from = file_stamp(last)
        with resumable_on_ctrl_c(lambda: last if last.is_file() else None):
            try:
                return fit.run(train_loader, val_loader, self.num_epochs, runlog)
            except DataError:  # refused (an image that does not decode) before the run's first checkpoint
                if file_stamp(last) == resumed_from:
                    runlog.close(finished=False)
                    self.undo()
                raise

    def finish(self, metrics: dict, summary: str) -> dict:
        """Write the run's `metrics.json` (last, after every checkpoint) and say `summary`."""
        if self.info.is_main:
            write_json_atomic(self.output / METRICS, metrics)
            logger.info(f'{summary}  -> {self.output / METRICS}')
        return metrics
