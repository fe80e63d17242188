"""The reproduction's figures: one per table of the paper with two rows run (top-1 bars, mIoU by head and test mode,
top-1 against the participation rate and by annotator)."""
from __future__ import annotations

import textwrap
from pathlib import Path

from classification.studies.reproduction.rows import ANNOTATOR_ROWS, HEADS, MODES, PARTICIPATION, TABLES, VARIANTS
from classification.studies.reproduction.summary import annotators_run, rates_run, transferred


def plot_tables(summary: dict, annotators: dict, out: Path, title: str) -> list[Path]:
    """One figure per table of the paper with two rows run: OUT/table2.png, table4.png (top-1 bars), table7.png
    (top-1 and every head/mode mIoU), figure4.png (top-1 against the participation rate; top-1 by annotator)."""
    from backbones.common.drawing import figure

    written = []

    def save(fig, name: str, table_title: str) -> None:
        fig.suptitle(f'{title}: {table_title}')
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        written.append(out / name)

    for table in ('2', '4'):
        rows = [variant for variant in TABLES[table] if variant in summary]
        if len(rows) >= 2:
            fig, axes = figure(1, 1, (1.0 + 0.9 * len(rows), 4.0))
            top1_bars(axes[0][0], summary, rows)
            save(fig, f'table{table}.png', f'Table {table}')
    transfers = [variant for variant, entry in summary.items() if transferred(entry)]
    if len(transfers) >= 2:
        fig, axes = figure(1, 2, (6.0, 4.5), width_ratios=[1, 3])
        top1_bars(axes[0][0], summary, transfers)
        miou_bars(axes[0][1], summary, transfers)
        save(fig, 'table7.png', 'Table 7')
    rates = rates_run(summary)
    names = annotators_run(summary, annotators)
    if len(rates) >= 2 or len(names) >= 2:
        fig, axes = figure(1, 2, (4.5, 4.0))
        if len(rates) >= 2:
            stats = [summary[PARTICIPATION[rate]]['top1'] for rate in rates]
            axes[0][0].errorbar(rates, [s['mean'] for s in stats], yerr=[s['std'] for s in stats], marker='o',
                                capsize=4)
            axes[0][0].set(xlabel='token participation rate (%)', ylabel='top-1 (%)', xticks=rates)
        if len(names) >= 2:
            top1_bars(axes[0][1], summary, [ANNOTATOR_ROWS[name] for name in names], [
                f'{name}\n{annotators[name]["params"] / 1e6:.1f}M, {annotators[name]["top1"]:.1f}%' for name in names])
            axes[0][1].set_xlabel('annotator (parameters, its top-1)')
        save(fig, 'figure4.png', 'Figure 4')
    return written


def top1_bars(ax, summary: dict, variants: list[str], labels: list[str] | None = None) -> None:
    """Top-1 of each row: mean with the standard deviation as its error bar."""
    stats = [summary[variant]['top1'] for variant in variants]
    ax.bar(range(len(variants)), [s['mean'] for s in stats], yerr=[s['std'] for s in stats], capsize=4,
           color=[row_colour(v) for v in variants])
    ax.set_xticks(range(len(variants)), labels or [textwrap.fill(VARIANTS[v], 13) for v in variants], fontsize=7)
    ax.set_ylabel('classification top-1 (%)')


def miou_bars(ax, summary: dict, variants: list[str]) -> None:
    """mIoU of each row for every head and test mode, grouped by head and mode."""
    groups = [(head, mode) for head in HEADS for mode in MODES]
    width = 0.8 / len(variants)
    for i, variant in enumerate(variants):
        stats = [summary[variant][head][mode]['mIoU'] for head, mode in groups]
        ax.bar([g + (i - (len(variants) - 1) / 2) * width for g in range(len(groups))], [s['mean'] for s in stats],
               width, yerr=[s['std'] for s in stats], capsize=3, color=row_colour(variant),
               label=VARIANTS[variant])
    ax.set_xticks(range(len(groups)), [f'{HEADS[h]} {MODES[m]}' for h, m in groups])
    ax.set_ylabel('segmentation mIoU (%)')
    ax.legend(loc='lower right', fontsize=7)


def row_colour(variant: str) -> str:
    """A row's colour, the same in every figure."""
    return f'C{list(VARIANTS).index(variant) % 10}'
