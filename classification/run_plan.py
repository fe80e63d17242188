"""A training run resolved before it starts (`plan_run`): its recipe at the size it trains at, where its images are
augmented, whether its teacher annotates online, its optimisation at the run's global batch; and what the recipe,
the data and the start cannot do together, refused before any work (`check_run`)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from backbones.common.distributed import DistInfo
from backbones.common.errors import UsageError
from backbones.common.log import logger
from classification.engine.trainer import Optimization, RunOptions
from classification.loaders import ImageData, check_decode, pick_augment
from classification.models import recipe_at_start_size
from classification.recipes import Recipe
from classification.training_pieces import TeacherSpec, annotates_online


@dataclass(frozen=True)
class RunStart:
    """What a run adds to its recipe: --preset, --finetune, --teacher, --augment, --decode, --fast-decode."""

    preset: str | None = None
    finetune: str | None = None
    new_head: bool = False
    teacher: TeacherSpec | None = None
    augment: str = 'auto'
    decode: str = 'cpu'
    fast_decode: bool = False


def check_run(model_name: str, recipe: Recipe, data: ImageData, start: RunStart, device: torch.device) -> None:
    """Refuse what the recipe, data and start cannot do together on `device`, and say which inputs go unused."""
    if start.new_head and not start.finetune:
        raise UsageError('--new-head goes with --finetune or --pretrained (the weights to start from)')
    check_decode(start.decode, pick_augment(start.augment, device), device)
    if recipe.zero_head and not start.finetune:
        raise UsageError(f'--preset {start.preset} fine-tunes pretrained weights: give them with --finetune CKPT '
                         f'or --pretrained (--new-head for a new class list)')
    if data.token_labels is not None and not recipe.uses_score_maps:
        logger.warning(f'warning: --token-label-dir {data.token_labels} is not used: this recipe learns from no '
                       f'annotator maps (no token labeling with map targets, no label pooling)')
    if recipe.token_participation < 1 and not recipe.token_labeling:
        raise UsageError(f'--token-participation {recipe.token_participation} applies to the token term of token '
                         f'labeling; this recipe has none')
    if recipe.label_pooling and recipe.token_labeling:
        raise UsageError('label pooling (ReLabel, --preset relabel) trains a model without token head: it does not go '
                         'with --token-labeling (--preset relabel-mixtoken is ReLabel\'s target with MixToken)')
    online = annotates_online(recipe, start.teacher)
    if start.teacher is not None and (recipe.label_pooling or (online and not recipe.uses_score_maps)):
        raise UsageError('--teacher: hard distillation does not go with label pooling (ReLabel), and online token '
                         'labeling needs the annotator\'s maps (--token-target map or pooled)')
    if online and data.token_labels is not None:
        logger.warning(f'warning: --token-label-dir {data.token_labels} is not used: with --teacher, token labeling '
                       f'is online (the teacher\'s maps of each batch)')
    if recipe.uses_score_maps and data.token_labels is None and not online:
        other_ways = ('another --preset (label pooling, ReLabel\'s target, always reads the maps)'
                      if recipe.label_pooling else '--token-target label or --no-token-labeling')
        raise UsageError(f'the {model_name} recipe learns from an annotator\'s maps: pass --token-label-dir '
                         f'(tools/generate_token_labels.py or tools/import_token_labels.py makes one), or {other_ways}')


@dataclass(frozen=True)
class RunPlan:
    """A run resolved: the recipe at the size it trains at, the model's data config, where images are augmented
    (`augment`), whether the teacher annotates online, and the optimisation at the run's global batch."""

    recipe: Recipe
    data_cfg: dict
    augment: str
    online: bool
    global_batch: int
    optimization: Optimization


def plan_run(model_name: str, recipe: Recipe, data: ImageData, start: RunStart, options: RunOptions,
             info: DistInfo) -> RunPlan:
    """The run resolved and checked before anything is built: the size first (a fine-tuning's by default its
    weights'), so that the checks, the loaders and the trainer all see the recipe the run trains with."""
    recipe, data_cfg = recipe_at_start_size(recipe, model_name, start.finetune)
    check_run(model_name, recipe, data, start, info.device)
    batch = options.global_batch(recipe.batch_size, info.world_size)
    return RunPlan(recipe, data_cfg, pick_augment(start.augment, info.device), annotates_online(recipe, start.teacher),
                   batch, recipe.optimization(batch))
