"""tools/reproduce_token_labeling.py's rows: each trains the recipe its name gives, differing from token labeling in
that factor (the recipe train_cls.py builds from the row's own options)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from classification.train import build_parser, resolve_recipe
from digits.cls_data import EmbeddedScans
from helpers.commands import ROOT

sys.path.insert(0, str(ROOT / 'tools'))
import reproduce_token_labeling as reproduce  # noqa: E402


def recipe_of(variant: str) -> dict:
    """The recipe of a row's pretraining on the embedded digits, as train_cls.py resolves its options."""
    stages = reproduce.Stages(reproduce.build_parser().parse_args(['--variants', variant]))
    argv = stages.pretrain_argv(variant, 0, 'lvvit_s', Path('out'))
    args = build_parser(EmbeddedScans).parse_args(argv)
    return vars(resolve_recipe(args, EmbeddedScans.recipe_values))


def changed(variant: str) -> dict:
    baseline, row = recipe_of('token-labeling'), recipe_of(variant)
    return {key: (baseline[key], value) for key, value in row.items() if baseline[key] != value}


@pytest.mark.parametrize('rate', [20, 40, 60, 80])
def test_a_participation_row_changes_the_share_of_tokens_alone(rate):
    assert changed(f'participation-{rate}') == {'token_participation': (1.0, rate / 100)}


def test_standard_at_token_labelings_lr_changes_supervision_and_mixing_not_the_lr():
    paper, same_lr = changed('standard'), changed('standard-same-lr')
    assert paper['lr_base'] == (1e-3, 1e-3 * 640 / 1024)  # the paper's Standard row: 1e-3 per 1024 images
    assert 'lr_base' not in same_lr and same_lr == {key: value for key, value in paper.items() if key != 'lr_base'}
    # token labeling off: the image labels, and the recipe's MixUp 0.8 + CutMix 1.0 (unused with token labeling)
    # instead of MixToken
    assert same_lr == {'token_labeling': (True, False)}


def test_a_table_runs_the_papers_rows_token_labeling_first(tmp_path):
    def rows(*argv: str) -> list[str]:
        args = reproduce.build_parser().parse_args([*argv, '--out', str(tmp_path)])
        reproduce.check_args(args)
        return args.variants

    assert rows() == ['token-labeling', 'standard', 'mixtoken-label']
    assert rows('--table', '4') == ['token-labeling', 'standard', 'relabel', 'online-kd', 'online-token-labeling']
    assert rows('--table', '2', '--variants', 'standard') == ['token-labeling', 'standard', 'mixtoken-label',
                                                              'relabel', 'relabel-mixtoken', 'cutmix-label']
    assert rows('--table', 'fig4')[1:] == [f'participation-{rate}' for rate in (20, 40, 60, 80)]
