"""What an ImageNet-style run trains, built the one way every run and study builds it: the model, the teacher
(`--teacher`: DeiT's hard distillation, or with token labeling online annotation) and the recipe's objective."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch.nn as nn
from timm.data import Mixup

from backbones import load_checkpoint
from backbones.common.distributed import DistInfo
from backbones.common.errors import CheckpointError
from backbones.common.random_state import seed_all
from backbones.token_head import TOKEN_HEAD
from backbones.weights import pretrained_model
from classification.engine.checkpoints import check_checkpoint_classes
from classification.models import Teacher, build_eval_model, create_classifier, takes_input_size
from classification.objectives.objective import (
    ClassificationObjective,
    DistillationObjective,
    LabelObjective,
    LabelPoolingObjective,
    TokenLabelingObjective,
)
from classification.objectives.token_loss import TokenLabelingLoss
from classification.objectives.token_targets import TokenTargetBuilder
from classification.recipes import Recipe


@dataclass(frozen=True)
class TeacherSpec:
    """The classifier a distilled student learns from, and its weights (None: timm's pretrained)."""

    model: str
    checkpoint: str | None = None
    model_kwargs: dict = field(default_factory=dict)


def build_teacher(spec: TeacherSpec, num_classes: int, recipe: Recipe, data_cfg: dict, info: DistInfo) -> Teacher:
    """The teacher at the student's input size, on this process's device, read as eval_cls reads a checkpoint."""
    if spec.checkpoint is not None:
        model = build_eval_model(spec.model, spec.checkpoint, num_classes, recipe.img_size, False, spec.model_kwargs)
    else:
        kwargs = {'img_size': recipe.img_size} if takes_input_size(spec.model) else {}
        model = pretrained_model(spec.model, None, num_classes, **kwargs, **spec.model_kwargs)
    return Teacher(model, data_cfg['mean'], data_cfg['std']).to(info.device)


def make_objective(recipe: Recipe, num_classes: int, teacher: Teacher | None = None) -> ClassificationObjective:
    """The loss of the recipe; a `teacher` distils, or with token labeling annotates each batch (online)."""
    builder = TokenTargetBuilder(num_classes, recipe.smoothing) if recipe.uses_score_maps else None
    if recipe.token_labeling:
        loss = TokenLabelingLoss(recipe.dense_weight, recipe.token_participation)
        return TokenLabelingObjective(num_classes, recipe.smoothing, token_builder=builder, token_loss=loss,
                                      cls_target=recipe.cls_target, token_target=recipe.token_target,
                                      annotator=teacher)
    if recipe.label_pooling:
        return LabelPoolingObjective(num_classes, recipe.smoothing, token_builder=builder, cutmix_alpha=recipe.cutmix)
    mixup = None
    if recipe.mixup > 0 or recipe.cutmix > 0:
        mixup = Mixup(mixup_alpha=recipe.mixup, cutmix_alpha=recipe.cutmix, label_smoothing=recipe.smoothing,
                      num_classes=num_classes)
    if teacher is not None:
        return DistillationObjective(num_classes, recipe.smoothing, mixup, teacher)
    return LabelObjective(num_classes, recipe.smoothing, mixup)


def annotates_online(recipe: Recipe, teacher: TeacherSpec | None) -> bool:
    """Whether the run's `teacher` annotates each batch (online token labeling) rather than distils."""
    return teacher is not None and recipe.token_labeling


def training_pieces(model_name: str, recipe: Recipe, num_classes: int, seed: int, info: DistInfo,
                    teacher: TeacherSpec | None = None, data_cfg: dict | None = None,
                    model_kwargs: dict | None = None) -> tuple[nn.Module, ClassificationObjective]:
    """The model (initial weights drawn from `seed`) and objective of a run of `recipe`, with its `teacher`."""
    seed_all(seed)
    model = create_classifier(model_name, num_classes, recipe.img_size, recipe.token_labeling, recipe.mix_token,
                              distilled=teacher is not None and not annotates_online(recipe, teacher),
                              frozen=recipe.frozen, drop_path_rate=recipe.drop_path, **(model_kwargs or {}))
    teacher_model = build_teacher(teacher, num_classes, recipe, data_cfg, info) if teacher is not None else None
    return model, make_objective(recipe, num_classes, teacher_model)


def load_finetune_weights(model: nn.Module, path: str, classes: list[str], new_head: bool) -> str:
    """The --finetune weights; the checkpoint's classes (when it records them) must be the data's, or new_head."""
    if not new_head:
        check_checkpoint_classes(path, classes, 'the training split')
    report = load_checkpoint(model, path, strict=False, new_head=new_head)
    missing = [k for k in report.missing if not k.startswith(f'{TOKEN_HEAD}.')]  # a token head may be new
    if missing or report.mismatched:
        raise CheckpointError(f'{path} does not fit {type(model).__name__}: ' + report.summary())
    return report.summary()
