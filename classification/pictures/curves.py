"""Training curves of one or several runs in one figure: loss, accuracy (top-1 and its EMA, or mIoU) and learning rate
against epoch or iteration, read from the runs' own logs: `log.jsonl` of the classification tools (one line per
epoch) and mmengine's `*/vis_data/scalars.json` of the segmentation tools (one line per logged iteration, and one
per validation)."""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from backbones.common.drawing import figure, finished
from backbones.common.errors import DataError

Series = tuple[list[float], list[float]]  # x, y


@dataclass
class RunCurves:
    name: str
    x_label: str  # 'epoch' or 'iteration'
    series: dict[str, Series] = field(default_factory=dict)  # loss, lr, top1, ema_top1, mIoU


def _json_lines(path: Path) -> list[dict]:
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise DataError(f'{path}, line {number}: not JSON ({e})') from e
    return records


def _series(records: list[dict], x_key: str, y_key: str) -> Series:
    points = sorted({r[x_key]: r[y_key] for r in records if y_key in r and x_key in r}.items())
    return [float(x) for x, _ in points], [float(y) for _, y in points]


def read_run(run_dir: str | Path) -> RunCurves:
    """The curves of a run folder: a classification run's `log.jsonl`, or an mmengine run's (resumes merged)."""
    run_dir = Path(run_dir)
    if (run_dir / 'log.jsonl').is_file():
        records = _json_lines(run_dir / 'log.jsonl')
        run = RunCurves(run_dir.name, 'epoch')
        for key, name in (('train_loss', 'loss'), ('lr', 'lr'), ('top1', 'top1'), ('ema_top1', 'ema_top1')):
            run.series[name] = _series(records, 'epoch', key)
        return run
    logs = sorted(run_dir.glob('*/vis_data/scalars.json'))
    if not logs:
        raise DataError(f'{run_dir}: no log.jsonl (classification) and no */vis_data/scalars.json (mmengine) in it')
    records = [r for path in logs for r in _json_lines(path)]
    run = RunCurves(run_dir.name, 'iteration')
    for key in ('loss', 'lr', 'mIoU'):
        run.series[key] = _series(records, 'step', key)
    return run


PANELS = (('loss', 'training loss', ('loss',)), ('accuracy', 'accuracy (%)', ('top1', 'ema_top1', 'mIoU')),
          ('lr', 'learning rate', ('lr',)))
STYLES = {'top1': '-', 'ema_top1': '--', 'mIoU': '-'}


def curves_figure(runs: Sequence[RunCurves]) -> np.ndarray:
    """Loss, accuracy and learning rate of every run, one colour a run (dashed: EMA top-1)."""
    fig, axes = figure(1, len(PANELS), size=(4.4, 3.4))
    x_labels = sorted({run.x_label for run in runs})
    for (name, title, keys), ax in zip(PANELS, axes[0]):
        for colour, run in enumerate(runs):
            for key in keys:
                xs, ys = run.series.get(key, ([], []))
                if xs:
                    label = run.name if key in ('loss', 'lr', 'top1', 'mIoU') else f'{run.name} (EMA)'
                    if name == 'accuracy':
                        label += f' {key}' if key != 'ema_top1' else ''
                    ax.plot(xs, ys, STYLES.get(key, '-'), color=f'C{colour}', label=label,
                            marker='.' if len(xs) < 30 else None)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(' / '.join(x_labels))
        if name == 'lr' and any(run.series.get('lr', ([], []))[1] for run in runs):
            ax.set_yscale('log')
        ax.grid(alpha=0.3)
    axes[0, 1].legend(fontsize=7)
    return finished(fig)
