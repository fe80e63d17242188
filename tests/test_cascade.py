"""Cascade Mask R-CNN (`TokenCascadeMaskRCNN`): each stage's matching and box coding, the chain of stages and the
mean of their scores at test time, a training step through every stage, and the tools on a tiny config."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from mmengine.config import Config

import backbones.dense  # noqa: F401  (registration)
from backbones.common.errors import UsageError
from backbones.dense.tasks import task_of
from helpers.commands import run_tool, succeeded
from helpers.dense_data import CATEGORIES, CONFIGS, config_model, write_tiny_coco, write_tiny_dense_config

CONFIG = 'cascade_maskrcnn_lvvit_s.py'
IMAGE = (64, 64)  # height, width of the inputs the model tests run on


def build(model: dict):
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    init_default_scope('mmseg')
    torch.manual_seed(0)
    return MODELS.build(model)


@pytest.fixture(scope='module')
def cascade():
    """A tiny cascade of the real config's three stages, for 3 categories."""
    return build(dict(config_model(CONFIG), num_classes=3))


@pytest.fixture(scope='module')
def coco_set(tmp_path_factory) -> Path:
    return write_tiny_coco(tmp_path_factory.mktemp('coco'))


def test_the_config_builds_vitdets_three_stages_under_the_detectors_prefix(cascade):
    stages = cascade.roi_heads.stages
    assert [(s.proposal_matcher.high_threshold, s.proposal_matcher.low_threshold) for s in stages] == \
        [(0.5, 0.5), (0.6, 0.6), (0.7, 0.7)]
    assert [s.box_coder.weights for s in stages] == [(10, 10, 5, 5), (20, 20, 10, 10), (30, 30, 15, 15)]
    assert all(s.box_predictor.bbox_pred.out_features == 4 for s in stages)  # class-agnostic
    assert all(s.box_predictor.cls_score.out_features == 4 for s in stages)  # 3 categories and the background
    heads = {name.split('.')[0] for name in cascade.state_dict() if not name.startswith(('backbone.', 'neck.', 'rpn.',
                                                                                       'data_preprocessor.'))}
    assert heads == {'roi_heads'}
    assert task_of(Config.fromfile(CONFIGS / CONFIG)).name == 'instances'


def test_settings_each_stage_takes_from_its_own_are_refused_in_roi_heads():
    with pytest.raises(UsageError, match='fg_iou_thresh'):
        build(dict(config_model(CONFIG), num_classes=3, roi_heads=dict(fg_iou_thresh=0.5)))
    with pytest.raises(UsageError, match='stage_ious'):
        build(dict(config_model(CONFIG), num_classes=3, stage_ious=(0.5, 0.6)))


def test_each_stage_labels_a_region_at_its_own_iou(cascade):
    """A region at IoU 0.65 with a ground-truth box is foreground for stages 1 and 2, background for stage 3; one at
    IoU 0.55, for stage 1 only."""
    truth = torch.tensor([[0.0, 0.0, 20.0, 20.0]])
    regions = torch.tensor([[0.0, 0.0, 20.0, 13.0], [0.0, 0.0, 20.0, 11.0]])  # IoU 260 / 400, 220 / 400
    labels = [stage.assign_targets_to_proposals([regions], [truth], [torch.tensor([2])])[1][0].tolist()
              for stage in cascade.roi_heads.stages]
    assert labels == [[2, 2], [2, 0], [0, 0]]


def test_each_stage_encodes_with_its_own_weights_and_decodes_back(cascade):
    """A box one tenth of its width to the right of its region is a dx of weight x 0.1 (1, 2, 3 for the three
    stages); a class-agnostic delta decodes back to the box it encodes."""
    region, truth = torch.tensor([[0.0, 0.0, 10.0, 10.0]]), torch.tensor([[1.0, 0.0, 11.0, 10.0]])
    rng = np.random.default_rng(0)
    corners = torch.from_numpy(np.sort(rng.uniform(0, 60, (20, 2, 2)), axis=1).reshape(20, 4)).float()
    regions = corners + torch.from_numpy(rng.uniform(-3, 3, (20, 4))).float()
    for dx, stage in zip((1.0, 2.0, 3.0), cascade.roi_heads.stages):
        torch.testing.assert_close(stage.box_coder.encode([truth], [region])[0], torch.tensor([[dx, 0, 0, 0]]))
        deltas = stage.box_coder.encode([corners], [regions])[0]
        assert deltas.shape == (20, 4)
        torch.testing.assert_close(stage.box_coder.decode(deltas, [regions]), corners[:, None], atol=1e-4, rtol=0)


def fixed_stage(stage, class_biases: list[float], box_bias: list[float]) -> None:
    """A stage whose predictor gives the same logits and deltas whatever the region."""
    with torch.no_grad():
        for layer, bias in ((stage.box_predictor.cls_score, class_biases), (stage.box_predictor.bbox_pred, box_bias)):
            layer.weight.zero_()
            layer.bias.copy_(torch.tensor(bias))


def test_inference_averages_the_stages_probabilities_on_the_last_stages_boxes():
    """Stages with fixed logits and deltas on one region (10, 10) .. (30, 30): each category's score is the mean of
    the three stages' softmax probabilities (by hand), and its box the region moved by stage 1's dx (1 of weight
    10: 2 px) and stage 3's (3 of weight 30: 2 px), decoded each on the boxes of the stage before."""
    model = build(dict(config_model(CONFIG), num_classes=3)).eval()
    biases = [[0.0, 1.0, 2.0, 0.5], [0.0, 0.2, 3.0, 1.0], [1.0, 0.0, 0.5, 2.0]]
    for stage, classes, box in zip(model.roi_heads.stages, biases, ([1.0, 0, 0, 0], [0.0] * 4, [3.0, 0, 0, 0])):
        fixed_stage(stage, classes, box)
    with torch.no_grad():
        features = model.extract_feat(torch.zeros(1, 3, *IMAGE))
        found, _ = model.roi_heads(features, [torch.tensor([[10.0, 10.0, 30.0, 30.0]])], [IMAGE])
    exps = np.exp(np.array(biases))
    mean = (exps / exps.sum(1, keepdims=True)).mean(0)[1:]  # categories 1 .. 3 (0: background)
    order = np.argsort(-mean)
    assert found[0]['labels'].tolist() == [int(i) + 1 for i in order]
    np.testing.assert_allclose(found[0]['scores'].numpy(), mean[order], rtol=1e-5)
    torch.testing.assert_close(found[0]['boxes'], torch.tensor([[14.0, 10.0, 34.0, 30.0]] * 3))
    assert found[0]['masks'].shape[:2] == (3, 1)


def test_in_training_a_later_stage_samples_the_refined_boxes_of_the_one_before_and_the_ground_truth():
    """Stage 1 samples the proposal (0, 0) .. (40, 40) and the ground truth (10, 10) .. (30, 30), and moves both by
    its dx of 1 (weight 10: a tenth of their widths, 4 and 2 px); stage 2 takes those two boxes, detached, and adds
    the ground truth."""
    model = build(dict(config_model(CONFIG), num_classes=3)).train()
    fixed_stage(model.roi_heads.stages[0], [0.0] * 4, [1.0, 0, 0, 0])
    second = model.roi_heads.stages[1]
    given, sampled = [], []
    sample = second.select_training_samples

    def recorded(proposals, targets):
        given.extend(proposals)
        found = sample(proposals, targets)
        sampled.extend(found[0])
        return found

    second.select_training_samples = recorded
    truth = torch.tensor([[10.0, 10.0, 30.0, 30.0]])
    masks = torch.zeros(1, *IMAGE, dtype=torch.uint8)
    masks[0, 10:30, 10:30] = 1
    features = model.extract_feat(torch.zeros(1, 3, *IMAGE))
    model.roi_heads(features, [torch.tensor([[0.0, 0.0, 40.0, 40.0]])], [IMAGE],
                    [dict(boxes=truth, labels=torch.tensor([1]), masks=masks)])
    torch.testing.assert_close(given[0], torch.tensor([[4.0, 0.0, 44.0, 40.0], [12.0, 10.0, 32.0, 30.0]]))
    assert not given[0].requires_grad
    torch.testing.assert_close(sampled[0], torch.cat([given[0], truth]))  # 3 regions: all sampled, in order


def test_each_stages_head_gets_one_third_of_the_gradient_it_would_alone(cascade):
    """detectron2's scaling: the gradient a stage's head sends into the pyramid is 1 / 3 of the same head's own."""
    with torch.no_grad():
        features = {name: level.requires_grad_() for name, level in
                    cascade.extract_feat(torch.randn(1, 3, *IMAGE)).items()}
    regions = [torch.tensor([[4.0, 4.0, 40.0, 30.0], [10.0, 20.0, 60.0, 60.0]])]
    stage = cascade.roi_heads.stages[1]
    gradients = []
    for run in (lambda: cascade.roi_heads.run_stage(stage, features, regions, [IMAGE]),
                lambda: stage.box_predictor(stage.box_head(stage.box_roi_pool(features, regions, [IMAGE])))):
        logits, deltas = run()
        grads = torch.autograd.grad(logits.sum() + deltas.sum(), list(features.values()), allow_unused=True,
                                    materialize_grads=True)  # the RPN's stride-64 level pools no region
        gradients.append(torch.cat([g.flatten() for g in grads]))
    assert gradients[1].abs().sum() > 0
    torch.testing.assert_close(gradients[0], gradients[1] / 3)


def test_a_training_step_gives_every_stage_a_finite_loss_and_its_head_gradients(coco_set, tmp_path):
    """Two images through the config's real pipeline: each stage's classification and box losses and the mask loss
    finite, and every weight of every stage's head and of the mask head gets a gradient."""
    from mmengine.dataset import pseudo_collate
    from mmseg.registry import DATASETS
    cfg = Config.fromfile(write_tiny_dense_config(tmp_path / 'tiny.py', CONFIG, coco_set))
    model = build(dict(cfg.model, num_classes=len(CATEGORIES))).train()
    dataset = DATASETS.build(cfg.train_dataloader.dataset)
    losses = model(**model.data_preprocessor(pseudo_collate([dataset[0], dataset[1]]), True), mode='loss')
    assert sorted(losses) == sorted(['loss_mask', 'loss_objectness', 'loss_rpn_box_reg'] +
                                    [f'{k}_stage{n}' for k in ('loss_classifier', 'loss_box_reg') for n in (1, 2, 3)])
    assert all(torch.isfinite(value) for value in losses.values()), losses
    total, _ = model.parse_losses(losses)
    total.backward()
    heads = [(n, p) for n, p in model.named_parameters() if n.startswith('roi_heads.')]
    assert {n.split('.')[2] for n, _ in heads if n.startswith('roi_heads.stages.')} == {'0', '1', '2'}
    missing = [n for n, p in heads if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing[:5]


@pytest.mark.slow  # tools run end to end
def test_train_and_test_seg_run_a_cascade_as_a_detector(coco_set, tmp_path):
    """train_seg trains a tiny cascade config on a COCO-format set; test_seg reports its box and mask AP by category
    and writes its detections with the set's own ids."""
    config = write_tiny_dense_config(tmp_path / 'tiny.py', CONFIG, coco_set)
    succeeded(run_tool('train_seg.py', [config, '--work-dir', tmp_path / 'work', '--iters', '2']))
    checkpoint = tmp_path / 'work' / 'iter_2.pth'
    assert any(k.startswith('roi_heads.stages.2.') for k in torch.load(checkpoint, weights_only=False)['state_dict'])
    out, preds = tmp_path / 'ap.json', tmp_path / 'preds'
    tested = succeeded(run_tool('test_seg.py', [config, checkpoint, '--out', out, '--pred-dir', preds]))
    assert 'box_AP' in tested.stdout + tested.stderr
    report = json.loads(out.read_text())
    assert list(report['per_class']) == list(CATEGORIES.values()) and report['images'] == 3
    assert {'box_AP', 'mask_AP'} <= set(report)
    detections = json.loads((preds / 'predictions.json').read_text())
    assert {d['category_id'] for d in detections} <= set(CATEGORIES)
