"""The LV-ViT paper's comparison rows as presets: Standard baseline, MixToken with the image label, no MixToken."""
import json

import pytest

from classification.recipes import DIGITS, PRESETS, recipe_for
from classification.train import build_parser, main, make_objective, resolve_recipe
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
    digits_token, digits_standard = recipe_for('lvvit_s', True), recipe_for('lvvit_s', True, 'standard')
    assert lr_per_image(digits_token) == pytest.approx(DIGITS['lr_base'] / DIGITS['lr_base_batch'])
    assert lr_per_image(digits_standard) / lr_per_image(digits_token) == pytest.approx(640 / 1024)
    # a recipe that had no token labeling keeps its lr
    assert recipe_for('deit_small_patch16_224', preset='standard').lr_base == recipe_for('deit_small_patch16_224').lr_base


def test_no_token_labeling_gives_lvvit_the_standard_recipe():
    args = build_parser().parse_args(['lvvit_s', '--no-token-labeling'])
    assert vars(resolve_recipe(args, digits=False)) == vars(recipe_for('lvvit_s', preset='standard'))
    args = build_parser().parse_args(['lvvit_s', '--preset', 'mixtoken-label'])
    recipe = resolve_recipe(args, digits=False)
    assert recipe.token_labeling and recipe.token_target == 'label' and recipe.mix_token == 1.0
    objective = make_objective(recipe, 10)
    assert objective.token_builder is None and objective.token_loss is not None  # every token: the image label
    recipe = resolve_recipe(build_parser().parse_args(['lvvit_s', '--preset', 'token-labeling-no-mixtoken']), False)
    assert recipe.uses_score_maps and recipe.mix_token == 0.0
    assert set(PRESETS) == {'token-labeling', 'standard', 'mixtoken-label', 'token-labeling-no-mixtoken'}


def test_unknown_preset_lists_the_presets(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(['lvvit_s', '--preset', 'relabel'])
    assert 'token-labeling-no-mixtoken' in capsys.readouterr().err


@pytest.mark.parametrize('preset', ['mixtoken-label', 'standard'])
def test_presets_train_without_a_label_store(labeled_images, tmp_path, preset):  # noqa: F811
    data, _ = labeled_images
    out = tmp_path / preset
    metrics = main([*TINY_DEIT, '--data-dir', str(data), '--preset', preset, '--output', str(out), '--img-size', '32',
                    '--batch-size', '4', '--epochs', '1', '--warmup-epochs', '0', '--workers', '0', '--device', 'cpu'])
    written = json.loads((out / 'metrics.json').read_text())
    assert written['preset'] == preset and written == metrics
    assert written['token_labeling'] == (preset == 'mixtoken-label')
