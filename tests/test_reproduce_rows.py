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


def fake_runs(variants: list[str], seeds: int = 2) -> list[dict]:
    """Runs whose figures say which row and seed they are: top-1 = 50 + row + seed, mIoU = 40 + row + seed."""
    return [{'variant': variant, 'seed': seed, 'top1': 50.0 + i + seed, 'train_seconds': 100.0 + 10 * i,
             **{head: {mode: {'mIoU': 40.0 + i + seed, 'aAcc': 80.0} for mode in reproduce.MODES}
                for head in reproduce.HEADS}}
            for seed in range(seeds) for i, variant in enumerate(variants)]


def table_rows(text: str, title: str) -> list[list[str]]:
    block = text.split(title, 1)[1].split('\n\n')[1]  # the table after its title line
    return [[cell.strip() for cell in line.strip('|').split('|')] for line in block.splitlines()[2:]]


def test_the_papers_layouts_hold_each_rows_own_figures():
    variants = ['token-labeling', 'standard', 'relabel', 'relabel-mixtoken', 'participation-20', 'participation-60']
    summary = reproduce.summarise(fake_runs(variants))
    text = reproduce.paper_tables(summary)
    table2 = table_rows(text, 'Table 2 layout')
    assert table2[0] == ['MixToken', '50.5 ± 0.7 / 40.5 ± 0.7', '53.5 ± 0.7 / 43.5 ± 0.7', '—']  # rows 0 and 3
    assert table2[1] == ['CutMix', '—', '52.5 ± 0.7 / 42.5 ± 0.7', '—']  # relabel is row 2
    table4 = table_rows(text, 'Table 4 layout')
    assert [row[0] for row in table4] == ['vanilla', 'token labeling', 'ReLabel']
    assert table4[1][3] == '100 s (×0.91)'  # token labeling's 100 s against Standard's 110 s
    figure4 = table_rows(text, 'Figure 4 (left)')
    assert figure4[0] == ['Top-1', '54.5 ± 0.7', '55.5 ± 0.7', '50.5 ± 0.7']  # 20%, 60%, then 100%: token labeling
    assert reproduce.paper_tables(reproduce.summarise(fake_runs(['token-labeling']))) == ''  # one row: no layout
