"""Token labeling for any timm model: a CNN (ResNet), an MLP-Mixer and timm's own ViT, as they are (no special
arguments): token logits at every position, the positions where the image puts them, targets cut for the same
positions, MixToken (a stride-aligned pixel box on a CNN), the inference rule, and the training tool."""
from __future__ import annotations

import json

import pytest
import timm
import torch
from timm.models.mlp_mixer import MlpMixer

from backbones.token_head import add_token_head, feature_grid, forward_token_labeling, predict_with_token_head
from classification.data.augment import CropGeometry
from classification.objectives.token_targets import TokenTargetBuilder
from classification.train import main
from helpers.commands import run_tool, succeeded
from helpers.training_runs import read_log

SIZE = (64, 96)  # non-square: a transposed grid cannot pass


def tiny(kind: str) -> tuple[torch.nn.Module, int]:
    """A tiny model of each kind with a token head, and the pixels per token of its grid."""
    torch.manual_seed(0)
    if kind == 'resnet':
        model = timm.create_model('resnet10t', num_classes=5)
    elif kind == 'mixer':
        model = MlpMixer(num_classes=5, img_size=SIZE, patch_size=16, num_blocks=2, embed_dim=32)
    else:
        model = timm.create_model('vit_tiny_patch16_224', img_size=SIZE, depth=2, num_classes=5)
    stride = 32 if kind == 'resnet' else 16
    return add_token_head(model).eval(), stride


KINDS = ('resnet', 'mixer', 'vit')


@pytest.mark.parametrize('kind', KINDS)
def test_token_logits_are_the_token_head_at_every_position(kind):
    model, stride = tiny(kind)
    x = torch.randn(2, 3, *SIZE)
    with torch.no_grad():
        out = forward_token_labeling(model, x, mix_token=0.0)
        features = model.forward_features(x)
    H, W = SIZE[0] // stride, SIZE[1] // stride
    assert out.token_logits.shape == (2, H, W, 5) and out.mix_box is None
    for i in range(H):
        for j in range(W):
            if kind == 'resnet':
                position = features[:, :, i, j]
            else:
                position = features[:, getattr(model, 'num_prefix_tokens', 0) + i * W + j]
            torch.testing.assert_close(out.token_logits[:, i, j], model.aux_head(position))
    torch.testing.assert_close(out.cls_logits, model(x))  # the class head is the model's own


def most_influential_cells(model: torch.nn.Module, x: torch.Tensor, stride: int) -> dict[tuple, tuple]:
    """For every token of the grid, the stride x stride image cell its logits depend on most (input gradients)."""
    x = x.clone().requires_grad_(True)
    out = forward_token_labeling(model, x, mix_token=0.0)
    H, W = out.token_logits.shape[1:3]
    found = {}
    for i in range(H):
        for j in range(W):
            grad, = torch.autograd.grad(out.token_logits[:, i, j].sum(), x, retain_graph=True)
            cells = grad.abs().sum(dim=(0, 1)).unfold(0, stride, stride).unfold(1, stride, stride).sum(dim=(-2, -1))
            found[(i, j)] = divmod(cells.argmax().item(), cells.shape[1])
    return found


@pytest.mark.parametrize('kind', KINDS)
def test_targets_line_up_with_the_image_cells_the_tokens_see(kind):
    """A known-answer map whose class is the column (and another whose class is the row): each token's target must
    be the class of the image cell that token's logits depend on most. A token grid transposed or mirrored against
    the targets fails."""
    model, stride = tiny(kind)
    seen = most_influential_cells(model, torch.randn(2, 3, *SIZE), stride)
    H, W = SIZE[0] // stride, SIZE[1] // stride
    assert set(seen) == {(i, j) for i in range(H) for j in range(W)}
    builder = TokenTargetBuilder(num_classes=max(H, W), smoothing=0.0)
    identity = CropGeometry(torch.tensor([[0.0, 0.0, 1.0, 1.0]]), torch.tensor([False]), torch.eye(3)[:2][None])
    for axis in (0, 1):  # the class of a map cell is its row, then its column
        index = torch.arange(H if axis == 0 else W).view(-1, 1) if axis == 0 else torch.arange(W).view(1, -1)
        classes = index.expand(H, W)[None, ..., None]
        _, targets = builder(torch.zeros(1, H, W, 1), classes, identity, (H, W))
        for (i, j), cell in seen.items():
            assert targets[0, i, j].argmax().item() == cell[axis], (kind, axis, (i, j), cell)


def test_cnn_mixtoken_takes_the_pixels_under_a_stride_aligned_box_from_the_flipped_batch():
    model, stride = tiny('resnet')
    x = torch.randn(4, 3, 128, 192)  # a 4 x 6 grid
    seen = []
    forward_features = model.forward_features
    model.forward_features = lambda images: (seen.append(images), forward_features(images))[1]
    boxes = []
    for seed in range(20):
        torch.manual_seed(seed)
        out = forward_token_labeling(model, x, mix_token=1.0)
        top, left, bottom, right = box = out.mix_box
        boxes.append(box)
        expected = x.clone()
        rows, cols = slice(top * stride, bottom * stride), slice(left * stride, right * stride)
        expected[:, :, rows, cols] = x.flip(0)[:, :, rows, cols]
        assert torch.equal(seen[-1], expected), box
        assert 0 <= top <= bottom <= 4 and 0 <= left <= right <= 6 and out.token_logits.shape[1:3] == (4, 6)
    assert sum(b[2] > b[0] and b[3] > b[1] for b in boxes) > 5  # most boxes cut something


@pytest.mark.parametrize('kind', KINDS)
def test_prediction_adds_half_the_classwise_token_maximum(kind):
    model, _ = tiny(kind)
    x = torch.randn(2, 3, *SIZE)
    with torch.no_grad():
        features = model.forward_features(x)
        tokens = feature_grid(model, features).flatten(1, 2) if kind == 'resnet' else \
            features[:, getattr(model, 'num_prefix_tokens', 0):]
        expected = model(x) + 0.5 * model.aux_head(tokens).max(dim=1).values
        torch.testing.assert_close(predict_with_token_head(model, x), expected)


@pytest.mark.parametrize('name, kwargs', [('resnet10t', []), ('vit_tiny_patch16_224', ['depth=2'])])
@pytest.mark.slow
def test_the_training_tool_trains_any_model_with_token_labeling(labeled_images, tmp_path, name, kwargs):
    """timm's CNN and timm's own ViT (no special arguments) train with the annotator's token labels and MixToken;
    the evaluation tool finds the token head and scores the checkpoint as validation did."""
    data, labels = labeled_images
    out = tmp_path / 'run'
    metrics = main([name, '--data-dir', str(data), '--token-label-dir', str(labels), '--token-labeling',
                    '--output', str(out), '--img-size', '64', '--batch-size', '4', '--lr-base-batch', '4',
                    '--epochs', '1', '--warmup-epochs', '0', '--workers', '0', '--device', 'cpu',
                    *(['--model-kwargs', *kwargs] if kwargs else [])])
    assert metrics['token_labeling']
    weights = torch.load(out / 'last.pth', weights_only=True)['state_dict']
    assert weights['aux_head.weight'].shape[0] == 3
    # the trained weights score what validation gave them; the EMA, which the checkpoint's model is, its own
    logged = read_log(out)[1]
    for weights, key in (['--trained-weights'], 'top1'), ([], 'ema_top1' if 'ema_top1' in logged else 'top1'):
        result = succeeded(run_tool('eval_cls.py', [name, '--checkpoint', out / 'last.pth', '--data-dir', data,
                                                    '--img-size', '64', '--workers', '0', '--json', tmp_path / 'e.json',
                                                    *weights, *(['--model-kwargs', *kwargs] if kwargs else [])]))
        assert result.returncode == 0
        assert json.loads((tmp_path / 'e.json').read_text())['top1'] == pytest.approx(logged[key]), key


@pytest.mark.slow
def test_a_size_the_mixer_patches_do_not_tile_is_refused(labeled_images, tmp_path):
    """MLP-Mixer's patch embedding is `stem`: at 48 px its one 32-px token would see the top-left corner while its
    target is cut from the whole crop. Refused, naming the patch size; 64 px (2x2 tokens) trains."""
    from backbones.common.errors import UsageError
    from classification.train import main
    data, labels = labeled_images
    args = ['mixer_s32_224', '--data-dir', str(data), '--token-label-dir', str(labels), '--token-labeling',
            '--batch-size', '4', '--epochs', '1', '--warmup-epochs', '0', '--workers', '0', '--device', 'cpu']
    with pytest.raises(UsageError, match='--img-size 48 does not fit mixer_s32_224: it needs a multiple of its 32 px'):
        main([*args, '--img-size', '48', '--output', str(tmp_path / 'a')])
    assert main([*args, '--img-size', '64', '--output', str(tmp_path / 'b')])['epochs'] == 1
