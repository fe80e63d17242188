"""DeiT's hard distillation: a distillation token and head for ViT/DeiT, CaiT and T2T-ViT, a frozen teacher whose class
the head learns, half-and-half loss, the mean of the two heads at inference, and the training tool with --teacher.
(The official DeiT distilled checkpoints' outputs: test_equivalence.)"""
from __future__ import annotations

import json

import pytest
import timm
import torch
import torch.nn.functional as F

import backbones
from backbones import bare_model
from backbones.common.distributed import DistInfo
from backbones.common.errors import CheckpointError, UsageError
from backbones.vit import DISTILLED_TWINS
from classification.models import Teacher, create_classifier
from classification.objectives.objective import DistillationObjective
from classification.recipes import Recipe
from classification.train import main
from classification.training_pieces import TeacherSpec, build_teacher
from helpers.commands import run_tool, succeeded
from helpers.models import TINY_DEIT
from helpers.training_runs import read_log

TINY = {
    't2t_vit': ('t2t_vit_7', dict(embed_dim=32, depth=2, num_heads=2, token_dim=8)),
    'cait': ('cait_xxs24_224', dict(embed_dim=32, depth=2, num_heads=2)),
    'vit': ('deit_small_patch16_224', dict(embed_dim=32, depth=2, num_heads=2)),
    'lvvit': ('lvvit_t', dict(embed_dim=32, depth=2, num_heads=2, token_head=False)),  # the paper's online KD row
}


@pytest.mark.parametrize('family', list(TINY))
def test_distilled_models_train_two_heads_and_predict_their_mean(family):
    name, kwargs = TINY[family]
    model = backbones.create_model(name, img_size=64, num_classes=5, distilled=True, **kwargs)
    state = model.state_dict()
    assert {'dist_token', 'head_dist.weight', 'head_dist.bias'} <= set(state)
    x = torch.randn(3, 3, 64, 64)
    model.eval()
    with torch.no_grad():
        tokens = model.forward_features(x)
        cls_logits, dist_logits = model.head(tokens[:, 0]), model.head_dist(tokens[:, 1])
        torch.testing.assert_close(model(x), (cls_logits + dist_logits) / 2)
    model.train()
    model.set_distilled_training(True)
    for module in model.modules():  # the same computation as in eval mode: no dropout, drop-path 0, BN statistics
        module.train(False) if isinstance(module, (torch.nn.Dropout, torch.nn.BatchNorm2d)) else None
    outputs = model(x)
    assert isinstance(outputs, tuple) and [o.shape for o in outputs] == [(3, 5), (3, 5)]
    torch.testing.assert_close(outputs[0], cls_logits)
    torch.testing.assert_close(outputs[1], dist_logits)


@pytest.mark.parametrize('name', ['deit_tiny_patch16_224', 'deit_small_patch16_224', 'deit_base_patch16_224',
                                  'deit_base_patch16_384', 'vit_base_patch16_224'])
def test_every_deit_size_is_a_student_with_its_twins_architecture(name):
    """Each DeiT the README names (deit_*) takes a distillation token: the student is its distilled twin, every
    weight of the same shape."""
    student = create_classifier(name, num_classes=3, distilled=True, img_size=32)
    twin = timm.create_model(DISTILLED_TWINS[name], num_classes=3, img_size=32)
    assert type(student) is type(twin) and 'dist_token' in student.state_dict()
    assert {k: v.shape for k, v in student.state_dict().items()} == {k: v.shape for k, v in twin.state_dict().items()}


def test_cait_class_token_does_not_see_the_distillation_token():
    """In CaiT's class-attention stage each prefix token attends to itself and the patches only: adding a
    distillation token leaves the class token's path (and logits) as they were."""
    name, kwargs = TINY['cait']
    plain = backbones.create_model(name, img_size=64, num_classes=5, **kwargs).eval()
    distilled = backbones.create_model(name, img_size=64, num_classes=5, distilled=True, **kwargs).eval()
    missing, unexpected = distilled.load_state_dict(plain.state_dict(), strict=False)
    assert sorted(missing) == ['dist_token', 'head_dist.bias', 'head_dist.weight'] and not unexpected
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(distilled.head(distilled.forward_features(x)[:, 0]), plain(x))


def test_the_teacher_is_frozen_and_sees_its_own_normalisation():
    torch.manual_seed(0)
    model = timm.create_model('resnet10t', num_classes=4)
    teacher = Teacher(model, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)).train()
    assert not teacher.training and not model.training and not any(p.requires_grad for p in teacher.parameters())
    x = torch.randn(3, 3, 32, 32)  # normalised with the student's mean and std
    pixels = x * 0.25 + 0.5
    cfg = model.pretrained_cfg
    own = (pixels - torch.tensor(cfg['mean']).view(1, 3, 1, 1)) / torch.tensor(cfg['std']).view(1, 3, 1, 1)
    with torch.no_grad():
        assert torch.equal(teacher(x), model(own).argmax(dim=1))


def test_the_loss_is_half_the_label_term_and_half_the_teachers_class():
    teacher = Teacher(timm.create_model('resnet10t', num_classes=4), (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    objective = DistillationObjective(4, smoothing=0.1, teacher=teacher)
    images, labels = torch.randn(3, 3, 32, 32), torch.tensor([0, 3, 1])
    images_out, targets = objective.prepare(images, labels)
    assert torch.equal(images_out, images) and torch.equal(targets.teacher, teacher(images))
    cls_logits, dist_logits = torch.randn(3, 4), torch.randn(3, 4)
    loss = objective.loss((cls_logits, dist_logits), {'label': labels}, targets, torch.device('cpu'))
    smoothed = F.one_hot(labels, 4) * 0.9 + 0.1 / 4
    expected = 0.5 * -(smoothed * cls_logits.log_softmax(1)).sum(1).mean() \
        + 0.5 * F.cross_entropy(dist_logits, targets.teacher)
    torch.testing.assert_close(loss, expected)


@pytest.fixture(scope='module')
def teacher_checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp('teacher') / 'resnet10t.pth'
    torch.save(timm.create_model('resnet10t', num_classes=3).state_dict(), path)
    return path


def distill_args(data, output, teacher_checkpoint, *extra):
    return [*TINY_DEIT, '--data-dir', str(data), '--output', str(output), '--img-size', '32', '--batch-size', '4',
            '--lr-base-batch', '4', '--epochs', '1', '--warmup-epochs', '0', '--workers', '0', '--device', 'cpu',
            '--teacher', 'resnet10t', '--teacher-checkpoint', str(teacher_checkpoint), *extra]


@pytest.mark.slow
def test_training_with_a_teacher_and_evaluating_the_distilled_student(labeled_images, teacher_checkpoint, tmp_path):
    data, _ = labeled_images
    out = tmp_path / 'run'
    metrics = main(distill_args(data, out, teacher_checkpoint))
    assert metrics['teacher'] == 'resnet10t' and not metrics['token_labeling']
    checkpoint = torch.load(out / 'last.pth', weights_only=True)
    assert checkpoint['state_dict']['head_dist.weight'].shape == (3, 32) and 'dist_token' in checkpoint['state_dict']
    assert checkpoint['args']['teacher'] == {'model': 'resnet10t', 'checkpoint': str(teacher_checkpoint),
                                             'model_kwargs': {}}
    succeeded(run_tool('eval_cls.py', [*TINY_DEIT, '--checkpoint', out / 'last.pth', '--data-dir', data,
                                       '--img-size', '32', '--workers', '0', '--json', tmp_path / 'e.json']))
    assert json.loads((tmp_path / 'e.json').read_text())['top1'] == pytest.approx(read_log(out)[1]['top1'])


@pytest.mark.parametrize('name, token_labeling', [('lvvit_t', False), ('lvvit_t', True),
                                                   ('deit_tiny_patch16_224', True)])
def test_a_classifier_trained_with_or_without_token_labeling_teaches(name, token_labeling, tmp_path):
    """A teacher checkpoint is read as eval_cls reads it: an LV-ViT trained without token labeling (no token head)
    and any model trained with it (a token head) teach their eval-mode class."""
    torch.manual_seed(0)
    trained = create_classifier(name, num_classes=3, img_size=32, token_labeling=token_labeling).eval()
    torch.save({'state_dict': bare_model(trained).state_dict()}, tmp_path / 'teacher.pth')
    teacher = build_teacher(TeacherSpec(name, str(tmp_path / 'teacher.pth')), 3, Recipe(img_size=32),
                            {'mean': (0.5,) * 3, 'std': (0.5,) * 3}, DistInfo())
    x = torch.randn(4, 3, 32, 32)
    own = bare_model(trained).pretrained_cfg
    renormalised = (x * 0.5 + 0.5 - torch.tensor(own['mean']).view(1, 3, 1, 1)) / torch.tensor(own['std']).view(
        1, 3, 1, 1)
    with torch.no_grad():
        assert torch.equal(teacher(x), trained(renormalised).argmax(-1))


def test_distillation_refusals_name_the_problem(labeled_images, teacher_checkpoint, tmp_path):
    data, labels = labeled_images
    with pytest.raises(UsageError, match='does not go with label pooling'):
        main(distill_args(data, tmp_path / 'a', teacher_checkpoint, '--preset', 'relabel', '--token-label-dir',
                          str(labels)))
    resnet = ['resnet10t', *distill_args(data, tmp_path / 'b', teacher_checkpoint)[len(TINY_DEIT):]]
    with pytest.raises(UsageError, match='distillation takes a cait/lvvit/t2t_vit/vit model without token labeling, '
                                         'not resnet10t'):
        main(resnet)
    with pytest.raises(UsageError, match="--teacher-kwargs takes key=value, got 'output_stride'"):
        main(distill_args(data, tmp_path / 'e', teacher_checkpoint, '--teacher-kwargs', 'output_stride'))
    with pytest.raises(UsageError, match='--teacher-checkpoint and --teacher-kwargs go with --teacher'):
        main([*TINY_DEIT, '--data-dir', str(data), '--output', str(tmp_path / 'c'), '--teacher-checkpoint', 'x.pth'])
    with pytest.raises(ValueError, match='distillation token .* or a token head'):
        backbones.create_model('lvvit_t', distilled=True, token_head=True)
    torch.save(timm.create_model('resnet10t', num_classes=5).state_dict(), tmp_path / 'five.pth')
    with pytest.raises(CheckpointError, match='has 5 classes, the model 3'):
        main(distill_args(data, tmp_path / 'd', tmp_path / 'five.pth'))
