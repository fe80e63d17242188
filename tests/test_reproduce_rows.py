"""tools/reproduce_token_labeling.py's rows: each trains the recipe its name gives, differing from token labeling in
that factor (the recipe train_cls.py builds from the row's own options)."""
from __future__ import annotations

from pathlib import Path

import pytest

from backbones.common.errors import UsageError
from classification.digits.cls_data import EmbeddedScans
from classification.recipes import resolve_recipe
from classification.studies.reproduction import runs
from classification.studies.reproduction.plots import plot_tables
from classification.studies.reproduction.rows import HEADS, MODES, VARIANTS
from classification.studies.reproduction.summary import summarise
from classification.studies.reproduction.tables import markdown_table, paper_tables
from classification.train import build_parser


def options_of(variant: str):
    """train_cls.py's parsed options for a row's pretraining on the embedded digits."""
    stages = runs.Stages(runs.build_parser().parse_args(['--variants', variant]))
    return build_parser(EmbeddedScans).parse_args(stages.pretrain_argv(variant, 0, 'lvvit_s', Path('out')))


def recipe_of(variant: str) -> dict:
    """The recipe of a row's pretraining on the embedded digits, as train_cls.py resolves its options."""
    return vars(resolve_recipe(options_of(variant), EmbeddedScans.recipe_values))


def changed(variant: str) -> dict:
    baseline, row = recipe_of('token-labeling'), recipe_of(variant)
    return {key: (baseline[key], value) for key, value in row.items() if baseline[key] != value}


@pytest.mark.parametrize('annotator', ['resnet18', 'resnet34'])
def test_an_annotator_row_changes_the_store_alone(annotator):
    """Figure 4 right: the same recipe, token labels from another annotator's store."""
    assert changed(f'annotator-{annotator}') == {}
    baseline, row = (EmbeddedScans.from_args(options_of(v)) for v in ('token-labeling', f'annotator-{annotator}'))
    assert baseline == EmbeddedScans() and row == EmbeddedScans(annotator=annotator)
    assert row.labels_dir() != baseline.labels_dir() and row.annotator_dir() != baseline.annotator_dir()


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
        args = runs.build_parser().parse_args([*argv, '--out', str(tmp_path)])
        runs.check_args(args)
        return args.variants

    table2 = ['token-labeling', 'mixtoken-label', 'relabel', 'relabel-mixtoken', 'cutmix-label']
    table4 = ['token-labeling', 'standard', 'relabel', 'online-kd', 'online-token-labeling', 'standard-same-lr']
    assert rows('--table', '2') == table2
    assert rows('--table', '4') == table4
    assert rows('--table', '2', '--variants', 'standard') == [table2[0], 'standard', *table2[1:]]
    assert rows('--table', 'fig4') == ['token-labeling', *(f'participation-{rate}' for rate in (20, 40, 60, 80)),
                                       'annotator-resnet18', 'annotator-resnet34']
    assert set(rows()) == set(table2) | set(table4)  # the default: Tables 2, 4 and 7 (whose rows are in 2 and 4)
    assert rows('--variants', 'standard') == ['standard']
    on_your_data = ['--cls-data-dir', str(tmp_path), '--token-label-dir', str(tmp_path), '--annotator', 'resnet10t',
                    '--annotator-checkpoint', str(tmp_path / 'annotator.pth')]  # the online rows' annotator
    assert rows('--quick', *on_your_data) == [row for row in rows('--quick') if not row.startswith('annotator-')]
    with pytest.raises(UsageError, match='annotator rows'):  # asked for by name: refused, saying why
        rows('--table', 'fig4', *on_your_data)


@pytest.mark.parametrize('transfer, rows', [('table7', ['token-labeling', 'standard', 'mixtoken-label']),
                                            ('none', []), ('all', None)])
def test_only_the_asked_rows_are_transferred_to_segmentation(tmp_path, transfer, rows):
    args = runs.build_parser().parse_args(['--transfer', transfer, '--out', str(tmp_path)])
    runs.check_args(args)
    assert args.transferred == (args.variants if rows is None else rows)


def fake_runs(variants: list[str], seeds: int = 2, transferred: tuple = ()) -> list[dict]:
    """Runs whose figures say which row and seed they are: top-1 = 50 + row + seed, mIoU = 40 + row + seed (for the
    rows `transferred` to segmentation), pretraining seconds = 100 + 10 row + 50 seed (seed 0 the fastest)."""
    def segmentation(i: int, seed: int) -> dict:
        return {head: {mode: {'mIoU': 40.0 + i + seed, 'aAcc': 80.0} for mode in MODES}
                for head in HEADS}

    return [{'variant': variant, 'seed': seed, 'top1': 50.0 + i + seed, 'train_seconds': 100.0 + 10 * i + 50 * seed,
             **(segmentation(i, seed) if variant in transferred else {})}
            for seed in range(seeds) for i, variant in enumerate(variants)]


def table_rows(text: str, title: str) -> list[list[str]]:
    block = text.split(title, 1)[1].split('\n\n')[1]  # the table after its title line
    return [[cell.strip() for cell in line.strip('|').split('|')] for line in block.splitlines()[2:]]


def test_the_papers_layouts_hold_each_rows_own_figures():
    variants = ['token-labeling', 'standard', 'relabel', 'relabel-mixtoken', 'participation-20', 'participation-60',
                'annotator-resnet18']
    summary = summarise(fake_runs(variants, transferred=('token-labeling', 'standard')))
    annotators = {'resnet10t': {'params': 4.9e6, 'top1': 98.6}, 'resnet18': {'params': 11.2e6, 'top1': 99.2}}
    text = paper_tables(summary, annotators)
    table2 = table_rows(text, 'Table 2 layout')
    assert table2[0] == ['MixToken', '50.5 ± 0.7 / 40.5 ± 0.7', '53.5 ± 0.7', '—']  # rows 0 (transferred) and 3
    assert table2[1] == ['CutMix', '—', '52.5 ± 0.7', '—']  # relabel is row 2
    table4 = table_rows(text, 'Table 4 layout')
    assert [row[0] for row in table4] == ['vanilla', 'token labeling', 'ReLabel']
    # the fastest seed's time: token labeling's 100 s against Standard's 110 s (their means: 125 s and 135 s)
    assert table4[0][2] == '51.5 ± 0.7 / 41.5 ± 0.7' and table4[1][3] == '100 s (×0.91)'
    figure4 = table_rows(text, 'Figure 4 (left)')
    assert figure4[0] == ['Top-1', '54.5 ± 0.7', '55.5 ± 0.7', '50.5 ± 0.7']  # 20%, 60%, then 100%: token labeling
    assert figure4[1] == ['Minus 100%', '+4.0 [+4.0, +4.0]', '+5.0 [+5.0, +5.0]', '']  # paired by seed
    assert table_rows(text, 'Figure 4 (right)') == [['resnet10t', '4.9M', '98.6', '50.5 ± 0.7', ''],
                                                    ['resnet18', '11.2M', '99.2', '56.5 ± 0.7', '+6.0 [+6.0, +6.0]']]
    assert paper_tables(summarise(fake_runs(['token-labeling'])), {}) == ''  # one row: no layout


def test_rows_not_transferred_are_compared_by_top1_alone(tmp_path):
    variants = ['token-labeling', 'standard', 'relabel']
    summary = summarise(fake_runs(variants, seeds=3, transferred=('token-labeling', 'standard')))
    assert 'upernet' in summary['standard'] and 'upernet' not in summary['relabel']
    assert set(summary['relabel']['vs_token_labeling']) == {'top1'}
    assert summary['relabel']['vs_token_labeling']['top1']['mean'] == pytest.approx(2.0)
    assert summary['standard']['vs_token_labeling']['fcn']['ms']['mean'] == pytest.approx(1.0)
    table = markdown_table(summary, 'lvvit_s', 3, {})
    assert [row[0] for row in table_rows(table, 'seed(s).')] == [VARIANTS[v] for v in variants]
    assert [row[1] for row in table_rows(table, 'Table 7 layout')] == [VARIANTS[v] for v in variants[:2]] * 2
    figures = plot_tables(summary, {}, tmp_path, 'test')
    assert [path.name for path in figures] == ['table2.png', 'table4.png', 'table7.png']  # no Figure 4 row
