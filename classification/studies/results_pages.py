"""The figures README.md and docs/*.md quote, rendered from their data files (tools/render_results.py).

Every figure lives in one data file: a results file, docs/results/NAME.json, in the envelope of
`classification.studies.results_file` (study, source, commit, date, machine, torch, figures), or the dense runs'
metafile, seg_configs/metafile.yaml (mmseg's schema, with mmdet's list of Results per task). A page holds renderings
of them only, each between markers that name what renders it:

    <!-- results: KIND ARGS -->...<!-- /results -->

ARGS are shell-style words; FILE is a results file's name without `.json`. The kinds:

- `table FILE [ALIAS=FILE ...]`, the marker's next lines a Markdown table whose cells hold `{EXPRESSION}` or
  `{EXPRESSION:FORMAT}`: the table with every figure filled in from the first FILE (`{ALIAS#EXPRESSION}` from
  another); a `|` in a figure is escaped.
- `view FILE VIEW ARGS`: what FILE's study renders as VIEW (VIEWS: the reproduction's tables, a GPU session's).
- `runs [latest|layouts] TASK...`: the metafile's runs of the embedded defaults of the TASKs (their Results' Task)
  on the pages in the suite's own layout; `layouts`: those on the pages written in a published set's layout (their
  Metadata's `Layout`).
- `value FILE EXPRESSION [FORMAT]`: one figure inside a sentence (the only inline kind, with the `seeds` view).

Every block but an inline one ends with a line crediting each file it read: where and when its figures were
measured, with a link to it. A block stands on a line of its own.

An EXPRESSION is a figure's path, keys joined by dots (a list item by its index or by its Name; the envelope's keys
name its own fields, any other the figures'): no arithmetic, a figure a page shows (a ratio, a difference) is one its
results file holds. A FORMAT is a Python format (`.1f`, `,.0f`, `.0%`; a `value`'s whole `{:.1f}%`) or one of
FORMATS. Blocks stand on lines of their own and are rendered between blank lines, at their marker's indentation (a
table inside a list item). `render_pages(root)` rewrites every block of the pages under `root`, or names those whose
text is not what their data give.
"""
from __future__ import annotations

import inspect
import json
import os
import re
import shlex
import textwrap
from collections.abc import Callable
from pathlib import Path

import yaml

from backbones.common.cli import command_parser
from backbones.common.errors import DataError, UsageError
from backbones.common.files import write_text_atomic
from backbones.common.log import logger
from classification.studies.launcher import REPOSITORY
from classification.studies.reproduction import tables as reproduction
from classification.studies.results_file import PUBLISHED, check_envelope
from classification.studies.statistics import describe_difference, mean_std

RESULTS = Path('docs/results')
METAFILE = Path('seg_configs/metafile.yaml')
PAGES = ('README.md', 'docs/*.md')
MARKER = re.compile(r'<!--\s*/?\s*results?\b')  # every results marker, opening or closing, well formed or not
BLOCK = re.compile(r'<!-- results: (?P<spec>.*?)(?P<end>\s)-->(?P<body>.*?)<!-- /results -->', re.S)
CELL = re.compile(r'\{(?P<expression>[^{}:]+)(?::(?P<form>[^{}]*))?\}')  # a table cell's {EXPRESSION:FORMAT}
OWN_FIELDS = ('study', 'source', 'commit', 'date', 'machine', 'torch', 'notes')  # the envelope's, beside figures
WIDTH = 118  # a rendered paragraph's lines
MODEL_NAMES = {'lvvit_s': 'LV-ViT-S', 'deit_small_patch16_224': 'DeiT-S'}


class DataFiles:
    """The data files under a repository root, each read once (and a results file checked for its envelope):
    `metafile`, or the name of a docs/results file without `.json`."""

    def __init__(self, root: Path) -> None:
        self.root, self.loaded = root, {}
        self.read: dict[str, None] = {}  # the files read since it was last cleared, in order: what a block credits

    def path(self, name: str) -> Path:
        return self.root / (METAFILE if name == 'metafile' else RESULTS / f'{name}.json')

    def __getitem__(self, name: str) -> dict:
        self.read[name] = None
        if name not in self.loaded:
            path = self.path(name)
            if not path.is_file():
                raise DataError(f'{path}: {"not a file" if path.exists() else "no such data file"}')
            try:
                text = path.read_text()
                data = yaml.safe_load(text) if path.suffix == '.yaml' else json.loads(text)
            except (ValueError, yaml.YAMLError) as exc:
                raise DataError(f'{path}: not readable as {path.suffix[1:]}: {exc}') from None
            self.loaded[name] = data if name == 'metafile' else check_envelope(data, str(path))
        return self.loaded[name]

    def figures(self, name: str) -> dict:
        return self[name]['figures']

    def lookup(self, name: str, path: str) -> object:
        """A figure of a results file (or a field of its envelope: `commit`, `notes.machine`), or of the metafile."""
        data = self[name]
        if name != 'metafile' and path.split('.')[0] not in OWN_FIELDS:
            data = data['figures']
        return lookup(data, path, str(self.path(name)))


def lookup(data: object, path: str, where: str) -> object:
    """The value at `path` in `data`: keys joined by dots, a list item by its index or its Name."""
    value = data
    for key in path.split('.'):
        if isinstance(value, list):
            found = [item for i, item in enumerate(value) if key in (str(i), item_name(item))]
            value = found[0] if found else None
        elif isinstance(value, dict) and value.get(key, ...) is None:
            raise DataError(f'{where}: {path} is null (at {key!r})')
        else:
            value = value.get(key) if isinstance(value, dict) else None
        if value is None:
            raise DataError(f'{where}: no {path} (stopped at {key!r})')
    return value


def item_name(item: object) -> str | None:
    return item.get('Name') if isinstance(item, dict) else None


def duration(seconds: float) -> str:
    """'3 min 27 s', '45 s', '2 min'."""
    minutes, rest = divmod(round(seconds), 60)
    if not minutes:
        return f'{rest} s'
    return f'{minutes} min' + (f' {rest} s' if rest else '')


def spread(values: list[float]) -> str:
    """Per-seed values as '71.7 ± 1.7' (mean ± sample standard deviation; the text around it names the seeds)."""
    if not isinstance(values, list) or not values:
        raise DataError(f'spread needs a list of per-seed values, got {values!r}')
    return reproduction.cell(mean_std(values))


def rate(images_per_second: float) -> str:
    """Images/s as the tables print them: whole numbers with thousands separators from 100 up, else one decimal."""
    return f'{images_per_second:,.0f}' if images_per_second >= 100 else f'{images_per_second:.1f}'


FORMATS: dict[str, Callable[[object], str]] = {
    'cell': reproduction.cell,  # mean ± std
    'difference': describe_difference,  # '-5.6 [-12.8, +1.5] (within noise)'
    'duration': duration,
    'rate': rate,
    'spread': spread,  # [71.5, 72.1, ...] -> '71.7 ± 1.7'
}


def formatted(value: object, form: str) -> str:
    """`value` written by one of FORMATS or a Python format; a figure a Python format is given is a number or a word
    (not a list, a mapping or a truth value)."""
    if form not in FORMATS and '{' not in form:  # a table cell's spec (`.1f`) given to a value block
        form = f'{{:{form}}}'
    if form not in FORMATS and (isinstance(value, (dict, list, bool)) and form != '{}' or isinstance(value, dict)):
        raise DataError(f'format {form!r} cannot write {value!r}: not a single figure')
    try:
        return FORMATS[form](value) if form in FORMATS else form.format(value)
    except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError) as exc:
        raise DataError(f'format {form!r} cannot write {value!r}: {exc!r}') from None


def measured(document: dict, link: str) -> str:
    """Where and when a results file's figures were measured, with a link to it: '2 CPU cores, torch 2.15.0, commit
    c24ec1c, 2026-11-28 ([results/...](results/...))', a study run in stages at several commits naming each
    (`figures.commits`); a publication's: its source."""
    if document['machine'].startswith(PUBLISHED):
        return f'{document["source"]} ({link})'
    stages = document['figures'].get('commits')
    if isinstance(stages, dict):
        commit = 'commits ' + ', '.join(f'{value} ({key})' for key, value in stages.items())
    else:
        commit = f'commit {document["commit"] or document["notes"]["commit"]}'
    torch = f'torch {document["torch"]}, ' if document['torch'] else ''
    return f'{document["machine"]}, {torch}{commit}, {document["date"]} ({link})'


# ---- the kinds of block: each (the page's blocks' context, its words) -> its text


class Page:
    """What a block is rendered for: the data files, and the page's place (links to the data are relative to it)."""

    def __init__(self, files: DataFiles, path: Path) -> None:
        self.files, self.path = files, path

    def link(self, name: str) -> str:
        target = Path(os.path.relpath(self.files.path(name), self.path.parent))
        return f'[{target.name}]({target})'

    def credits(self) -> str:
        """The line under a block: where and when each file it read was measured."""
        return wrapped('; '.join(self.measured(name) for name in self.files.read) + '.')

    def measured(self, name: str) -> str:
        if name == 'metafile':  # its runs name their own commit, date and machine
            return f'Each run\'s commit, date and machine: {self.link(name)}'
        return measured(self.files[name], self.link(name))


def value(page: Page, name: str, expression: str, form: str = '{}') -> str:
    return formatted(page.files.lookup(name, expression), form)


def table(page: Page, *sources: str, template: list[str]) -> str:
    """The marker's template lines with each `{EXPRESSION[:FORMAT]}` filled from the first of `sources` (each a
    results file's name, or `ALIAS=NAME`; `{ALIAS#EXPRESSION}` reads another of them)."""
    if not sources:
        raise UsageError('table: name the results file(s) it reads')
    names = dict(source.partition('=')[::2] if '=' in source else (source, source) for source in sources)
    if not template or not all(line.lstrip().startswith('|') for line in template):
        raise UsageError(f'table {sources[0]}: give its lines, each starting with |, on the lines after the marker')
    first = next(iter(names.values()))

    def fill(found: re.Match) -> str:
        alias, _, path = found['expression'].strip().rpartition('#')
        if alias and alias not in names:
            raise UsageError(f'{found["expression"]}: {alias} is not one of the table\'s files ({", ".join(names)})')
        figure = page.files.lookup(names[alias] if alias else first, path)
        return formatted(figure, found['form'] or '{}').replace('|', '\\|')

    return '\n'.join(CELL.sub(fill, line.strip()) for line in template)


def wrapped(text: str) -> str:
    """A paragraph in lines of at most WIDTH characters (a page's source stays readable; links are not broken)."""
    return textwrap.fill(text, WIDTH, break_long_words=False, break_on_hyphens=False)


def view(page: Page, name: str, kind: str, *args: str) -> tuple[str, bool]:
    """What the study of results file `name` renders as `kind` (VIEWS), and whether it is inline."""
    study = page.files[name]['study']
    views = VIEWS.get(study, {})
    if kind not in views:
        raise UsageError(f'{page.files.path(name)}: study {study} has no view {kind!r}'
                         f'{" (its views: " + ", ".join(views) + ")" if views else ""}')
    render, inline = views[kind]
    check_words(render, f'view {kind}', page.files, name, *args)
    return render(page.files, name, *args), inline


# ---- the studies' views: each (data files, the results file's name, its words) -> its text


def seeds(files: DataFiles, name: str, variant: str, path: str, form: str = '{:.1f}') -> str:
    """A row's per-seed values in seed order, 'a / b / c' (the runs a reproduction holds)."""
    runs = [run for run in files.lookup(name, 'runs') if run['variant'] == variant]
    if not runs:
        raise DataError(f'{files.path(name)}: no runs of {variant}')
    return ' / '.join(formatted(lookup(run, path, f'{files.path(name)}: {variant} seed {run["seed"]}'), form)
                      for run in sorted(runs, key=lambda r: r['seed']))


def reproduction_table(files: DataFiles, name: str) -> str:
    """The reproduction tool's own table.md."""
    results = files.figures(name)
    return reproduction.markdown_table(results['summary'], results['model'], results['settings']['seeds'],
                                       results['annotators']).strip()


def reproduction_rows(files: DataFiles, name: str, paper: str, *variants: str) -> str:
    """The named rows of the reproduction beside the paper's ImageNet top-1 (Tables 2 and 4; `paper`: its file)."""
    unknown = [variant for variant in variants if variant not in files.figures(name)['summary']]
    if unknown:
        raise DataError(f'{files.path(name)}: no row {", ".join(unknown)}')
    return reproduction.rows_beside_the_paper(files.figures(name), files.figures(paper)['top1'], list(variants))


def reproduction_table7(files: DataFiles, name: str, paper: str) -> str:
    return reproduction.table7_beside_the_paper(files.figures(name), files.figures(paper)['table7'])


def reproduction_figure4(files: DataFiles, name: str) -> str:
    results = files.figures(name)
    return (reproduction.participation_table(results['summary']) + '\n\n' +
            reproduction.annotator_table(results['summary'], results['annotators']))


def embedded_runs(page: Page, *tasks: str) -> str:
    """The metafile's runs of the embedded defaults whose results are of one of `tasks` (mmseg's and mmdet's Task):
    the digits pretraining, the training, the scores shown (with their spread over seeds), what they compare with,
    and the times; runs on the pages in a published set's layout with `runs layouts TASK...`, the others without.
    `runs latest TASK...`: each config's latest run alone, its scores and total time."""
    latest, in_layouts = tasks[:1] == ('latest',), tasks[:1] == ('layouts',)
    runs = embedded_defaults(page.files, tasks[1:] if latest or in_layouts else tasks, in_layouts)
    if latest:
        newest = {run['Config']: run for run in sorted(runs, key=lambda run: str(run['Metadata']['Date']))}
        return '\n'.join(['| config, commit | scores on the validation pages | total time |', '|---|---|---|'] +
                         [f'| {run_name(run)} | **{shown_scores(run)}** | {total_time(run)} |'
                          for run in newest.values()])
    compared = any(run['Metadata'].get('Baselines') for run in runs)
    lines = ['| config, commit | pretraining on the digits: top-1, time | training | scores on the validation pages |'
             + (' for comparison |' if compared else '') + ' total |',
             '|---|---|---|---|' + ('---|' if compared else '') + '---|']
    for run in runs:
        meta = run['Metadata']
        pretraining = meta['Pretraining']
        time = (f'{run_seconds(run, "Pretraining Time", pretraining["Time (s)"])} ({pretraining["Includes"]} '
                f'included)' if 'Time (s)' in pretraining else pretraining['Includes'])
        baselines = '; '.join(f'{b["Name"]}: {metric_list(b["Metrics"], shown_metrics(run))}'
                              for b in meta.get('Baselines', ()))
        cells = [run_name(run), f'{pretraining["Top 1 Accuracy"]:.1f}%, {time}',
                 f'{meta["lr schd"]} iterations, {run_seconds(run, "Training Time")}', f'**{shown_scores(run)}**',
                 *([baselines] if compared else []), total_time(run)]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


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
    """A run's time `key` ('Training Time': Metadata's 'Training Time (s)', or `seconds`), 'about' where the
    metafile lists it as Approximate."""
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
    """The metrics a run's table row shows and their formats (`Metadata.Shown`; else its first metric)."""
    return model['Metadata'].get('Shown') or {next(iter(run_metrics(model))): None}


def score(key: str, value: float, shown: dict[str, str | None]) -> str:
    """'mask AP 58.2': a metric with the format `shown` gives it, one decimal where it gives none."""
    return f'{key} {value:{shown.get(key) or ".1f"}}'


def metric_list(metrics: dict, shown: dict[str, str | None]) -> str:
    return ', '.join(score(key, value, shown) for key, value in metrics.items())


def shown_scores(model: dict) -> str:
    """The scores a run's table row shows, one decimal unless `Shown` gives a format, mIoU with its spread over the
    seeds the model lists (`Metadata.Seeds`, `Metrics.mIoU by seed`)."""
    metrics, shown = run_metrics(model), shown_metrics(model)
    parts = []
    for key in shown:
        text = score(key, metrics[key], shown)
        if f'{key} by seed' in metrics:
            text += f' (seeds {", ".join(map(str, model["Metadata"]["Seeds"]))}: {spread(metrics[f"{key} by seed"])})'
        parts.append(text)
    return ', '.join(parts)


def gpu_session_table(files: DataFiles, name: str) -> str:
    """What one GPU session (tools/measure_gpu.py) measured, a row per figure it holds, then what it did not."""
    session = files.figures(name)
    rows, missing = [], []
    for label, describe in GPU_FIGURES:
        text = describe(session)
        if text:
            rows.append(f'| {label} | {text} |')
        else:
            missing.append(label)
    head = '| | |'
    note = f'\n\nNot measured in this session: {"; ".join(missing)}.' if missing else ''
    return '\n'.join([head, '|---|---|', *rows]) + note


def loop_figures(session: dict) -> dict | None:
    document = session.get('loop_benchmark')
    return document['models'][0] if document and document.get('models') else None


INPUT_BOUND = ' (input-bound: it says nothing of the step)'


def bound_note(input_bound: bool) -> str:
    """What a ratio of two loops measured under the same bound can say: under the input pipeline, only how their
    pipelines compare."""
    return INPUT_BOUND if input_bound else ''


def gpu_against_timm(session: dict) -> str:
    f = loop_figures(session)
    if not f or 'timm_train' not in f:
        return ''
    return (f'`train_cls` {rate(f["train_cls"]["img_s"])} img/s, timm\'s `train.py` {rate(f["timm_train"]["img_s"])} '
            f'img/s: **x{f["timm_train"]["suite_ratio"]:.2f}**{bound_note(f["bound"] == "input pipeline")}')


def gpu_loop(session: dict) -> str:
    f = loop_figures(session)
    if not f or 'loop' not in f:
        return gpu_loop_from_progress(session)
    serial = (f', serial loop {rate(f["loop"]["serial_img_s"])} img/s (overlap x{f["loop"]["overlap_gain"]:.2f})'
              f'{bound_note(f["bound"] == "input pipeline")}' if 'serial_img_s' in f['loop'] else '')
    return (f'loop {rate(f["loop"]["img_s"])} img/s against its step\'s {rate(f["model_step_img_s"])}: '
            f'**x{f["loop"]["of_step"]:.2f}**{serial}; bound by the {f["bound"]}')


def gpu_loop_from_progress(session: dict) -> str:
    """The loop against its step from the benchmark's progress lines, where it stopped before its document (a later
    window failed): the same steady-state windows, logged as each was measured."""
    progress = session.get('loop_benchmark_progress', {})

    def figure(prefix: str) -> float | None:
        return next((value for label, value in progress.items() if label.startswith(prefix)), None)

    loop, step = figure('whole loop, batched path, overlapped'), figure('model step')
    if loop is None or step is None:
        return ''
    # the batched path's pipeline with the most loader workers (the one the loop ran with); the bound as the
    # benchmark names it: the slower of that pipeline and the step
    pipelines = {int(found[1]): value for label, value in progress.items()
                 if (found := re.fullmatch(r'input pipeline, batched path, (\d+) workers', label))}
    pipeline = pipelines[max(pipelines)] if pipelines else None
    input_bound = pipeline is not None and pipeline < step
    bound = f'the input pipeline ({rate(pipeline)} img/s, batched path)' if input_bound else 'the model step'
    serial = figure('whole loop, batched path, serial')
    serial_text = (f', serial loop {rate(serial)} img/s (overlap x{loop / serial:.2f}){bound_note(input_bound)}'
                   if serial else '')
    return (f'loop {rate(loop)} img/s against its step\'s {rate(step)}: **x{loop / step:.2f}**{serial_text}; bound by '
            f'{bound} (from the benchmark\'s progress lines: its later train_cls window failed)')


def gpu_step(kind: str) -> Callable[[dict], str]:
    def describe(session: dict) -> str:
        steps = session.get('step', {}).get('models', {})
        parts = []
        for model, figures in steps.items():
            step = figures.get(kind)
            if step:
                mfu = (f', MFU {step["mfu"]:.1%} of {step["peak_tflop_s"]:g} TFLOP/s' if step.get('mfu') is not None
                       else '')
                ratio = (f', x{figures["compiled_over_eager"]:.2f} the eager step'
                         if kind == 'compiled' and 'compiled_over_eager' in figures else '')
                parts.append(f'{MODEL_NAMES.get(model, model)}: {rate(step["img_s"])} img/s '
                             f'({step["tflop_s"]:.0f} TFLOP/s{mfu}){ratio}')
        return '; '.join(parts)
    return describe


def gpu_tests(session: dict) -> str:
    tests = session.get('gpu_tests')
    if not tests:
        return ''
    failures = ''.join(f'; failed: `{name}` ({why})' for name, why in tests.get('failures', {}).items())
    stopped = ' (stopped by its time limit)' if tests.get('timed_out') else ''
    return (f'{tests["passed"]} passed, {tests["failed"]} failed of {tests["passed"] + tests["failed"]} in '
            f'{duration(tests["seconds"])}{stopped}{failures}')


def against(name: str, fast: float, base_name: str, base: float) -> str:
    """Two rates and their ratio: '<name> R img/s, <base_name> B img/s (xR/B)'."""
    return f'{name} {rate(fast)} img/s, {base_name} {rate(base)} img/s (x{fast / base:.2f})'


def gpu_decoding(session: dict) -> str:
    decoding = session.get('decoding')
    if not decoding or 'gpu_img_s' not in decoding:
        return ''
    return f'{decoding["workers"]} workers: ' + against('nvJPEG', decoding['gpu_img_s'], "the workers' decoding",
                                                        decoding['cpu_img_s'])


def gpu_labels(session: dict) -> str:
    labels = session.get('label_generation')
    if not labels or 'bf16_img_s' not in labels:
        return ''
    return f'{labels["annotator"]} at {labels["img_size"]} px: ' + against('bf16', labels['bf16_img_s'], 'fp32',
                                                                          labels['fp32_img_s'])


def gpu_decoded_loop(key: str, compiled: bool) -> Callable[[dict], str]:
    """A loop stage's row (gpu_session.loop_stage): the loop against its step in the same process, its data wait."""
    def describe(session: dict) -> str:
        stage = session.get(key)
        figures = next(iter(stage['models'].values()), {}).get('compiled' if compiled else 'eager') if stage else None
        if not figures:
            return ''
        wait = f', waiting for data {figures["data_wait"]:.0%} of the pass' if figures['data_wait'] is not None else ''
        return (f'--decode {stage["decode"]}, {stage["workers"]} workers: loop {rate(figures["loop_img_s"])} img/s '
                f'against its step\'s {rate(figures["step_img_s"])}: **x{figures["loop_of_step"]:.2f}**{wait}')
    return describe


def gpu_dense_steps(session: dict) -> str:
    """The dense_steps stage's row: each config's step, its batch and largest image, its peak device memory."""
    configs = session.get('dense_steps', {}).get('configs', {})
    parts = []
    for name, step in configs.items():
        height, width = step['largest_image']
        memory = f', {step["peak_memory_gib"]:.1f} GiB at its peak' if step['peak_memory_gib'] is not None else ''
        parts.append(f'`{name}` {rate(step["img_s"])} img/s '
                     f'({step["it_s"]:.2f} it/s of {step["batch_size"]}, up to {width}x{height}{memory})')
    # the dense_windows stage's (dense_steps held them before it was a stage of its own)
    windows = session.get('dense_windows') or session.get('dense_steps', {}).get('windows')
    if windows:
        parts.append(f'Mask R-CNN with window attention against global attention: x{windows["time_ratio"]:.2f} the '
                     f'time of a step, x{windows["memory_ratio"]:.2f} the memory')
    return '; '.join(parts)


# the GPU session's figures in the order of value
GPU_FIGURES = (('the whole loop against its eager step (DeiT-S)', gpu_decoded_loop('deit_loop', compiled=False)),
               ('the compiled loop against its compiled step (DeiT-S)', gpu_decoded_loop('deit_loop', compiled=True)),
               ('the same for LV-ViT-S with token labeling, eager', gpu_decoded_loop('lvvit_loop', compiled=False)),
               ('the same, compiled', gpu_decoded_loop('lvvit_loop', compiled=True)),
               ("the suite against timm's `train.py` (DeiT-S, steady state)", gpu_against_timm),
               ('the whole loop against its step (DeiT-S, the workers decoding)', gpu_loop),
               ("the trainer's step, eager (bf16, fused AdamW, channels-last)", gpu_step('eager')),
               ('the same, compiled (`--compile`)', gpu_step('compiled')),
               ('the GPU suite (`pytest -m gpu`)', gpu_tests),
               ('nvJPEG decoding (`--decode gpu`)', gpu_decoding),
               ('bf16 label generation (`generate_token_labels --amp bf16`)', gpu_labels),
               ("the dense training steps (LV-ViT-S, fp32, each config's per-GPU batch)", gpu_dense_steps))

# the studies' views: study -> view -> (renderer, inline)
VIEWS: dict[str, dict[str, tuple[Callable[..., str], bool]]] = {
    'reproduction': {'table': (reproduction_table, False), 'rows': (reproduction_rows, False),
                     'table7': (reproduction_table7, False), 'figure4': (reproduction_figure4, False),
                     'seeds': (seeds, True)},
    'gpu_session': {'table': (gpu_session_table, False)},
}


# the kinds of block: kind -> (renderer, inline); a view's inline is its study's
KINDS: dict[str, tuple[Callable[..., str], bool]] = {'table': (table, False), 'view': (view, False),
                                                   'runs': (embedded_runs, False), 'value': (value, True)}


def render_block(page: Page, spec: str) -> tuple[str, bool]:
    """(a block's text, whether it is inline) from its marker's words, which may go on over several lines (a table's
    lines, starting with |, after them)."""
    lines = [line.strip() for line in spec.split('\n')]
    template = [line for line in lines if line.startswith('|')]
    first = ' '.join(line for line in lines if line and not line.startswith('|'))
    try:
        words = shlex.split(first)
    except ValueError as exc:  # an unbalanced quote
        raise UsageError(f'results block {first!r}: {exc}') from None
    kind, args = (words[0], words[1:]) if words else ('', [])
    if kind not in KINDS:
        raise UsageError(f'unknown results block {first!r}: {", ".join(KINDS)}')
    if template and kind != 'table':
        raise UsageError('only a table\'s marker holds a table\'s lines')
    page.files.read.clear()
    if kind == 'table':
        check_words(table, 'table', page, *args, template=template)
        text, inline = table(page, *args, template=template), False
    elif kind == 'view':
        text, inline = view(page, *args)
    else:
        render, inline = KINDS[kind]
        check_words(render, kind, page, *args)
        text = render(page, *args)
    return (text, True) if inline else (f'{text}\n\n{page.credits()}', False)


def check_words(render: Callable[..., str], kind: str, *args: object, **kwargs: object) -> None:
    """A UsageError where a block gives its renderer too few or too many words."""
    try:
        inspect.signature(render).bind(*args, **kwargs)
    except TypeError as exc:
        raise UsageError(f'{kind}: {exc}') from None


def render_text(text: str, page: Page) -> tuple[str, list[tuple[str, int]]]:
    """`text` with every block rendered, and the blocks that changed: (marker's first line, line)."""
    changed = []

    def replace(match: re.Match) -> str:
        line = text.count('\n', 0, match.start()) + 1
        try:
            rendered, inline = render_block(page, match['spec'])
        except (DataError, UsageError) as exc:
            raise type(exc)(f'{page.path.relative_to(page.files.root)}:{line}: {exc}') from None
        if not inline:
            indent = text[text.rfind('\n', 0, match.start()) + 1:match.start()]
            if indent.strip():
                raise UsageError(f'{page.path.relative_to(page.files.root)}:{line}: a {match["spec"].split()[0]} '
                                 f'block stands on a line of its own (text before its marker: {indent.strip()!r})')
            rendered = '\n\n' + '\n'.join(indent + line if line else '' for line in rendered.split('\n')) + \
                       '\n\n' + indent
        if rendered != match['body']:
            changed.append((match['spec'].split('\n')[0], line))
        return f'<!-- results: {match["spec"]}{match["end"]}-->{rendered}<!-- /results -->'

    check_markers(text, page)
    return BLOCK.sub(replace, text), changed


def check_markers(text: str, page: Page) -> None:
    """Every results marker of `text` opens or closes a block: one misspelt, unclosed or left over would otherwise
    be skipped, or take the text up to the next block's end with it."""
    inside = {match.start(): match.end() for match in BLOCK.finditer(text)}
    spans = sorted(inside.items())
    for marker in MARKER.finditer(text):
        line = text.count('\n', 0, marker.start()) + 1
        where = f'{page.path.relative_to(page.files.root)}:{line}'
        block = next(((start, end) for start, end in spans if start <= marker.start() < end), None)
        if block is None:
            raise UsageError(f'{where}: a results marker outside a block (misspelt, or a block without its '
                             f'<!-- results: ... --> or its <!-- /results -->)')
        body = BLOCK.match(text, block[0])
        opening, closing = body.start(), body.end() - len('<!-- /results -->')
        if marker.start() not in (opening, closing):
            raise UsageError(f'{where}: a results marker inside the block of line '
                             f'{text.count(chr(10), 0, opening) + 1} (a block without its <!-- /results -->?)')


def pages(root: Path) -> list[Path]:
    """The pages under `root` (README.md, docs/*.md); one that is not a readable file is an error naming it."""
    found = [path for pattern in PAGES for path in sorted(root.glob(pattern))]
    unreadable = [path for path in found if not path.is_file()]
    if unreadable:
        raise UsageError(f'{unreadable[0]}: not a page (a folder, or a link to nothing)')
    return found


def render_pages(root: Path, write: bool = True) -> list[str]:
    """Render every block of the pages under `root` from the data files there; `write`: rewrite the pages whose
    blocks changed. Returns the blocks that differed, as 'PAGE:LINE: block "WORDS"'."""
    if not (root / 'README.md').is_file():  # a mistyped root would otherwise check nothing and pass
        raise UsageError(f'{root}: no README.md there (give the repository\'s folder)')
    files, differing, rewritten = DataFiles(root), [], {}
    for path in pages(root):
        try:
            text = path.read_text()
        except UnicodeDecodeError as exc:
            raise UsageError(f'{path}: not UTF-8 text ({exc.reason} at byte {exc.start})') from None
        rendered, changed = render_text(text, Page(files, path))
        differing += [f'{path.relative_to(root)}:{line}: block "{spec}"' for spec, line in changed]
        if changed:
            rewritten[path] = rendered
    if not any(BLOCK.search(path.read_text()) for path in pages(root)):
        raise UsageError(f'{root}: no results block in its pages (give the repository\'s folder)')
    for path, rendered in rewritten.items() if write else ():  # every page rendered before any is written
        write_text_atomic(path, rendered)
    return differing


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    parser = command_parser(description, 'render_results.py')
    parser.add_argument('--check', action='store_true',
                        help='change nothing; exit 1 naming each page and block whose text differs from its data')
    parser.add_argument('--root', type=Path, default=REPOSITORY,
                        help='the repository whose pages and data files are read (default: this one)')
    args = parser.parse_args(argv)
    differing = render_pages(args.root, write=not args.check)
    for block in differing:
        logger.info(f'{block} {"differs from its data" if args.check else "rewritten"}')
    if args.check and differing:
        logger.error(f'{len(differing)} block(s) differ from their data: run python tools/render_results.py')
        return 1
    logger.info(f'{len(differing) or "no"} block(s) {"differ" if args.check else "rewritten"}')
    return 0
