"""The reproduction's figures over seeds: per row, mean and standard deviation (and the fastest seed's time), and
each row against token labeling and the paper's other pairs, paired by seed."""
from __future__ import annotations

from classification.studies.reproduction.rows import (
    ANNOTATOR_ROWS,
    BASELINE,
    HEADS,
    MODES,
    PAIRS,
    PARTICIPATION,
    SEG_METRICS,
)
from classification.studies.statistics import mean_std, paired_difference


def summarise(runs: list[dict]) -> dict:
    """Per variant: mean and std over seeds of top-1, of the pretraining time and, for a transferred row, of every
    head/mode/metric; for each variant but token labeling, its paired difference from token labeling over the seeds
    both ran (`vs_token_labeling`)."""
    summary = {}
    for variant in dict.fromkeys(r['variant'] for r in runs):
        mine = [r for r in runs if r['variant'] == variant]
        entry = {'top1': mean_std([r['top1'] for r in mine]),
                 'train_seconds': fastest([r['train_seconds'] for r in mine])}
        if transferred(*mine):
            for head in HEADS:
                entry[head] = {mode: {key: mean_std([r[head][mode][key] for r in mine]) for key in SEG_METRICS}
                               for mode in MODES}
        summary[variant] = entry
    for variant, entry in summary.items():
        if variant != BASELINE and BASELINE in summary:
            entry['vs_token_labeling'] = compare(runs, variant)
    return summary


def fastest(seconds: list[float]) -> dict:
    """Mean and std of a row's pretraining times, and the fastest seed's: the row's cost (the seeds do the same
    work, and a machine shared with other jobs only ever adds time)."""
    return {**mean_std(seconds), 'fastest': min(seconds)}


def transferred(*records: dict) -> bool:
    """Whether every record (a run, a row's summary or its differences) holds segmentation figures: whether its
    backbones were transferred."""
    return all(head in record for record in records for head in HEADS)


def rates_run(summary: dict) -> list[int]:
    """The participation rates (Figure 4 left) whose rows ran."""
    return [rate for rate, variant in PARTICIPATION.items() if variant in summary]


def annotators_run(summary: dict, annotators: dict) -> list[str]:
    """The annotators (Figure 4 right) whose rows ran and whose facts are known."""
    return [name for name, variant in ANNOTATOR_ROWS.items() if variant in summary and name in annotators]


def compare(runs: list[dict], variant: str, baseline: str = BASELINE) -> dict:
    """`variant` against `baseline` (token labeling), seed by seed (the same seed: the same initialisation and data
    order): the paired difference of top-1 and, where both rows were transferred, of every head/mode mIoU."""
    by_seed = {(r['variant'], r['seed']): r for r in runs}
    seeds = [r['seed'] for r in runs if r['variant'] == variant and (baseline, r['seed']) in by_seed]
    pairs = [(by_seed[(variant, seed)], by_seed[(baseline, seed)]) for seed in seeds]

    def difference(value) -> dict:
        return paired_difference([value(mine) for mine, _ in pairs], [value(base) for _, base in pairs])

    result = {'top1': difference(lambda r: r['top1'])}
    if transferred(*(run for pair in pairs for run in pair)):
        for head in HEADS:
            result[head] = {mode: difference(lambda r, h=head, m=mode: r[h][m]['mIoU']) for mode in MODES}
    return result


def compare_pairs(runs: list[dict]) -> dict:
    """The paper's other comparisons (PAIRS) among the rows that ran, keyed 'ROW minus ROW'."""
    ran = {r['variant'] for r in runs}
    return {f'{variant} minus {baseline}': compare(runs, variant, baseline) for variant, baseline in PAIRS
            if variant in ran and baseline in ran}
