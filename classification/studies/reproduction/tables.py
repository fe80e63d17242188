"""The reproduction's summary as markdown tables: every row's, the paper's own layouts (Tables 2, 4 and 7, Figure 4),
and the rows beside the paper's figures for the docs."""
from __future__ import annotations

import textwrap

from classification.digits.cls_data import ANNOTATOR
from classification.studies.reproduction.rows import (
    ANNOTATOR_ROWS,
    HEADS,
    MODES,
    PARTICIPATION,
    TABLE2_CELLS,
    TABLE4_ROWS,
    VARIANTS,
)
from classification.studies.reproduction.summary import annotators_run, rates_run, transferred
from classification.studies.statistics import CONFIDENCE, describe_difference


def cell(stats: dict) -> str:
    return f'{stats["mean"]:.1f} ± {stats["std"]:.1f}'


def markdown_table(summary: dict, model: str, seeds: int, annotators: dict) -> str:
    """Every row's pretraining (top-1, time, paired difference from token labeling); the transferred rows in the
    paper's Table 7 layout with their paired differences; then the paper's other layouts for the rows that ran."""
    lines = ['| Pretraining | Top-1 (%) | Top-1 minus token labeling | Pretraining time |', '|---|---:|---:|---:|']
    for variant, entry in summary.items():
        difference = describe_difference(entry['vs_token_labeling']['top1']) if 'vs_token_labeling' in entry else '—'
        lines.append(f'| {VARIANTS[variant]} | {cell(entry["top1"])} | {difference} | {time_cell(summary, variant)} |')
    text = textwrap.fill(
        f'{model}, {seeds} seed(s). Top-1 on the validation split, mean ± standard deviation over the seeds; each row '
        f'minus token labeling paired by seed (the same initialisation and data order), mean difference '
        f'[{CONFIDENCE:.0%} t interval] in percentage points, "within noise" where the interval holds 0. Pretraining '
        f'time: its epochs\' seconds summed, the fastest seed\'s, and its ratio to the Standard (vanilla) row\'s.',
        118, break_on_hyphens=False) + '\n\n' + '\n'.join(lines) + '\n'
    transfers = {variant: entry for variant, entry in summary.items() if transferred(entry)}
    return text + (table7(transfers, model) if transfers else '') + paper_tables(summary, annotators)


def table7(transfers: dict, model: str) -> str:
    """The paper's Table 7 layout (backbone, pretraining, head, SS and MS mIoU / pixel accuracy), then each
    transferred row's mIoU minus token labeling's."""
    lines = ['| Backbone | Pretraining | Top-1 (%) | Segmentation | mIoU SS | Pixel acc. SS | mIoU MS '
             '| Pixel acc. MS |', '|---|---|---:|---|---:|---:|---:|---:|']
    for head, head_name in HEADS.items():
        for variant, entry in transfers.items():
            scores = entry[head]
            lines.append(f'| {model} | {VARIANTS[variant]} | {cell(entry["top1"])} | {head_name} | '
                         f'{cell(scores["ss"]["mIoU"])} | {cell(scores["ss"]["aAcc"])} | '
                         f'{cell(scores["ms"]["mIoU"])} | {cell(scores["ms"]["aAcc"])} |')
    columns = [(head, mode) for head in HEADS for mode in MODES]
    differences = ['| Pretraining, minus token labeling | ' +
                   ' | '.join(f'{HEADS[h]} mIoU {MODES[m]}' for h, m in columns) + ' |',
                   '|---|' + '---:|' * len(columns)]
    differences += [f'| {VARIANTS[variant]} | ' + ' | '.join(
        describe_difference(entry['vs_token_labeling'][head][mode]) for head, mode in columns) + ' |'
        for variant, entry in transfers.items() if transferred(entry.get('vs_token_labeling', {}))]
    return ('\nTable 7 layout (the backbones transferred to segmentation; percent):\n\n' + '\n'.join(lines) + '\n' +
            ('\n' + '\n'.join(differences) + '\n' if len(differences) > 2 else ''))


def time_cell(summary: dict, variant: str) -> str:
    seconds = summary[variant]['train_seconds']['fastest']
    if 'standard' not in summary:
        return f'{seconds:.0f} s'
    return f'{seconds:.0f} s (×{seconds / summary["standard"]["train_seconds"]["fastest"]:.2f})'


def top1_and_miou(summary: dict, variant: str) -> str:
    """'top-1 / UperNet SS mIoU' of a transferred row, its top-1 alone for another, a dash where it did not run."""
    if variant not in summary:
        return '—'
    entry = summary[variant]
    return cell(entry['top1']) + (f' / {cell(entry["upernet"]["ss"]["mIoU"])}' if transferred(entry) else '')


def paper_tables(summary: dict, annotators: dict) -> str:
    """The paper's Table 2, Table 4 and Figure 4 (left and right) in their layouts, each where two of its rows ran."""
    parts = []
    if len(set(TABLE2_CELLS.values()) & set(summary)) >= 2:
        lines = ['| Augmentation | token labeling | ReLabel | image label |', '|---|---:|---:|---:|']
        for mixing in ('MixToken', 'CutMix'):
            lines.append(f'| {mixing} | ' + ' | '.join(
                top1_and_miou(summary, TABLE2_CELLS[(mixing, supervision)]) if (mixing, supervision) in TABLE2_CELLS
                else '—' for supervision in ('token labeling', 'ReLabel', 'image label')) + ' |')
        parts.append('Table 2 layout (top-1, and UperNet mIoU SS where the row was transferred):\n\n' +
                     '\n'.join(lines))
    if len(set(TABLE4_ROWS) & set(summary)) >= 2:
        lines = ['| Training | Tokens used | Top-1 (/ UperNet mIoU SS) | Pretraining time |', '|---|---|---:|---:|']
        lines += [f'| {name} | {tokens} | {top1_and_miou(summary, variant)} | {time_cell(summary, variant)} |'
                  for variant, (name, tokens) in TABLE4_ROWS.items() if variant in summary]
        parts.append('Table 4 layout:\n\n' + '\n'.join(lines))
    if len(rates_run(summary)) >= 2:
        parts.append('Figure 4 (left) as a table:\n\n' + participation_table(summary))
    if len(annotators_run(summary, annotators)) >= 2:
        parts.append('Figure 4 (right) as a table:\n\n' + annotator_table(summary, annotators))
    return ''.join(f'\n{part}\n' for part in parts)


def top1_minus_token_labeling(summary: dict, variant: str) -> str:
    """A row's top-1 minus token labeling's, paired by seed; empty for token labeling itself."""
    compared = summary[variant].get('vs_token_labeling')
    return describe_difference(compared['top1']) if compared else ''


def participation_table(summary: dict) -> str:
    """Figure 4 (left): top-1 at each participation rate that ran, and each rate minus 100% (token labeling)."""
    rates = rates_run(summary)
    return '\n'.join(['| Token participation | ' + ' | '.join(f'{rate}%' for rate in rates) + ' |',
                      '|---|' + '---:|' * len(rates),
                      '| Top-1 | ' + ' | '.join(cell(summary[PARTICIPATION[r]]['top1']) for r in rates) + ' |',
                      '| Minus 100% | ' + ' | '.join(top1_minus_token_labeling(summary, PARTICIPATION[r])
                                                    for r in rates) + ' |'])


def annotator_table(summary: dict, annotators: dict) -> str:
    """Figure 4 (right): each annotator's size and top-1, the top-1 its token labels give, and that minus the
    default annotator's."""
    lines = [f'| Annotator | Parameters | Annotator top-1 | Token labeling top-1 | Minus {ANNOTATOR}\'s |',
             '|---|---:|---:|---:|---:|']
    for name in annotators_run(summary, annotators):
        row = ANNOTATOR_ROWS[name]
        lines.append(f'| {name} | {annotators[name]["params"] / 1e6:.1f}M | {annotators[name]["top1"]:.1f} | '
                     f'{cell(summary[row]["top1"])} | {top1_minus_token_labeling(summary, row)} |')
    return '\n'.join(lines)


def rows_beside_the_paper(results: dict, paper_top1: dict, variants: list[str]) -> str:
    """`variants`' pretraining figures (top-1, its difference from token labeling, time) beside the paper's
    ImageNet top-1 of the same row (a dash where the paper has none): the rows of Tables 2 and 4 for the docs."""
    summary = results['summary']
    lines = [f'| Row | Paper (ImageNet) | Top-1, {results["settings"]["seeds"]} seeds | Minus token labeling '
             f'[{CONFIDENCE:.0%}] | Pretraining time, × vanilla |', '|---|---:|---:|---:|---:|']
    for variant in variants:
        paper = f'{paper_top1[variant]:.1f}' if variant in paper_top1 else '—'
        lines.append(f'| {VARIANTS[variant]} | {paper} | {cell(summary[variant]["top1"])} | '
                     f'{top1_minus_token_labeling(summary, variant)} | {time_cell(summary, variant)} |')
    return '\n'.join(lines)


def table7_beside_the_paper(results: dict, paper_table7: dict) -> str:
    """Table 7 for the docs: the paper's rows (top-1 and each head/mode mIoU), the transferred rows' mean ± std,
    then each transferred row minus token labeling in each head and mode, paired by seed."""
    columns = [(head, mode) for head in HEADS for mode in MODES]
    summary = results['summary']
    transfers = [variant for variant, entry in summary.items() if transferred(entry)]
    lines = ['| Pretraining | Top-1 | ' + ' | '.join(f'{HEADS[h]} {MODES[m]}' for h, m in columns) + ' |',
             '|---|' + '---:|' * (len(columns) + 1)]
    lines += [f'| paper: {VARIANTS[variant]} | {row["top1"]:.1f} | ' +
              ' | '.join(f'{row[h][m]:.1f}' for h, m in columns) + ' |' for variant, row in paper_table7.items()]
    lines += [f'| {VARIANTS[variant]} | {cell(summary[variant]["top1"])} | ' +
              ' | '.join(cell(summary[variant][h][m]['mIoU']) for h, m in columns) + ' |' for variant in transfers]
    # a transferred row minus token labeling, each head and mode (its top-1 difference is Tables 2 and 4's)
    lines += [f'| {VARIANTS[variant]} − token labeling | | ' +
              ' | '.join(describe_difference(summary[variant]['vs_token_labeling'][h][m]) for h, m in columns) + ' |'
              for variant in transfers if transferred(summary[variant].get('vs_token_labeling', {}))]
    return '\n'.join(lines)
