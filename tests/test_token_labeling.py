"""The token-labeling loss by hand, MixToken on tokens and targets with one mask, token heads on every family."""
import copy
import math

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import backbones
from backbones.token_head import (
    TokenLabelingModel,
    TokenLabelingOutput,
    add_token_head,
    forward_token_labeling,
    mix_box_lambda,
)
from classification.objectives.objective import LabelObjective
from classification.objectives.token_loss import TokenLabelingLoss, mix_targets, participating_tokens


def cross_entropy_by_hand(logits, target):
    log_z = math.log(sum(math.exp(v) for v in logits))
    return -sum(t * (v - log_z) for v, t in zip(logits, target))


def test_loss_equals_a_hand_computation_with_mixtoken():
    cls_logits = [[1.0, 0.0, -1.0], [0.5, 2.0, 1.0]]
    token_logits = [[[[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]]], [[[0.0, 0.0, 3.0], [1.0, 1.0, 0.0]]]]  # (2, 1, 2, 3)
    cls_target = [[0.8, 0.1, 0.1], [0.1, 0.8, 0.1]]
    token_target = [[[[0.6, 0.2, 0.2], [0.2, 0.6, 0.2]]], [[[0.2, 0.2, 0.6], [0.3, 0.3, 0.4]]]]
    box = (0, 1, 1, 2)  # the right token of each sample comes from the other sample; lambda = 1/2
    dense_weight = 0.5
    out = TokenLabelingOutput(torch.tensor(cls_logits), torch.tensor(token_logits), box)
    loss = TokenLabelingLoss(dense_weight)(out, torch.tensor(cls_target), torch.tensor(token_target))

    mixed_cls = [[0.5 * a + 0.5 * b for a, b in zip(cls_target[i], cls_target[1 - i])] for i in range(2)]
    mixed_tokens = [[token_target[i][0][0], token_target[1 - i][0][1]] for i in range(2)]
    cls_term = sum(cross_entropy_by_hand(cls_logits[i], mixed_cls[i]) for i in range(2)) / 2
    token_term = sum(cross_entropy_by_hand(token_logits[i][0][j], mixed_tokens[i][j])
                     for i in range(2) for j in range(2)) / 4
    assert loss.item() == pytest.approx(cls_term + dense_weight * token_term, rel=1e-6)


@pytest.mark.parametrize('rate', [0.2, 0.4, 0.6, 0.8])
def test_token_participation_draws_the_asked_fraction_of_each_images_tokens_uniformly(rate):
    torch.manual_seed(0)
    masks = torch.stack([participating_tokens(4, 49, rate) for _ in range(500)])  # (draws, B, N)
    assert (masks.sum(dim=-1) == round(rate * 49)).all()  # exactly that many in every image, every draw
    frequency = masks.float().mean(dim=(0, 1))  # each token's share of the 2,000 rows: about `rate`
    assert (frequency - round(rate * 49) / 49).abs().max() < 0.05
    assert participating_tokens(2, 9, 0.01).sum(dim=1).tolist() == [1, 1]  # never no token at all


def test_token_participation_averages_the_token_term_over_the_drawn_tokens_only():
    """The loss with 40% participation is the class term plus beta times the mean cross-entropy of the tokens the
    mask drawn from the same generator state picks, computed by hand; at 100% it is the plain loss."""
    g = torch.Generator().manual_seed(1)
    B, H, W, C = 3, 4, 5, 6
    out = TokenLabelingOutput(torch.randn(B, C, generator=g), torch.randn(B, H, W, C, generator=g), None)
    cls_target = torch.rand(B, C, generator=g).softmax(-1)
    token_target = torch.rand(B, H, W, C, generator=g).softmax(-1)
    torch.manual_seed(7)
    loss = TokenLabelingLoss(0.5, participation=0.4)(out, cls_target, token_target)
    torch.manual_seed(7)
    mask = participating_tokens(B, H * W, 0.4)
    logits, targets = out.token_logits.reshape(B, H * W, C).tolist(), token_target.reshape(B, H * W, C).tolist()
    picked = [(i, j) for i in range(B) for j in range(H * W) if mask[i, j]]
    token_term = sum(cross_entropy_by_hand(logits[i][j], targets[i][j]) for i, j in picked) / len(picked)
    cls_term = sum(cross_entropy_by_hand(out.cls_logits[i].tolist(), cls_target[i].tolist()) for i in range(B)) / B
    assert len(picked) == B * 8 and loss.item() == pytest.approx(cls_term + 0.5 * token_term, rel=1e-5)
    assert TokenLabelingLoss(0.5, participation=1.0)(out, cls_target, token_target).item() == pytest.approx(
        TokenLabelingLoss(0.5)(out, cls_target, token_target).item())


def test_mix_targets_lambda_is_the_clipped_box_fraction():
    cls = torch.eye(4)[:2]
    tokens = torch.arange(2 * 3 * 5, dtype=torch.float32).view(2, 3, 5, 1)
    box = (1, 2, 3, 5)
    mixed_cls, mixed_tokens = mix_targets(cls, tokens, box)
    lam = 1 - 2 * 3 / 15
    assert mix_box_lambda(box, (3, 5)) == pytest.approx(lam)
    torch.testing.assert_close(mixed_cls[0], lam * cls[0] + (1 - lam) * cls[1])
    torch.testing.assert_close(mixed_tokens[0, 1:3, 2:5], tokens[1, 1:3, 2:5])
    torch.testing.assert_close(mixed_tokens[0, 0], tokens[0, 0])


@pytest.mark.parametrize('name, kwargs', [
    ('lvvit_t', dict(img_size=64, embed_dim=32, num_heads=2, stem_chs=8)),
    ('deit_small_patch16_224', dict(embed_dim=32, num_heads=2)),
    ('t2t_vit_7', dict(img_size=64, embed_dim=32, num_heads=2, token_dim=8)),
    ('cait_xxs24_224', dict(img_size=64, embed_dim=32, num_heads=2, depth_token_only=0)),
])
def test_mixtoken_mixes_patch_tokens_with_the_box_it_reports(name, kwargs):
    """With no blocks each token's logits depend on its own patch only: inside the box they must be those of
    the flipped batch, outside the sample's own."""
    model = add_token_head(backbones.create_model(name, num_classes=5, depth=0, **kwargs)).eval()
    x = torch.randn(4, 3, 64, 64)
    plain = forward_token_labeling(model, x, mix_token=0.0)
    assert plain.mix_box is None and plain.token_logits.shape == (4, 4, 4, 5)
    torch.manual_seed(3)
    mixed = forward_token_labeling(model, x, mix_token=1.0)
    top, left, bottom, right = mixed.mix_box
    inside = torch.zeros(4, 4, dtype=torch.bool)
    inside[top:bottom, left:right] = True
    assert 0 < inside.sum() < 16
    torch.testing.assert_close(mixed.token_logits[:, inside], plain.token_logits.flip(0)[:, inside])
    torch.testing.assert_close(mixed.token_logits[:, ~inside], plain.token_logits[:, ~inside])


def test_inference_adds_half_the_classwise_token_maximum():
    model = backbones.create_model('deit_small_patch16_224', num_classes=7, embed_dim=32, depth=1, num_heads=2)
    wrapped = TokenLabelingModel(model).eval()
    x = torch.randn(2, 3, 48, 48)
    features = model.forward_features(x)
    expected = model.head(features[:, 0]) + 0.5 * model.aux_head(features[:, 1:]).amax(dim=1)
    torch.testing.assert_close(wrapped(x), expected)


def test_image_label_targets_are_one_hot_with_label_smoothing():
    """timm's mixup_target at lambda 1 is exactly the smoothed one-hot target the objective wants."""
    target = LabelObjective(4, smoothing=0.1).label_target(torch.tensor([2, 0, 3]))
    expected = torch.full((3, 4), 0.1 / 4)
    expected[[0, 1, 2], [2, 0, 3]] = 1 - 0.1 + 0.1 / 4
    torch.testing.assert_close(target, expected, rtol=0, atol=1e-7)
    assert torch.equal(LabelObjective(4, smoothing=0.0).label_target(torch.tensor([1])),
                       torch.tensor([[0.0, 1.0, 0.0, 0.0]]))


def test_compiled_mixtoken_draws_its_boxes_eagerly_into_one_graph():
    """A compiled LV-ViT with token labeling compiles once for every MixToken box (the box, drawn outside the graph,
    reaches it as a mask tensor; drawn inside, its Python numbers recompiled it: 5 recompiles in 9 calls), with the
    boxes and outputs of the eager model under the same seed."""
    eager = TokenLabelingModel(backbones.create_model('lvvit_t', img_size=64, depth=1, embed_dim=32, num_heads=2,
                                                      stem_chs=8, num_classes=5)).train()
    compiled, graphs = copy.deepcopy(eager), CompileCounter()
    compiled.compile(backend=graphs)
    x = torch.randn(4, 3, 64, 64)
    torch.manual_seed(0)
    expected = [eager(x) for _ in range(8)]
    torch.manual_seed(0)
    outputs, compiled_after = [], []
    for _ in range(8):
        outputs.append(compiled(x))
        compiled_after.append(graphs.frame_count)
    assert compiled_after == [1] * 8
    assert len({out.mix_box for out in outputs}) > 3  # the calls had boxes of several sizes and places
    for out, reference in zip(outputs, expected):
        assert out.mix_box == reference.mix_box
        torch.testing.assert_close(out.token_logits, reference.token_logits)
        torch.testing.assert_close(out.cls_logits, reference.cls_logits)
