"""CIFAR transfer, part 2: `tools/transfer_cifar.py` end to end on tiny archives in the real format: model selection
on the held-out split, the test accuracy of the chosen epoch, pretrained weights that all keep training, the token
head on image labels, resume after a kill, torchrun (gloo) against one process, and clear refusals."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
import timm
import torch
from PIL import Image

from backbones import CheckpointError
from backbones.common.errors import UsageError
from backbones.common.random_state import seed_all
from classification.data.cifar import CifarFormatError, hold_out
from classification.predict import ClassPredictor
from classification.recipes import TransferRecipe
from classification.transfer import build_transfer_model, main
from helpers.cifar_data import tiny_cifar
from helpers.commands import run_tool, run_torchrun
from helpers.models import FAMILIES, tiny_release
from helpers.models import TINY_DEIT as DEIT
from helpers.training_runs import assert_same_run, last_weights, read_log, resume_killed_run

pytestmark = pytest.mark.slow  # tools run end to end here: make test-fast leaves this file out

LVVIT = ['lvvit_s', '--model-kwargs', *(f'{k}={v}' for k, v in FAMILIES['lvvit_s'][0].items())]


@pytest.fixture(scope='module')
def cifar10(tmp_path_factory):
    return tiny_cifar(tmp_path_factory.mktemp('c10'), 'cifar10', per_class_train=12, per_class_test=4, archive=True)


@pytest.fixture(scope='module')
def cifar100(tmp_path_factory):
    return tiny_cifar(tmp_path_factory.mktemp('c100'), 'cifar100', per_class_train=10, per_class_test=2,
                      archive=False, num_classes=8)


def normalised_test_images(splits: dict) -> tuple:
    """The test images normalised with the numpy statistics of the training images that were not held out, and
    their labels (an independent statement of the tool's input pipeline at 32 px)."""
    images, labels = splits['test']
    _, val_idx = hold_out(splits['train'][1], 0.1, seed=0)
    kept = np.delete(splits['train'][0], val_idx, axis=0).astype(np.float64) / 255
    mean, std = kept.mean(axis=(0, 1, 2)), kept.std(axis=(0, 1, 2))
    return torch.from_numpy(((images / 255 - mean) / std).transpose(0, 3, 1, 2)).float(), labels, mean


def transfer_args(model, dataset, data_dir, output, *extra):
    return [*model, '--dataset', dataset, '--data-dir', str(data_dir), '--output', str(output), '--img-size', '32',
            '--batch-size', '8', '--workers', '0', '--device', 'cpu', *extra]


def test_chosen_epoch_is_the_best_on_held_out_data_and_its_test_accuracy_is_reported(cifar10, tmp_path):
    root, splits = cifar10
    out = tmp_path / 'run'
    metrics = main(transfer_args(DEIT, 'cifar10', root, out, '--epochs', '4', '--lr', '0.4'))

    log = read_log(out)
    best_epoch = max(log, key=lambda e: (log[e]['top1'], -e))  # the first epoch with the highest val top-1
    assert metrics['best_epoch'] == best_epoch and metrics['val_top1'] == log[best_epoch]['top1']
    assert metrics['epochs'] == 4 and metrics['last_val_top1'] == log[4]['top1']
    assert (metrics['train_images'], metrics['val_images'], metrics['test_images']) == (110, 10, 40)
    assert json.loads((out / 'metrics.json').read_text()) == metrics

    # independent evaluation of the chosen weights on the test images
    x, labels, mean = normalised_test_images(splits)
    model = timm.create_model('deit_small_patch16_224', num_classes=10, img_size=32, embed_dim=32, depth=2,
                              num_heads=2)
    best = torch.load(out / 'best.pth', weights_only=True)
    assert best['epochs_done'] == best_epoch
    model.load_state_dict(best['state_dict'])
    with torch.no_grad():
        predicted = model.eval()(x).argmax(dim=1).numpy()
    assert metrics['test_top1'] == pytest.approx(100 * (predicted == labels).mean(), abs=1e-9)
    np.testing.assert_allclose(best['args']['mean'], mean, rtol=1e-9)


def test_a_transfer_checkpoint_is_read_at_its_own_size_and_normalisation(cifar10, tmp_path):
    """The run records its evaluation input (32 px, the whole image, the training split's mean and std):
    predict_cls on test images written as files gives the chosen weights' predictions on the tool's own input (an
    independent statement of it), and a transfer from it without --img-size runs at 32 px."""
    root, splits = cifar10
    out = tmp_path / 'run'
    main(transfer_args(DEIT, 'cifar10', root, out, '--epochs', '1'))
    x, _, _ = normalised_test_images(splits)
    model = timm.create_model('deit_small_patch16_224', num_classes=10, img_size=32, embed_dim=32, depth=2,
                              num_heads=2)
    model.load_state_dict(torch.load(out / 'best.pth', weights_only=True)['state_dict'])
    with torch.no_grad():
        expected = model.eval()(x[:6]).softmax(-1)
    files = []
    for i, image in enumerate(splits['test'][0][:6]):
        files.append(tmp_path / f'{i}.png')
        Image.fromarray(image).save(files[-1])
    predictor = ClassPredictor('deit_small_patch16_224', str(out / 'best.pth'),
                               model_kwargs=dict(embed_dim=32, depth=2, num_heads=2))
    torch.testing.assert_close(torch.cat(list(predictor.probabilities(files))), expected, rtol=1e-4, atol=1e-5)
    args = transfer_args(DEIT, 'cifar10', root, tmp_path / 'on', '--epochs', '1', '--finetune', str(out / 'best.pth'))
    at = args.index('--img-size')
    main(args[:at] + args[at + 2:])
    assert torch.load(tmp_path / 'on' / 'last.pth', weights_only=True)['args']['img_size'] == 32


def test_pretrained_lvvit_trains_every_parameter_on_cifar100(cifar100, tmp_path):
    root, _ = cifar100
    source, path = tiny_release('lvvit_s', tmp_path)  # official layout, 1,000 classes, 64 px
    out = tmp_path / 'run'
    metrics = main(transfer_args(LVVIT, 'cifar100', root, out, '--finetune', str(path), '--epochs', '1',
                                 '--drop-path', '0'))
    assert metrics['pretrained'] == str(path) and metrics['train_images'] == 72
    start, end = source.state_dict(), last_weights(out)
    assert end['head.weight'].shape == (100, 48) and 'aux_head.weight' not in end
    moved = [k for k in end if not k.startswith(('head.', 'pos_embed')) and 'running' not in k
             and 'num_batches' not in k]
    assert {'cls_token', 'norm.weight', 'norm.bias'} <= set(moved)
    assert [k for k in moved if torch.equal(end[k], start[k])] == []  # the class token and final norm too


def test_frozen_features_keep_every_weight_and_statistic_and_the_classifier_learns(cifar100, tmp_path):
    """--frozen (linear probing): from the same release, every weight and batch-norm statistic of LV-ViT's features
    (its convolutional stem has batch norms) ends bit-identical to the file's, drop-path 0.5 notwithstanding; the
    new classifier learns."""
    root, _ = cifar100
    source, path = tiny_release('lvvit_s', tmp_path)
    out = tmp_path / 'run'
    main(transfer_args(LVVIT, 'cifar100', root, out, '--finetune', str(path), '--epochs', '1', '--frozen',
                       '--drop-path', '0.5'))
    start, end = source.state_dict(), last_weights(out)
    features = [k for k in end if not k.startswith(('head.', 'pos_embed'))]
    assert any('running_mean' in k for k in features) and 'cls_token' in features
    assert [k for k in features if not torch.equal(end[k], start[k])] == []
    seed_all(42)  # the tool's seed: the classifier it started from
    fresh, _ = build_transfer_model('lvvit_s', 100, 32, TransferRecipe(frozen=True),
                                    model_kwargs=FAMILIES['lvvit_s'][0])
    assert end['head.weight'].shape == fresh.head.weight.shape == (100, 48)
    assert not torch.equal(end['head.weight'], fresh.head.weight)


def test_lvvit_token_head_on_image_labels(cifar10, tmp_path):
    """With --token-labeling LV-ViT keeps a (fresh) token head, trains it on the image label, and the test accuracy
    is that of the paper's prediction rule: class logits + 0.5 x the class-wise max of the token logits."""
    root, splits = cifar10
    out = tmp_path / 'run'
    metrics = main(transfer_args(LVVIT, 'cifar10', root, out, '--epochs', '1', '--token-labeling', '--mix-token', '1'))
    seed_all(42)  # the tool's seed: the same initial weights
    start, _ = build_transfer_model('lvvit_s', 10, 32, TransferRecipe(token_labeling=True),
                                    model_kwargs=FAMILIES['lvvit_s'][0])
    weights = torch.load(out / 'best.pth', weights_only=True)['state_dict']
    assert weights['aux_head.weight'].shape == (10, 48) and weights['head.weight'].shape == (10, 48)
    assert not torch.equal(weights['aux_head.weight'], start.model.aux_head.weight)  # the token head trained

    x, labels, _ = normalised_test_images(splits)
    model = timm.create_model('lvvit_s', num_classes=10, img_size=32, **FAMILIES['lvvit_s'][0]).eval()
    model.load_state_dict(weights)
    with torch.no_grad():
        tokens = model.forward_features(x)
        logits = model.head(tokens[:, 0]) + 0.5 * model.aux_head(tokens[:, 1:]).amax(dim=1)
    assert metrics['test_top1'] == pytest.approx(100 * (logits.argmax(dim=1).numpy() == labels).mean(), abs=1e-9)


def test_killed_run_resumes_to_the_same_losses_and_weights(cifar10, tmp_path):
    root, _ = cifar10
    # augmentation (crop, flip), drop-path, two loader processes, the cosine schedule mid-way
    common = ['--epochs', '6', '--workers', '2', '--drop-path', '0.1']
    straight, cut = tmp_path / 'straight', tmp_path / 'cut'
    assert run_tool('transfer_cifar.py', transfer_args(LVVIT, 'cifar10', root, straight, *common)).returncode == 0
    resume_killed_run('transfer_cifar.py', transfer_args(LVVIT, 'cifar10', root, cut, *common), cut)
    assert_same_run(straight, cut, epochs=6)
    assert json.loads((cut / 'metrics.json').read_text()) == json.loads((straight / 'metrics.json').read_text())


def test_two_gloo_processes_agree_with_one(cifar10, tmp_path):
    root, _ = cifar10
    deterministic = ['--epochs', '2', '--hflip', '0', '--crop-padding', '0', '--drop-path', '0']
    one = main(transfer_args(DEIT, 'cifar10', root, tmp_path / 'one', *deterministic))
    two = transfer_args(DEIT, 'cifar10', root, tmp_path / 'two', *deterministic)
    two[two.index('--batch-size') + 1] = '4'  # the same global batch of 8
    run_torchrun('transfer_cifar.py', two, processes=2)
    assert_same_run(tmp_path / 'one', tmp_path / 'two', epochs=2, exact=False, images=10)
    metrics = json.loads((tmp_path / 'two' / 'metrics.json').read_text())
    assert metrics['test_images'] == 40 and metrics['test_top1'] == pytest.approx(one['test_top1'])


def test_refusals_name_the_problem(cifar10, tmp_path):
    root, _ = cifar10
    with pytest.raises(CifarFormatError, match='no CIFAR-100 data'):
        main(transfer_args(DEIT, 'cifar100', root, tmp_path / 'a'))
    assert not (tmp_path / 'a').exists()  # found once the run had made its folder, which was left empty
    with pytest.raises(UsageError, match='lvvit_s'):
        main(transfer_args(['lvvit_z'], 'cifar10', root, tmp_path / 'b'))
    _, t2t = tiny_release('t2t_vit_14', tmp_path)
    with pytest.raises(CheckpointError, match='holds a t2t_vit model, not lvvit_s'):
        main(transfer_args(LVVIT, 'cifar10', root, tmp_path / 'c', '--finetune', str(t2t)))
    # the former spelling of --finetune: one line giving the new one, before any work
    with pytest.raises(UsageError, match='--pretrained takes no file now .*start from a local file with --finetune '
                                         + re.escape(str(t2t))):
        main(transfer_args(LVVIT, 'cifar10', root, tmp_path / 'd', '--pretrained', str(t2t)))
    assert not (tmp_path / 'd').exists()

