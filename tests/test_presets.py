"""The papers' recipe rows: the LV-ViT paper's comparison rows as presets (Standard baseline, MixToken with the image
label, no MixToken), CaiT's per-size stochastic depth and LayerScale with repeated augmentation, and the ViT paper's
fine-tuning."""
import json
from collections import Counter

import pytest
import torch
from torch.utils.data import default_collate

from backbones import create_model
from backbones.common.distributed import DistInfo
from backbones.common.errors import UsageError
from backbones.token_head import TOKEN_HEAD
from classification.digits.cls_data import RECIPE as DIGITS
from classification.engine.samplers import Batching, sharded_loaders
from classification.recipes import PRESETS, recipe_for, resolve_recipe
from classification.train import build_parser, main
from classification.training_pieces import make_objective
from helpers.commands import run_torchrun
from helpers.models import TINY_DEIT


def lr_per_image(recipe) -> float:
    return recipe.lr_base / recipe.lr_base_batch


def test_standard_is_the_papers_baseline():
    token, standard = recipe_for('lvvit_s'), recipe_for('lvvit_s', preset='standard')
    assert token.token_labeling and not standard.token_labeling
    assert (standard.mixup, standard.cutmix) == (0.8, 1.0)
    assert lr_per_image(token) == pytest.approx(1e-3 / 640)
    assert lr_per_image(standard) == pytest.approx(1e-3 / 1024)
    # on the digits the two keep the paper's ratio, at the digits run's own lr
    digits_token, digits_standard = recipe_for('lvvit_s', data_values=DIGITS), recipe_for('lvvit_s', 'standard', DIGITS)
    assert lr_per_image(digits_token) == pytest.approx(DIGITS['lr_base'] / DIGITS['lr_base_batch'])
    assert lr_per_image(digits_standard) / lr_per_image(digits_token) == pytest.approx(640 / 1024)
    # a recipe that had no token labeling keeps its lr
    deit = 'deit_small_patch16_224'
    assert recipe_for(deit, preset='standard').lr_base == recipe_for(deit).lr_base


def test_no_token_labeling_gives_lvvit_the_standard_recipe():
    args = build_parser().parse_args(['lvvit_s', '--no-token-labeling'])
    assert vars(resolve_recipe(args)) == vars(recipe_for('lvvit_s', preset='standard'))
    args = build_parser().parse_args(['lvvit_s', '--preset', 'mixtoken-label'])
    recipe = resolve_recipe(args)
    assert recipe.token_labeling and recipe.token_target == 'label' and recipe.mix_token == 1.0
    objective = make_objective(recipe, 10)
    assert objective.token_builder is None and objective.token_loss is not None  # every token: the image label
    recipe = resolve_recipe(build_parser().parse_args(['lvvit_s', '--preset', 'token-labeling-no-mixtoken']))
    assert recipe.uses_score_maps and recipe.mix_token == 0.0
    assert set(PRESETS) == {'token-labeling', 'standard', 'mixtoken-label', 'token-labeling-no-mixtoken',
                            'relabel', 'relabel-mixtoken', 'cutmix-label', 'vit-finetune'}
    cutmix = resolve_recipe(build_parser().parse_args(['lvvit_s', '--preset', 'cutmix-label']))
    standard = resolve_recipe(build_parser().parse_args(['lvvit_s', '--preset', 'standard']))
    assert not cutmix.token_labeling and (cutmix.mixup, cutmix.cutmix) == (0.0, 1.0)
    assert {k: v for k, v in vars(cutmix).items() if k != 'mixup'} == {k: v for k, v in vars(standard).items()
                                                                       if k != 'mixup'}  # MixUp alone differs


def test_unknown_preset_lists_the_presets(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(['lvvit_s', '--preset', 'online-distillation'])
    assert 'token-labeling-no-mixtoken' in capsys.readouterr().err


@pytest.mark.parametrize('preset', ['mixtoken-label', 'standard'])
def test_presets_train_without_a_label_store(labeled_images, tmp_path, preset):
    data, _ = labeled_images
    out = tmp_path / preset
    metrics = main([*TINY_DEIT, '--data-dir', str(data), '--preset', preset, '--output', str(out), '--img-size', '32',
                    '--batch-size', '4', '--epochs', '1', '--warmup-epochs', '0', '--workers', '0', '--device', 'cpu'])
    written = json.loads((out / 'metrics.json').read_text())
    assert written['preset'] == preset and written == metrics
    # what trained: MixToken with image labels, a token head over the 32-wide tokens; the standard run, none
    weights = torch.load(out / 'last.pth', weights_only=True)['state_dict']
    token_head = [tuple(v.shape) for k, v in weights.items() if k.startswith(f'{TOKEN_HEAD}.')]
    assert token_head == ([(3, 32), (3,)] if preset == 'mixtoken-label' else [])


# CaiT paper, Table 3: stochastic depth d_r and LayerScale init per size
CAIT_TABLE_3 = {'xxs24': (0.1, 1e-5), 'xxs36': (0.1, 1e-6), 'xs24': (0.1, 1e-5), 'xs36': (0.2, 1e-6),
                's24': (0.1, 1e-5), 's36': (0.2, 1e-6), 's48': (0.3, 1e-6), 'm24': (0.2, 1e-5), 'm36': (0.3, 1e-6)}


@pytest.mark.parametrize('size', list(CAIT_TABLE_3))
def test_cait_recipe_and_layerscale_follow_table_3(size):
    d_r, eps = CAIT_TABLE_3[size]
    recipe = recipe_for(f'cait_{size}_224')
    assert (recipe.drop_path, recipe.epochs, recipe.aug_repeats) == (d_r, 400, 3)
    assert recipe.lr_base / recipe.lr_base_batch == pytest.approx(1e-3 / 1024) and recipe.warmup_epochs == 5
    model = create_model(f'cait_{size}_224', depth=2, drop_path_rate=recipe.drop_path)
    for block in model.blocks:  # uniform stochastic depth, every gain at the init value
        assert block.drop_path.drop_prob == d_r
        assert torch.all(block.gamma_1 == eps) and torch.all(block.gamma_2 == eps)


def test_repeated_augmentation_spreads_each_images_copies_over_the_processes():
    """timm's repeated-augmentation sampler under two processes: every image drawn in an epoch comes three times,
    on both processes; the epoch has as many draws as the data set has images."""
    dataset = list(range(24))
    drawn = {}
    for rank in (0, 1):
        info = DistInfo(rank=rank, world_size=2)
        loader, _ = sharded_loaders(dataset, [dataset], Batching(4, 0, 0, default_collate, aug_repeats=3), info)
        loader.sampler.set_epoch(5)
        drawn[rank] = [int(i) for batch in loader for i in batch]
    assert len(drawn[0]) == len(drawn[1]) == 12
    counts = Counter(drawn[0] + drawn[1])
    assert set(counts.values()) == {3} and len(counts) == 8
    assert all(image in drawn[0] and image in drawn[1] for image in counts)


def test_each_copy_of_a_repeated_image_is_augmented_anew_in_any_loader_worker(labeled_images):
    """--aug-repeats 3 in one process: the three copies of an image in an epoch get three crops (each sample's
    augmentation is drawn from its place in the pass; drawn from the image alone, the copies came out alike from
    loader workers), and the same ones whether loader workers or the training process read them."""
    from classification.data.augment import TrainTransform
    from classification.data.folders import ImageFolderDataset, collate_skipping
    data, _ = labeled_images
    dataset = ImageFolderDataset(data, 'train', TrainTransform(32, auto_augment=None, reprob=0))
    crops = {}
    for workers in (0, 2):
        loader = sharded_loaders(dataset, [], Batching(6, workers, 0, collate_skipping, aug_repeats=3, places=True),
                                 DistInfo())[0]
        loader.sampler.set_epoch(1)
        dataset.set_epoch(0, 1)
        crops[workers] = [(int(index), tuple(box.tolist())) for batch in loader
                          for index, box in zip(batch['index'], batch['geometry'].box)]
    assert crops[0] == crops[2]
    copies = Counter(index for index, _ in crops[0])
    assert set(copies.values()) == {3} and len(copies) == 8
    assert len(set(crops[0])) == 24  # every copy its own crop


@pytest.mark.slow
def test_repeated_augmentation_trains_under_torchrun(labeled_images, tmp_path):
    data, _ = labeled_images
    args = [*TINY_DEIT, '--data-dir', str(data), '--no-token-labeling', '--aug-repeats', '3', '--output',
            str(tmp_path / 'run'), '--img-size', '32', '--batch-size', '2', '--epochs', '2', '--warmup-epochs', '0',
            '--workers', '0', '--device', 'cpu']
    run_torchrun('train_cls.py', args, processes=2)
    checkpoint = torch.load(tmp_path / 'run' / 'last.pth', weights_only=True)
    # 24 training images: 12 draws per process an epoch, 6 updates of 2 images
    assert checkpoint['num_updates'] == 2 * 6 and checkpoint['args']['aug_repeats'] == 3


def test_vit_finetuning_starts_a_new_classifier_at_zero(labeled_images, tmp_path):
    """The ViT paper's fine-tuning preset: SGD momentum 0.9, no weight decay, clipping at 1, and with --finetune
    --new-head a zero classifier (an lr of 1e-12 leaves it there)."""
    recipe = recipe_for('vit_base_patch16_224', preset='vit-finetune')
    assert (recipe.opt, recipe.weight_decay, recipe.clip_grad, recipe.img_size, recipe.zero_head) == \
        ('momentum', 0.0, 1.0, 384, True)
    assert (recipe.mixup, recipe.cutmix, recipe.auto_augment, recipe.smoothing) == (0.0, 0.0, None, 0.0)
    data, _ = labeled_images
    common = [*TINY_DEIT, '--data-dir', str(data), '--img-size', '32', '--batch-size', '4', '--epochs', '1',
              '--warmup-epochs', '0', '--workers', '0', '--device', 'cpu']
    main([*common, '--no-token-labeling', '--output', str(tmp_path / 'pre')])
    main([*common, '--preset', 'vit-finetune', '--finetune', str(tmp_path / 'pre' / 'last.pth'), '--new-head',
          '--lr-base', '1e-12', '--output', str(tmp_path / 'ft')])
    weights = torch.load(tmp_path / 'ft' / 'last.pth', weights_only=True)['state_dict']
    assert weights['head.weight'].abs().max() < 1e-6 and weights['head.bias'].abs().max() < 1e-6
    assert not torch.equal(weights['blocks.0.attn.qkv.weight'], torch.zeros_like(weights['blocks.0.attn.qkv.weight']))


def test_token_participation_reaches_the_loss_and_needs_token_labeling(tmp_path):
    recipe = resolve_recipe(build_parser().parse_args(['lvvit_s', '--token-participation', '0.4']))
    assert recipe.token_participation == 0.4 and make_objective(recipe, 10).token_loss.participation == 0.4
    for rate in ('0', '1.5'):
        with pytest.raises(SystemExit):
            build_parser().parse_args(['lvvit_s', '--token-participation', rate])
    with pytest.raises(UsageError, match='--token-participation 0.5 applies to the token term'):
        main(['lvvit_s', '--preset', 'standard', '--token-participation', '0.5', '--data-dir', str(tmp_path),
              '--output', str(tmp_path / 'out'), '--device', 'cpu'])


def test_each_objective_mode_is_a_type_chosen_once_from_the_recipe():
    """The recipe picks the objective's type (no mode switched by `if` inside one): token labeling, label pooling,
    the image label (mixed), and with a teacher DeiT's hard distillation, or online token labeling."""
    import torch.nn as nn

    from classification.objectives.objective import (
        DistillationObjective,
        LabelObjective,
        LabelPoolingObjective,
        TokenLabelingObjective,
    )
    kinds = {preset: type(make_objective(recipe_for('lvvit_s', preset), 10))
             for preset in ('token-labeling', 'mixtoken-label', 'relabel', 'standard')}
    assert kinds == {'token-labeling': TokenLabelingObjective, 'mixtoken-label': TokenLabelingObjective,
                     'relabel': LabelPoolingObjective, 'standard': LabelObjective}
    teacher = nn.Identity()
    distilled = make_objective(recipe_for('deit_small_patch16_224'), 10, teacher)
    assert type(distilled) is DistillationObjective and distilled.teacher is teacher and distilled.mixup is not None
    online = make_objective(recipe_for('lvvit_s'), 10, teacher)
    assert type(online) is TokenLabelingObjective and online.annotator is teacher and online.ahead_grid() is None
