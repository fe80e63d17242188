"""ImageNet-style training of any model (the suite's or any timm model) with its paper recipe: token labeling
(LV-ViT's), the vanilla DeiT recipe, or one of the LV-ViT paper's comparison rows (`--preset`); with `--teacher`,
DeiT's hard distillation, or with token labeling, online token labeling.

`tools/train_cls.py` is the command (`main`); `train(model, recipe, data, options, info, start)` is the same run
from Python, with a `Recipe` (`recipes.recipe_for`), an `ImageData` (`loaders`) and a `RunStart`."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from backbones import bare_model
from backbones.common.cli import add_model_kwargs_argument, model_parser, parse_model_kwargs, positive_int
from backbones.common.distributed import DistInfo, run_distributed
from backbones.common.errors import UsageError
from backbones.common.log import logger
from backbones.registry import check_model_name
from classification.engine.checkpoints import DATA_CONFIG, LAST, METRICS, check_checkpoint_classes
from classification.engine.trainer import RunOptions, Trainer, add_run_arguments, parse_run_arguments, run_settings
from classification.loaders import (
    AUGMENT_CHOICES,
    DECODE_CHOICES,
    EmbeddedImageData,
    ImageData,
    make_loaders,
    token_label_pictures,
    train_tf_reference,
)
from classification.models import (
    add_start_arguments,
    refuse_pretrained_file,
    start_weights,
    zero_classifiers,
)
from classification.recipes import PRESETS, TIMM_EMA_DECAY, Recipe, add_recipe_arguments, chosen_preset, resolve_recipe
from classification.run_plan import RunStart, plan_run
from classification.token_labeling.annotate import generate_token_labels
from classification.token_labeling.label_store import label_store_complete, open_store
from classification.training_pieces import TeacherSpec, load_finetune_weights, training_pieces

DATA_HELP = 'folder with train/CLASS/*.JPEG and val/CLASS/*.JPEG, or tars of them (docs/imagenet.md)'


def build_parser(default_data: type[EmbeddedImageData] | None = None, description: str | None = None,
                 prog: str = 'train_cls.py', data_help: str = DATA_HELP,
                 recipe_defaults: str = 'the model\'s paper preset') -> argparse.ArgumentParser:
    """tools/train_cls.py's options (`default_data`'s too); `prog`, `data_help`, `recipe_defaults` for transfer."""
    p = model_parser(prog, description)
    without = f' (default: {default_data.description})' if default_data else ''
    p.add_argument('--data-dir', help=f'{data_help}{without}')
    p.add_argument('--token-label-dir', help='token-label store from tools/generate_token_labels.py or '
                   'tools/import_token_labels.py')
    p.add_argument('--no-verify', action='store_true', help='do not check the token-label store against its digests '
                   'when opening it (for a store just checked: the check reads all of it)')
    add_start_arguments(p, 'start from these weights (e.g. for 384 fine-tuning); position embeddings are resized; '
                           'the classes must be the data\'s unless --new-head')
    p.add_argument('--new-head', action='store_true',
                   help='with --finetune: train new classifiers for this data set\'s classes')
    p.add_argument('--skip-unreadable', action='store_true',
                   help='skip images that cannot be decoded and report the count (default: stop, naming the file)')
    p.add_argument('--train-images', type=positive_int, metavar='N', help=(
        'train on at most N of the training split\'s images, evenly spaced over its listing (a smoke run; '
        'validation keeps the whole split)'))
    p.add_argument('--teacher', metavar='MODEL', help=(
        'DeiT\'s hard distillation from this classifier; with token labeling, online token labeling: the teacher '
        'annotates each augmented batch, and no store is read'))
    p.add_argument('--teacher-checkpoint', metavar='CKPT',
                   help='the teacher\'s weights (default: timm\'s pretrained weights of --teacher)')
    add_model_kwargs_argument(p, 'output_stride=16 (a CNN annotator\'s denser map)', '--teacher-kwargs', 'the teacher')
    p.add_argument('--preset', choices=list(PRESETS), help=(
        'one of the LV-ViT paper\'s comparison rows over the model\'s recipe (docs/imagenet.md), or vit-finetune, '
        'the ViT paper\'s fine-tuning (with --finetune)'))
    p.add_argument('--augment', choices=AUGMENT_CHOICES, default='auto', help=(
        'where the training augmentation runs: pil (each image in the loader workers), batched (whole batches on '
        'the training device); auto: batched on GPUs, pil on CPUs'))
    p.add_argument('--decode', choices=DECODE_CHOICES, default='cpu', help=(
        'where the batched path decodes the JPEGs: cpu (the loader workers), gpu (nvJPEG, a batch at a time: for '
        'nodes with few cores per GPU; other files still in the workers)'))
    p.add_argument('--fast-decode', action='store_true', help=(
        "the workers' colour JPEGs with libjpeg-turbo's fast IDCT and chroma upsampling: faster, but not Pillow's "
        'pixels (1.6 grey levels apart on average, docs/speed.md)'))
    p.add_argument('--model-ema', action='store_true',
                   help='timm\'s switch: an EMA of the weights where the recipe keeps none (decay '
                        f'{TIMM_EMA_DECAY:g}, or --model-ema-decay); the paper recipes keep one (--ema-decay 0: none)')
    add_run_arguments(p, 'output/train_cls/MODEL')
    if default_data:
        default_data.add_arguments(p)
    add_recipe_arguments(p.add_argument_group(f'recipe (defaults: {recipe_defaults}, printed at start)'), Recipe)
    return p


def train(model_name: str, recipe: Recipe, data: ImageData, options: RunOptions, info: DistInfo,
          start: RunStart = RunStart()) -> dict:
    """Train `model_name` on `data` with `recipe` as `start` says (the weights it starts from, a teacher, how images
    are augmented and decoded); returns (and writes to OUTPUT/metrics.json) the run's metrics."""
    plan = plan_run(model_name, recipe, data, start, options, info)
    recipe, teacher, online = plan.recipe, start.teacher, plan.online
    trainer = Trainer(options, info)  # its trackers started before the store and the data are read
    with trainer.refusals_undone():  # refused while its data is read, the run leaves no folder behind
        store = open_store(data.token_labels, data.verify_labels, info) if recipe.uses_score_maps and not online \
            else None
        train_loader, val_loader, classes, device_tf = make_loaders(data, store, recipe, plan.data_cfg, info, options,
                                                                    plan.augment, start.decode, start.fast_decode)
        if teacher is not None and teacher.checkpoint is not None:
            check_checkpoint_classes(teacher.checkpoint, classes, 'the training split')  # the teacher's scores by name
        model, objective = training_pieces(model_name, recipe, len(classes), options.seed, info, teacher,
                                           plan.data_cfg, options.model_kwargs)
        if start.finetune and not trainer.resume:
            logger.info(load_finetune_weights(bare_model(model), start.finetune, classes, start.new_head))
            if start.new_head and recipe.zero_head:
                zero_classifiers(bare_model(model))
        if teacher is not None and not online:
            bare_model(model).set_distilled_training(True)
        config = {'model': model_name, 'preset': start.preset, 'classes': classes, **vars(recipe),
                  DATA_CONFIG: {**plan.data_cfg, 'input_size': (3, recipe.img_size, recipe.img_size)},  # the val's
                  'teacher': vars(teacher) if teacher is not None else None, 'augment': plan.augment,
                  'decode': start.decode, 'train_images': len(train_loader.dataset)}  # resumed on another: refused
        fit = trainer.start(model, bare_model(model), plan.optimization, objective, config, len(train_loader),
                            device_tf)
    logger.info(f'{model_name}: {len(classes)} classes, {len(train_loader.dataset)} train / '
                f'{len(val_loader.dataset)} val images, {info.world_size} process(es), global batch '
                f'{plan.global_batch}, lr {plan.optimization.lr:.3g}, amp {fit.amp}, augmentation {plan.augment}'
                f'{" (decoded on the GPU)" if start.decode == "gpu" else ""}, token labeling {recipe.token_labeling}'
                + (f', {"annotated online" if online else "distilled"} by {teacher.model}' if teacher else ''))
    logger.info('recipe: ' + json.dumps(recipe.applied()))
    logger.info(f'schedule: {recipe.describe_epochs()}')
    pictures = token_label_pictures(train_loader.dataset, train_tf_reference(train_loader.dataset.transform),
                                    options.pictures) if store is not None and options.pictures else None
    record = trainer.run(fit, train_loader, val_loader, pictures)
    metrics = {'model': model_name, 'top1': record.get('top1'), 'top5': record.get('top5'),
               'epochs': trainer.num_epochs, 'best_top1': fit.best['top1'], 'best_epoch': fit.best['epoch'],
               'token_labeling': recipe.token_labeling, 'preset': start.preset,
               'teacher': teacher.model if teacher else None, 'online_token_labeling': online,
               'train_images': len(train_loader.dataset),
               'skipped_images': record.get('skipped_train', 0) + record.get('skipped', 0)}
    summary = f'done: top-1 {metrics["top1"]:.2f}%  top-5 {metrics["top5"]:.2f}%'
    if plan.optimization.ema_decay > 0:
        metrics.update(ema_top1=record.get('ema_top1'), ema_top5=record.get('ema_top5'))
        # the EMA is the run's model, the one its checkpoints hold and eval_cls scores: its figures lead
        summary = (f'done: top-1 {metrics["ema_top1"]:.2f}%  top-5 {metrics["ema_top5"]:.2f}% (the EMA, which the '
                   f'checkpoints hold; the trained weights {metrics["top1"]:.2f}%, {metrics["top5"]:.2f}%)')
    if metrics['skipped_images']:
        summary += f' ({metrics["skipped_images"]} unreadable image(s) skipped)'
    return trainer.finish(metrics, summary)


def main(argv: list[str] | None = None, default_data: type[EmbeddedImageData] | None = None,
         description: str | None = None) -> dict:
    """tools/train_cls.py: without --data-dir, the data is `default_data`'s (the tool gives its embedded set)."""
    parser = build_parser(default_data, description)
    refuse_pretrained_file(sys.argv[1:] if argv is None else argv)
    args = parse_run_arguments(parser, argv, ('--preset', '--model-ema', '--token-labeling', '--no-token-labeling'))
    fallback = check_arguments(args, default_data)
    recipe = resolve_recipe(args, fallback.recipe_values if fallback else None)
    ignored = [f'--{name.replace("_", "-")}' for name in recipe.unused_fields if hasattr(args, name)]
    if ignored and not args.config:  # a relaunch records them all; its first run said so
        logger.warning(f'warning: {" and ".join(ignored)} not used: '
                       + ('token labeling mixes images with MixToken (--mix-token)' if recipe.token_labeling
                          else 'label pooling mixes images with CutMix alone'))
    return launch(args, parser.prog, recipe, fallback, f'output/train_cls/{args.model}', chosen_preset(args),
                  args.new_head)


def check_arguments(args: argparse.Namespace, default_data: type[EmbeddedImageData] | None
                    ) -> EmbeddedImageData | None:
    """The parsed options checked together; the embedded data the run takes without --data-dir (None with it)."""
    check_model_name(args.model)
    if args.teacher:
        check_model_name(args.teacher)
    elif args.teacher_checkpoint or args.teacher_kwargs:
        raise UsageError('--teacher-checkpoint and --teacher-kwargs go with --teacher (the teacher model)')
    if args.data_dir is None and default_data is None:
        raise UsageError('--data-dir is required (the folder with train/CLASS/* and val/CLASS/*)')
    if args.data_dir is None and args.token_label_dir:
        raise UsageError(f'--token-label-dir {args.token_label_dir} goes with --data-dir (the images it labels); '
                         f'without --data-dir the run takes the embedded data and its own token labels')
    return default_data.from_args(args) if args.data_dir is None else None


def launch(args: argparse.Namespace, command: str, recipe: Recipe, fallback: EmbeddedImageData | None,
           default_output: str, preset: str | None, new_head: bool) -> dict:
    """The run the options of `build_parser` describe, with `recipe`, on --data-dir or the `fallback` data, from the
    weights of --finetune or --pretrained (a new classifier: `new_head`), under torchrun or in this process."""
    options = RunOptions.from_args(args, default_output, command, run_settings(args, recipe))
    teacher_kwargs = parse_model_kwargs(args.teacher_kwargs, '--teacher-kwargs')
    teacher = TeacherSpec(args.teacher, args.teacher_checkpoint, teacher_kwargs) if args.teacher else None
    weights = start_weights(args)  # from the cache: named before any data is prepared

    def run(info: DistInfo) -> dict:
        if fallback:
            data = prepare_embedded_data(fallback, recipe, info, options.workers)
        else:
            labels = Path(args.token_label_dir) if args.token_label_dir else None
            data = ImageData(Path(args.data_dir), labels, args.skip_unreadable, not args.no_verify)
        data = replace(data, train_images=args.train_images)
        start = RunStart(preset, weights, new_head, teacher, args.augment, args.decode, args.fast_decode)
        return train(args.model, recipe, data, options, info, start)

    return run_distributed(run, args.device)


def prepare_embedded_data(fallback: EmbeddedImageData, recipe: Recipe, info: DistInfo, workers: int) -> ImageData:
    """The stages before a run on a tool's embedded data, each skipped where done: the images written, and for a
    recipe that learns from score maps the annotator trained and its token labels written."""
    data = fallback.image_data(recipe, info)
    annotation = fallback.annotation(recipe)
    if annotation is None:
        return data
    if not (annotation.run_dir / METRICS).is_file():
        logger.info(f'embedded data: training the annotator {annotation.model} ...')
        options = RunOptions(annotation.run_dir, resume='auto' if (annotation.run_dir / LAST).is_file() else None,
                             model_kwargs=annotation.model_kwargs, workers=workers)
        train(annotation.model, annotation.recipe, replace(data, token_labels=None), options, info)
    if not label_store_complete(annotation.labels_dir):
        logger.info(f'embedded data: generating token labels with {annotation.model} ...')
        generate_token_labels(data.root, annotation.model, annotation.labels_dir, info,
                              checkpoint=str(annotation.run_dir / LAST), img_size=recipe.img_size, workers=workers,
                              model_kwargs=annotation.model_kwargs)
    return data
