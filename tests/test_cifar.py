"""CIFAR transfer, part 1: the data format, the held-out split and statistics, the input pipeline, the model set-up
(official checkpoints of every family, fresh heads, every parameter in the optimizer), the token-head objective."""
from __future__ import annotations

import io
import os
import pickle
import tarfile

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from backbones import CheckpointError, bare_model
from backbones.common.errors import UsageError
from backbones.registry import model_family
from classification.data.cifar import CifarFormatError, CifarInput, channel_stats, hold_out, read_cifar
from classification.engine.trainer import optimization_state
from classification.objectives.objective import TokenLabelingObjective
from classification.objectives.token_loss import TokenLabelingLoss
from classification.recipes import TransferRecipe, transfer_recipe
from classification.transfer import build_transfer_model, transfer_param_groups
from helpers.cifar_data import class_images, tiny_cifar, write_cifar
from helpers.models import FAMILIES, tiny_release


def transfer_optimizer(model: torch.nn.Module, recipe: TransferRecipe) -> torch.optim.Optimizer:
    """The optimizer the transfer tool builds, at the recipe's own batch."""
    optimization = recipe.optimization(recipe.lr_base_batch)
    params = transfer_param_groups(model, optimization.lr, recipe.backbone_lr_scale, optimization.weight_decay,
                                   recipe.layer_decay)
    return optimization_state(model, params, optimization, updates_per_epoch=1, amp='none')[0].optimizer

@pytest.mark.parametrize('dataset', ['cifar10', 'cifar100'])
@pytest.mark.parametrize('archive', [True, False], ids=['tar.gz', 'extracted'])
def test_images_decode_to_their_pixels_and_labels_to_their_classes(dataset, archive, tmp_path):
    root, splits = tiny_cifar(tmp_path, dataset, per_class_train=2, per_class_test=1, archive=archive,
                              num_classes=7)
    known = np.zeros((32, 32, 3), np.uint8)  # a known image: red rises along x, green along y, blue constant
    known[..., 0] = np.arange(32)[None, :] * 8
    known[..., 1] = np.arange(32)[:, None] * 4
    known[..., 2] = 200
    images, labels = splits['test']
    images[3] = known
    write_cifar(root, dataset, splits, archive)

    data = read_cifar(root, dataset)
    assert data.test.images.shape == (7, 3, 32, 32) and data.train.images.shape == (14, 3, 32, 32)
    decoded = data.test.images[3]
    assert decoded[0, 5, 9] == 9 * 8 and decoded[1, 5, 9] == 5 * 4 and decoded[2, 5, 9] == 200  # R, G, B at y=5, x=9
    np.testing.assert_array_equal(data.train.images.transpose(0, 2, 3, 1), splits['train'][0])
    np.testing.assert_array_equal(data.test.labels, labels)  # CIFAR-100: the fine labels, not the coarse ones
    np.testing.assert_array_equal(data.train.labels, splits['train'][1])
    assert len(data.classes) == (10 if dataset == 'cifar10' else 100) and data.classes[4] == 'class_4'


def test_the_extracted_folder_itself_can_be_given(tmp_path):
    root, splits = tiny_cifar(tmp_path, 'cifar10', 1, 1, archive=False)
    data = read_cifar(root / 'cifar-10-batches-py', 'cifar10')
    np.testing.assert_array_equal(data.test.labels, splits['test'][1])


def test_missing_and_broken_data_is_named(tmp_path):
    with pytest.raises(CifarFormatError, match='cifar-10-python.tar.gz') as info:
        read_cifar(tmp_path, 'cifar10')
    assert 'cifar-10-batches-py' in str(info.value)

    tiny_cifar(tmp_path / 'c100', 'cifar100', 1, 1, archive=False)
    with pytest.raises(CifarFormatError, match='--dataset cifar100'):
        read_cifar(tmp_path / 'c100', 'cifar10')

    root, _ = tiny_cifar(tmp_path / 'gap', 'cifar10', 1, 1, archive=False)
    (root / 'cifar-10-batches-py' / 'data_batch_3').unlink()
    (root / 'cifar-10-batches-py' / 'test_batch').unlink()
    with pytest.raises(CifarFormatError, match='lacks data_batch_3, test_batch'):
        read_cifar(root, 'cifar10')

    root, _ = tiny_cifar(tmp_path / 'torn', 'cifar100', 1, 1, archive=False)
    train = root / 'cifar-100-python' / 'train'
    train.write_bytes(train.read_bytes()[:200])
    with pytest.raises(CifarFormatError, match='cifar-100-python/train: not a readable CIFAR pickle'):
        read_cifar(root, 'cifar100')

    archive = tmp_path / 'bad' / 'cifar-10-python.tar.gz'
    archive.parent.mkdir()
    archive.write_bytes(b'not gzip at all')
    with pytest.raises(CifarFormatError, match='not a readable tar.gz'):
        read_cifar(archive.parent, 'cifar10')


class _Payload:
    def __reduce__(self):
        return (os.system, ('echo pwned > /dev/null',))


def test_a_pickle_that_would_run_code_is_refused(tmp_path):
    root, _ = tiny_cifar(tmp_path, 'cifar10', 1, 1, archive=True)
    archive = root / 'cifar-10-python.tar.gz'
    with tarfile.open(archive) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    members['cifar-10-batches-py/test_batch'] = pickle.dumps({b'data': _Payload()}, protocol=2)
    with tarfile.open(archive, 'w:gz') as tar:
        for name, raw in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    with pytest.raises(CifarFormatError, match=r'test_batch: .*refusing to build posix.system'):
        read_cifar(root, 'cifar10')


def test_bad_contents_are_named(tmp_path):
    labels = np.arange(10)
    splits = {'train': (class_images(labels, 0), labels), 'test': (class_images(labels, 1), labels)}
    root = write_cifar(tmp_path, 'cifar10', splits, archive=False)
    batch = root / 'cifar-10-batches-py' / 'data_batch_2'
    batch.write_bytes(pickle.dumps({b'data': np.zeros((2, 3072), np.uint8), b'labels': [0, 10]}, protocol=2))
    with pytest.raises(CifarFormatError, match='data_batch_2: labels outside 0..9'):
        read_cifar(root, 'cifar10')
    batch.write_bytes(pickle.dumps({b'data': np.zeros((2, 1024), np.uint8), b'labels': [0, 1]}, protocol=2))
    with pytest.raises(CifarFormatError, match=r'data_batch_2: data is uint8 \(2, 1024\)'):
        read_cifar(root, 'cifar10')


def test_held_out_split_is_stratified_disjoint_and_seeded():
    labels = np.repeat(np.arange(4), [10, 20, 30, 40])
    train, val = hold_out(labels, 0.1, seed=3)
    assert np.intersect1d(train, val).size == 0 and np.union1d(train, val).size == 100
    assert np.bincount(labels[val]).tolist() == [1, 2, 3, 4]
    again, _ = hold_out(labels, 0.1, seed=3)
    other, _ = hold_out(labels, 0.1, seed=4)
    assert np.array_equal(train, again) and not np.array_equal(train, other)
    with pytest.raises(ValueError, match='fraction'):
        hold_out(labels, 0.0)


def test_channel_stats_are_those_of_the_images():
    images = np.random.default_rng(0).integers(0, 256, (50, 3, 32, 32), dtype=np.uint8)
    mean, std = channel_stats(images)
    as_float = images.astype(np.float64) / 255
    np.testing.assert_allclose(mean, as_float.mean(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(std, as_float.std(axis=(0, 2, 3)), rtol=1e-10)


@pytest.mark.parametrize('size', [224, 48, 20])
def test_eval_input_is_interpolate_then_normalise(size):
    images = torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)
    mean, std = torch.tensor([0.4, 0.5, 0.6]).view(1, 3, 1, 1), torch.tensor([0.2, 0.25, 0.3]).view(1, 3, 1, 1)
    expected = (F.interpolate(images.float() / 255, size=(size, size), mode='bilinear', align_corners=False)
                - mean) / std
    out = CifarInput(size, mean.flatten().tolist(), std.flatten().tolist(), train=False)(images)
    torch.testing.assert_close(out, expected, atol=5e-5, rtol=0)


def test_eval_input_matches_the_reference_pil_resize():
    images = np.random.default_rng(1).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    out = CifarInput(48, mean, std, train=False)(torch.from_numpy(images).permute(0, 3, 1, 2))
    for i, img in enumerate(images):  # the reference pipeline's PIL resize, up to its rounding to whole levels
        pil = np.asarray(Image.fromarray(img).resize((48, 48), Image.BILINEAR), np.float32) / 255
        expected = (torch.from_numpy(pil).permute(2, 0, 1) - torch.tensor(mean).view(3, 1, 1)) \
            / torch.tensor(std).view(3, 1, 1)
        diff = (out[i] - expected) * torch.tensor(std).view(3, 1, 1) * 255
        assert diff.abs().max() <= 1.01


def test_train_input_is_a_padded_crop_of_the_upsampled_image_maybe_flipped():
    images = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    train = CifarInput(40, (0.5,) * 3, (0.25,) * 3, train=True)  # padding 40 // 8 = 5
    plain = CifarInput(40, (0.5,) * 3, (0.25,) * 3, train=False)(images)
    out = train(images)
    background = (0 - 0.5) / 0.25  # zero padding, normalised
    padded = F.pad(plain, (5, 5, 5, 5), value=background)
    flips = shifts = 0
    for i in range(16):
        candidates = [(dy, dx, flip) for dy in range(11) for dx in range(11) for flip in (False, True)
                      if torch.allclose(out[i], (lambda c: c.flip(-1) if flip else c)(
                          padded[i, :, dy:dy + 40, dx:dx + 40]), atol=1e-5)]
        assert candidates, f'sample {i} is no padded crop of its image'
        flips += candidates[0][2]
        shifts += candidates[0][:2] != (5, 5)
    assert 0 < flips < 16 and shifts > 8  # both flips occur; most crops are shifted


@pytest.mark.parametrize('name', list(FAMILIES))
def test_official_checkpoint_loads_with_no_missing_backbone_key_and_a_fresh_head(name, tmp_path):
    source, path = tiny_release(name, tmp_path)
    kwargs = FAMILIES[name][0]
    model, report = build_transfer_model(name, 10, 32, TransferRecipe(), str(path), model_kwargs=kwargs)
    assert not report.missing and not report.unexpected and not report.mismatched
    assert report.resized == ['pos_embed']  # 4x4 grid at 64 px -> 2x2 at 32 px
    assert {k.split('.')[0] for k in report.dropped_classifier} == ({'head', 'aux_head'} if name == 'lvvit_s'
                                                                     else {'head'})
    assert model.head.weight.shape == (10, kwargs['embed_dim']) and model.num_classes == 10
    assert getattr(model, 'aux_head', None) is None  # a token head is dropped by default
    mine, theirs = model.state_dict(), source.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine if not k.startswith(('head.', 'pos_embed')))


def test_token_head_kept_for_image_labels_is_fresh_too(tmp_path):
    source, path = tiny_release('lvvit_s', tmp_path)
    recipe = TransferRecipe(token_labeling=True)
    model, report = build_transfer_model('lvvit_s', 10, 32, recipe, str(path), model_kwargs=FAMILIES['lvvit_s'][0])
    assert bare_model(model).aux_head.weight.shape == (10, 48) and not report.missing
    _, path = tiny_release('t2t_vit_14', tmp_path)  # a family without a token head of its own gets one
    model, report = build_transfer_model('t2t_vit_14', 10, 32, recipe, str(path),
                                         model_kwargs=FAMILIES['t2t_vit_14'][0])
    assert bare_model(model).aux_head.weight.shape == (10, 64) and not report.missing


def test_checkpoint_of_another_family_is_refused(tmp_path):
    _, path = tiny_release('t2t_vit_14', tmp_path)
    with pytest.raises(CheckpointError, match='holds a t2t_vit model, not lvvit_s'):
        build_transfer_model('lvvit_s', 10, 32, TransferRecipe(), str(path), model_kwargs=FAMILIES['lvvit_s'][0])


@pytest.mark.parametrize('name', list(FAMILIES))
def test_every_parameter_is_optimised_and_changes_in_one_step(name):
    """The reference tool left the class token and the final norm out of its optimizer; here every trainable
    parameter is in exactly one group (classifier at lr, the rest at 0.01 lr) and moves in one SGD step."""
    recipe = TransferRecipe(drop_path=0.0)
    model, _ = build_transfer_model(name, 10, 32, recipe, model_kwargs=FAMILIES[name][0])
    optimizer = transfer_optimizer(model, recipe)
    trainable = {id(p): n for n, p in model.named_parameters() if p.requires_grad}
    grouped = [id(p) for group in optimizer.param_groups for p in group['params']]
    assert sorted(grouped) == sorted(trainable)
    for group in optimizer.param_groups:
        names = [trainable[id(p)] for p in group['params']]
        is_head = all(n.startswith('head.') for n in names)
        assert is_head or not any(n.startswith('head.') for n in names)
        assert group['lr'] == pytest.approx(0.05 if is_head else 0.0005)
        assert group['nesterov'] is False and group['momentum'] == 0.9
        decays = all(p.ndim > 1 and trainable[id(p)] not in ('cls_token', 'pos_embed') for p in group['params'])
        assert group['weight_decay'] == (5e-4 if decays else 0.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.train()
    loss = F.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    optimizer.step()
    assert not [n for n, p in model.named_parameters() if p.requires_grad and not p.grad.abs().sum() > 0]
    for group in optimizer.param_groups:  # SGD's first step: p - lr * (grad + wd * p), momentum buffer empty
        for param in group['params']:
            old = before[trainable[id(param)]]
            expected = old - group['lr'] * (param.grad + group['weight_decay'] * old)
            torch.testing.assert_close(param.detach(), expected, rtol=0, atol=1e-7)
    assert {'cls_token', 'norm.weight', 'norm.bias'} <= set(trainable.values())
    if model_family(name) == 't2t_vit':
        assert not model.pos_embed.requires_grad  # the sinusoidal table stays fixed by design


@pytest.mark.parametrize('name', list(FAMILIES))
def test_layer_decay_scales_each_block_by_the_rate_below_the_one_above_it(name):
    """--layer-decay 0.5 (timm's groups, as the dense side's): the classifier at lr, the backbone at 0.01 lr times
    0.5 per layer down from the top, one layer a block, the embedding one below the first block."""
    from classification.transfer import build_parser, resolve_recipe
    recipe = resolve_recipe(build_parser().parse_args(['lvvit_s', '--dataset', 'cifar10', '--data-dir', '.',
                                                       '--layer-decay', '0.5', '--drop-path', '0']))
    model, _ = build_transfer_model(name, 10, 32, recipe, model_kwargs=FAMILIES[name][0])
    optimizer = transfer_optimizer(model, recipe)
    names = {id(p): n for n, p in model.named_parameters()}
    lr_of = {names[id(p)]: group['lr'] for group in optimizer.param_groups for p in group['params']}
    assert sorted(lr_of) == sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert lr_of['head.weight'] == pytest.approx(0.05)
    depth = len(model.blocks)
    blocks = [lr_of[f'blocks.{i}.norm1.weight'] for i in range(depth)]
    assert [lower / upper for lower, upper in zip(blocks, blocks[1:])] == pytest.approx([0.5] * (depth - 1))
    assert max(lr for n, lr in lr_of.items() if not n.startswith('head')) <= 0.0005 * 0.5
    embedding = next(n for n in lr_of if n.startswith(('patch_embed.', 'tokens_to_token.')))
    assert lr_of[embedding] == pytest.approx(blocks[0] * 0.5)
    assert lr_of['cls_token'] == pytest.approx(blocks[0] * 0.5)
    with pytest.raises(SystemExit):
        build_parser().parse_args(['lvvit_s', '--dataset', 'cifar10', '--data-dir', '.', '--layer-decay', '0'])
    with pytest.raises(UsageError, match='--frozen with --layer-decay 0.5: the frozen features learn nothing'):
        resolve_recipe(build_parser().parse_args(['lvvit_s', '--dataset', 'cifar10', '--data-dir', '.',
                                                  '--layer-decay', '0.5', '--frozen']))


def test_image_label_token_objective_is_class_plus_half_the_token_cross_entropy():
    from backbones import TokenLabelingOutput
    cls_logits, token_logits = torch.randn(3, 5), torch.randn(3, 2, 2, 5)
    labels = torch.tensor([4, 0, 2])
    objective = TokenLabelingObjective(5, 0.0, token_loss=TokenLabelingLoss(0.5))
    images, soft = objective.prepare(torch.zeros(3), labels)
    assert soft is None
    loss = objective.loss(TokenLabelingOutput(cls_logits, token_logits, None), {'label': labels}, soft,
                          torch.device('cpu'))
    token_ce = F.cross_entropy(token_logits.reshape(12, 5), labels.repeat_interleave(4))
    torch.testing.assert_close(loss, F.cross_entropy(cls_logits, labels) + 0.5 * token_ce)


def test_adamw_variant_and_command_line_overrides():
    from classification.transfer import build_parser, resolve_recipe
    args = build_parser().parse_args(['lvvit_s', '--dataset', 'cifar10', '--data-dir', '.', '--opt', 'adamw',
                                      '--lr', '3e-4'])
    recipe = resolve_recipe(args)
    assert (recipe.opt, recipe.lr, recipe.backbone_lr_scale, recipe.weight_decay, recipe.warmup_epochs) == \
        ('adamw', 3e-4, 0.1, 0.05, 1)
    model, _ = build_transfer_model('deit_small_patch16_224', 10, 32, recipe, model_kwargs=FAMILIES[
        'deit_small_patch16_224'][0])
    optimizer = transfer_optimizer(model, recipe)
    assert type(optimizer).__name__ == 'AdamW'
    assert sorted({g['initial_lr'] for g in optimizer.param_groups}) == pytest.approx([3e-5, 3e-4])  # before warm-up
    sgd = resolve_recipe(build_parser().parse_args(['lvvit_s', '--dataset', 'cifar10', '--data-dir', '.']))
    assert (sgd.opt, sgd.lr, sgd.backbone_lr_scale, sgd.weight_decay, sgd.min_lr, sgd.epochs, sgd.batch_size) == \
        ('sgd', 0.05, 0.01, 5e-4, 2e-4, 60, 64)
    with pytest.raises(UsageError, match='--opt must be one of sgd, adamw'):
        transfer_recipe('lamb')
