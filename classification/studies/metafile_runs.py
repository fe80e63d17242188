"""The dense runs of seg_configs/metafile.yaml as a page shows them (`runs` blocks): the embedded defaults whose
results are of the tasks named (mmseg's and mmdet's Task), each a list item (the digits pretraining, the training,
the scores shown with their spread over seeds, what they compare with, the times), or each config's latest run in a
table (`runs latest TASK...`); the runs on the pages in a published set's layout with `runs layouts TASK...`."""
from __future__ import annotations

from pathlib import Path

from backbones.common.errors import DataError
from classification.studies.figure_formats import duration, spread, wrapped
from classification.studies.results_data import DataFiles


def embedded_runs(files: DataFiles, *tasks: str) -> str:
    """The metafile's runs of the embedded defaults of `tasks` (`latest` first, or `layouts` first), as items."""
    latest, in_layouts = tasks[:1] == ('latest',), tasks[:1] == ('layouts',)
    runs = embedded_defaults(files, tasks[1:] if latest or in_layouts else tasks, in_layouts)
    if not latest:
        return '\n'.join(run_item(run) for run in runs)
    newest = {run['Config']: run for run in sorted(runs, key=lambda run: str(run['Metadata']['Date']))}
    return '\n'.join(['| config, commit | scores on the validation pages | total time |', '|---|---|---|'] +
                     [f'| {run_name(run)} | **{shown_scores(run)}** | {total_time(run)} |' for run in newest.values()])


def run_item(run: dict) -> str:
    """A run as a list item: its digits pretraining, training, scores, total time, and what the scores compare with."""
    meta = run['Metadata']
    pretraining = meta['Pretraining']
    time = (f'{run_seconds(run, "Pretraining Time", pretraining["Time (s)"])} ({pretraining["Includes"]} included)'
            if 'Time (s)' in pretraining else pretraining['Includes'])
    shown = shown_metrics(run)
    baselines = '; '.join(f'{b["Name"]}: ' + ', '.join(score(key, value, shown) for key, value in b['Metrics'].items())
                          for b in meta.get('Baselines', ()))
    return wrapped(f'- {run_name(run)}: pretraining on the digits {pretraining["Top 1 Accuracy"]:.1f}% top-1, {time}; '
                   f'training {meta["lr schd"]} iterations, {run_seconds(run, "Training Time")}; scores on the '
                   f'validation pages **{shown_scores(run)}**; total {total_time(run)}.'
                   + (f' For comparison, {baselines}.' if baselines else ''), indent='  ')


def total_time(run: dict) -> str:
    """A run's total time, and what it did not include where its backbone came from an earlier run."""
    pretraining = run['Metadata']['Pretraining']
    reused = '' if 'Time (s)' in pretraining else f' (pretraining: {pretraining["Includes"]})'
    return run_seconds(run, 'Total Time') + reused


def embedded_defaults(files: DataFiles, tasks: tuple[str, ...], in_layouts: bool = False) -> list[dict]:
    """The metafile's runs of the embedded defaults with a result of one of `tasks`: on the pages written in a
    published set's layout (their Metadata's `Layout`) if `in_layouts`, else on the pages in the suite's own."""
    runs = [model for model in files['metafile']['Models'] if model['Metadata'].get('Embedded Default')
            and bool(model['Metadata'].get('Layout')) == in_layouts
            and {result['Task'] for result in results_of(model)} & set(tasks)]
    found = {result['Task'] for run in runs for result in results_of(run)}
    missing = [task for task in tasks if task not in found] or ([] if tasks else ['a task'])
    if missing:
        raise DataError(f'{files.path("metafile")}: no embedded default of {", ".join(missing)}')
    return runs


def run_name(run: dict) -> str:
    return (f'{Path(run["Config"]).stem} at {run["Metadata"]["Commit"]}'
            f'{" (fresh checkout)" if run["Metadata"].get("Fresh Checkout") else ""}')


def run_seconds(run: dict, key: str, seconds: float | None = None) -> str:
    """A run's time `key` (Metadata's '`key` (s)', or `seconds`), 'about' where the metafile says Approximate."""
    meta = run['Metadata']
    seconds = meta[f'{key} (s)'] if seconds is None else seconds
    return ('about ' if key in meta.get('Approximate', ()) else '') + duration(seconds)


def results_of(model: dict) -> list[dict]:
    """A metafile model's results: mmseg's one, or mmdet's list of one per task."""
    results = model['Results']
    return results if isinstance(results, list) else [results]


def run_metrics(model: dict) -> dict[str, object]:
    """A metafile model's metrics, of all its results."""
    return {key: value for result in results_of(model) for key, value in result['Metrics'].items()}


def shown_metrics(model: dict) -> dict[str, str | None]:
    """The metrics a run's item or row shows and their formats (`Metadata.Shown`; else its first metric)."""
    return model['Metadata'].get('Shown') or {next(iter(run_metrics(model))): None}


def score(key: str, value: float, shown: dict[str, str | None]) -> str:
    """'mask AP 58.2': a metric with the format `shown` gives it, one decimal where it gives none."""
    return f'{key} {value:{shown.get(key) or ".1f"}}'


def shown_scores(model: dict) -> str:
    """The scores a run's item or row shows (`Shown`'s formats), mIoU with its spread over the seeds."""
    metrics, shown = run_metrics(model), shown_metrics(model)
    parts = []
    for key in shown:
        text = score(key, metrics[key], shown)
        if f'{key} by seed' in metrics:
            text += f' (seeds {", ".join(map(str, model["Metadata"]["Seeds"]))}: {spread(metrics[f"{key} by seed"])})'
        parts.append(text)
    return ', '.join(parts)

