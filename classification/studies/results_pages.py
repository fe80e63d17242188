"""The figures README.md and docs/*.md quote, rendered from their data files (tools/render_results.py).

Every figure lives in one data file: docs/results/NAME.json (each with its commit, machine and date) or the
segmentation metafile, seg_configs/metafile.yaml (mmseg's schema). A page holds renderings of them only, each between
markers that name what renders it:

    <!-- results: NAME ARGS -->...<!-- /results -->

NAME is one of BLOCKS; ARGS are shell-style words. `value FILE EXPRESSION [FORMAT]` is a figure inside a sentence:
FILE a data file's name (`reproduction` for docs/results/reproduction.json, `metafile` for the metafile), EXPRESSION
its keys joined by dots (a list item by its index or by its Name), or such paths and numbers joined by ` * ` and
` / ` (spaced, the expression quoted; evaluated left to right), FORMAT a Python format (`{:.1f}`, `{:,.0f}`,
`{:.0%}`) or one of FORMATS. The other blocks are tables and stand on lines of their own: they are rendered between
blank lines, at their marker's indentation (a table inside a list item). `render_pages(root)` rewrites every block
of the pages under `root`, or names those whose text is not what their data give.
"""
from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path

import yaml

from backbones.common.cli import command_parser
from backbones.common.errors import DataError, UsageError
from backbones.common.files import write_text_atomic
from backbones.common.log import logger
from classification.studies import reproduction
from classification.studies.statistics import describe_difference, describe_interval, mean_std

REPO = Path(__file__).resolve().parents[2]
RESULTS = Path('docs/results')
METAFILE = Path('seg_configs/metafile.yaml')
PAGES = ('README.md', 'docs/*.md')
BLOCK = re.compile(r'<!-- results: (?P<spec>.*?) -->(?P<body>.*?)<!-- /results -->', re.S)
OPERATOR = re.compile(r' ([*/]) ')  # spaced: a key may hold a slash, as mmseg's 'inference time (ms/im)'
MODEL_NAMES = {'lvvit_s': 'LV-ViT-S', 'deit_small_patch16_224': 'DeiT-S'}


class DataFiles:
    """The data files under a repository root, each read once: `metafile`, or the stem of a docs/results file."""

    def __init__(self, root: Path) -> None:
        self.root, self.loaded = root, {}

    def path(self, name: str) -> Path:
        return self.root / (METAFILE if name == 'metafile' else RESULTS / f'{name}.json')

    def __getitem__(self, name: str) -> dict:
        if name not in self.loaded:
            path = self.path(name)
            if not path.is_file():
                raise DataError(f'{path}: no such data file')
            try:
                text = path.read_text()
                self.loaded[name] = yaml.safe_load(text) if path.suffix == '.yaml' else json.loads(text)
            except (ValueError, yaml.YAMLError) as exc:
                raise DataError(f'{path}: not readable as {path.suffix[1:]}: {exc}') from None
        return self.loaded[name]

    def lookup(self, name: str, path: str) -> object:
        return lookup(self[name], path, str(self.path(name)))

    def evaluate(self, name: str, expression: str) -> object:
        """A path's value, or paths and numbers joined by ' * ' and ' / ', evaluated left to right."""
        words = OPERATOR.split(expression)
        result = self.operand(name, words[0])
        for operator, word in zip(words[1::2], words[2::2]):
            operand = self.operand(name, word)
            result = result * operand if operator == '*' else result / operand
        return result

    def operand(self, name: str, word: str) -> object:
        try:
            return float(word)
        except ValueError:
            return self.lookup(name, word)


def lookup(data: object, path: str, where: str) -> object:
    """The value at `path` in `data`: keys joined by dots, a list item by its index or its Name."""
    value = data
    for key in path.split('.'):
        if isinstance(value, list):
            found = [item for i, item in enumerate(value) if key in (str(i), item_name(item))]
            value = found[0] if found else None
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
    'interval': describe_interval,  # '-5.6 [-12.8, +1.5]'
    'duration': duration,
    'rate': rate,
    'spread': spread,  # [71.5, 72.1, ...] -> '71.7 ± 1.7'
}


def formatted(value: object, form: str) -> str:
    if form in FORMATS:
        return FORMATS[form](value)
    try:
        return form.format(value)
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise DataError(f'format {form!r} cannot write {value!r}: {exc}') from None


# ---- blocks: each (data files, its words) -> its text


def value(files: DataFiles, name: str, expression: str, form: str = '{}') -> str:
    return formatted(files.evaluate(name, expression), form)


def seeds(files: DataFiles, name: str, variant: str, path: str, form: str = '{:.1f}') -> str:
    """A row's per-seed values in seed order, 'a / b / c' (the runs a results.json holds)."""
    runs = [run for run in files.lookup(name, 'runs') if run['variant'] == variant]
    if not runs:
        raise DataError(f'{files.path(name)}: no runs of {variant}')
    return ' / '.join(formatted(lookup(run, path, f'{files.path(name)}: {variant} seed {run["seed"]}'), form)
                      for run in sorted(runs, key=lambda r: r['seed']))


def reproduction_table(files: DataFiles, name: str = 'reproduction') -> str:
    """The reproduction tool's own table.md, from its results.json."""
    results = files[name]
    return reproduction.markdown_table(results['summary'], results['model'], results['settings']['seeds'],
                                       results['annotators']).strip()


def reproduction_rows(files: DataFiles, *variants: str) -> str:
    """The named rows of the reproduction beside the paper's ImageNet top-1 (Tables 2 and 4)."""
    unknown = [variant for variant in variants if variant not in files['reproduction']['summary']]
    if unknown:
        raise DataError(f'{files.path("reproduction")}: no row {", ".join(unknown)}')
    return reproduction.rows_beside_the_paper(files['reproduction'], files['token_labeling_paper']['top1'],
                                              list(variants))


def reproduction_table7(files: DataFiles) -> str:
    return reproduction.table7_beside_the_paper(files['reproduction'], files['token_labeling_paper']['table7'])


def reproduction_figure4(files: DataFiles) -> str:
    results = files['reproduction']
    return (reproduction.participation_table(results['summary']) + '\n\n' +
            reproduction.annotator_table(results['summary'], results['annotators']))


def segmentation_runs(files: DataFiles) -> str:
    """The embedded segmentation default's runs (the metafile's models marked `Embedded Default`)."""
    lines = ['| config, commit | pretraining on the digits: top-1, time | segmentation | val mIoU SS | total |',
             '|---|---|---|---:|---|']
    for model in files['metafile']['Models']:
        meta = model['Metadata']
        if not meta.get('Embedded Default'):
            continue
        about = set(meta.get('Approximate', ()))

        def seconds(key: str, value: float) -> str:
            return ('about ' if key in about else '') + duration(value)

        pretraining = meta['Pretraining']
        lines.append(f'| {Path(model["Config"]).stem} at {meta["Commit"]}'
                     f'{" (fresh checkout)" if meta.get("Fresh Checkout") else ""} | '
                     f'{pretraining["Top 1 Accuracy"]:.1f}%, {seconds("Pretraining Time", pretraining["Time (s)"])} '
                     f'({pretraining["Includes"]} included) | {meta["lr schd"]} iterations, '
                     f'{seconds("Training Time", meta["Training Time (s)"])} | '
                     f'{miou_cell(model)} | {seconds("Total Time", meta["Total Time (s)"])} |')
    return '\n'.join(lines)


def miou_cell(model: dict) -> str:
    """A run's mIoU, with its spread over the seeds the model lists (`Metadata.Seeds`, `Metrics.mIoU by seed`)."""
    metrics = model['Results']['Metrics']
    text = f'{metrics["mIoU"]:.1f}'
    if 'mIoU by seed' in metrics:
        seeds = ', '.join(map(str, model['Metadata']['Seeds']))
        text += f' (seeds {seeds}: {spread(metrics["mIoU by seed"])})'
    return text


def dense_defaults(files: DataFiles, name: str = 'dense_defaults') -> str:
    """The detector's and the depth model's embedded defaults: their figures, what they compare with (simple
    predictors, other runs), and their times."""
    runs = files[name]
    lines = ['| config | iterations | scores on the validation pages | for comparison | time |',
             '|---|---:|---|---|---|']
    for run in runs['runs']:
        scores = ', '.join(f'{label} {run["scores"][key]:{form}}' for key, label, form in run['shown'])
        baselines = '; '.join(f'{b["what"]}: {b["scores"]}' for b in run['baselines'])
        lines.append(f'| {run["config"]} | {run["iterations"]} | **{scores}** | {baselines} | '
                     f'{duration(run["seconds"])} |')
    note = runs['note'].replace('first_stage_seconds', duration(runs['first_stage_seconds']))
    return '\n'.join(lines) + (f'\n\n{note} ({runs["machine"]}, torch {runs["torch"]}, commit '
                               f'{runs["commit"]}, [docs/results/{name}.json](results/{name}.json)).')


def loop_table(files: DataFiles, name: str, train_cls_name: str | None = None) -> str:
    """benchmark_loop's figures on a CPU, one column per model; `train_cls_name`: a second run's train_cls row."""
    document = files[name]
    models, workers, cores = document['models'], document['workers'], document['cores']

    def row(label: str, cell: Callable[[dict], str], of: list[dict] = models) -> str:
        return f'| {label} | ' + ' | '.join(cell(f) for f in of) + ' |'

    def pipelines(f: dict) -> tuple[dict, dict, dict]:
        return (f['pipeline_per_core_img_s'], f[f'pipeline_{workers}_workers_img_s'],
                f[f'pipeline_{workers}_workers_ceiling_img_s'])

    lines = ['| | ' + ' | '.join(column_name(f) for f in models) + ' |', '|---|' + '---:|' * len(models),
             row('input pipeline, 1 core, PIL path', lambda f: f'{rate(pipelines(f)[0]["pil"])} img/s'),
             row("same, batched path (workers' half + device half on the CPU)",
                 lambda f: f'{rate(pipelines(f)[0]["batched"])} img/s (x{pipelines(f)[0]["batched_over_pil"]:.2f})'),
             row("same, the batched path's workers' half alone (a GPU's CPU share)",
                 lambda f: f'{rate(pipelines(f)[0]["batched_workers_half"])} img/s '
                           f'(x{pipelines(f)[0]["batched_workers_half"] / pipelines(f)[0]["pil"]:.2f})'),
             row(f'input pipeline, {workers} workers, PIL path (ceiling: {workers} x one core)',
                 lambda f: f'{rate(pipelines(f)[1]["pil"])} img/s (ceiling {rate(pipelines(f)[2]["pil"])})'),
             row(f'same, batched path (ceiling: the {cores} cores, device half included)',
                 lambda f: f'{rate(pipelines(f)[1]["batched"])} img/s (ceiling {rate(pipelines(f)[2]["batched"])})'),
             row('model step', lambda f: f'{rate(f["model_step_img_s"])} img/s'),
             row(f'whole loop ({models[0]["loop"]["augment"].upper()} path, {workers} workers)',
                 lambda f: f'{rate(f["loop"]["img_s"])} img/s, bound by the {f["bound"]}')]
    if train_cls_name:
        second = files[train_cls_name]
        after = second['models'][0]['train_cls']['after_updates']
        lines.append(row(f'`tools/train_cls.py` itself (`--train-cls`, a second run at {second["commit"]}: updates '
                         f'after the first {after})', lambda f: f'{rate(f["train_cls"]["img_s"])} img/s',
                         second['models']))
    return '\n'.join(lines)


def column_name(figures: dict) -> str:
    return (f'{MODEL_NAMES.get(figures["model"], figures["model"])}, '
            f'{"token labeling" if figures["token_labeling"] else "vanilla"}')


def timm_table(files: DataFiles, name: str) -> str:
    """The suite against timm's train.py on one model (benchmark_loop --timm-train --compare-loop)."""
    (f,) = files[name]['models']
    loop, timm_run = f['loop'], f['timm_train']
    return '\n'.join([
        f'| {MODEL_NAMES.get(f["model"], f["model"])}, the DeiT recipe | img/s |', '|---|---:|',
        f'| model step | {rate(f["model_step_img_s"])} |',
        f'| whole loop, batches prepared ahead (x{loop["of_step"]:.2f} of the step) / serially | '
        f'{rate(loop["img_s"])} / {rate(loop["serial_img_s"])} (x{loop["overlap_gain"]:.2f}) |',
        f'| `tools/train_cls.py` | {rate(f["train_cls"]["img_s"])} |',
        f'| timm\'s `train.py` | {rate(timm_run["img_s"])} (`train_cls` x{timm_run["suite_ratio"]:.2f}) |'])


def burst_table(files: DataFiles, name: str) -> str:
    """The H100 bursts (not steady state): one-core and N-worker pipelines, step and loop, per model."""
    document = files[name]
    models, workers = document['models'], document['workers']

    def paths(figures: dict, ratio: str) -> str:
        return f'{rate(figures["pil"])} / {rate(figures["batched"])} img/s (x{ratio})'

    def row(label: str, cell: Callable[[dict], str]) -> str:
        return f'| {label} | ' + ' | '.join(cell(f) for f in models) + ' |'

    return '\n'.join([
        '| | ' + ' | '.join(column_name(f) for f in models) + ' |', '|---|' + '---:|' * len(models),
        row('input pipeline, 1 core: PIL path / batched path',
            lambda f: paths(f['pipeline_per_core_img_s'], f'{f["pipeline_per_core_img_s"]["batched_over_pil"]:.2f}')),
        row(f'input pipeline, {workers} workers: PIL path / batched path',
            lambda f: paths(pool := f[f'pipeline_{workers}_workers_img_s'], f'{pool["batched"] / pool["pil"]:.1f}')),
        row('model step (bf16, fused AdamW, channels-last)', lambda f: f'{rate(f["model_step_img_s"])} img/s'),
        row(f'whole loop ({models[0]["loop"]["augment"]} path)',
            lambda f: f'{rate(f["loop"]["img_s"])} img/s, bound by the {f["bound"]}')])


def rehearsal_table(files: DataFiles, name: str, table: str) -> str:
    """The scale rehearsal's `before-after` table (the fixes) or its `quiet` rerun."""
    document = files[name]
    if table == 'quiet':
        quiet = document['quiet']
        first, second, saved = quiet['first_start'], quiet['second_start'], quiet['checkpoints']
        images = f'{document["build"]["training_images"] / 1e6:.2f}M images'
        return '\n'.join([
            f'| stage ({images}, after the fixes) | quiet rerun |', '|---|---:|',
            f'| `torchrun --nproc-per-node 2 train_cls.py` to its first update, first start | {first["seconds"]} s: '
            f'listing {first["listing_s"]} s, the store verified once (local rank 0) in {first["verification_s"]} s '
            f'from disk |',
            f'| the same command, second start in a fresh output | {second["seconds"]} s: listing '
            f'{second["listing_s"]} s, the store\'s record found (no row read) |',
            f'| LV-ViT-L training checkpoint ({saved["lvvit_l"]["params_m"]}M parameters: weights, EMA, AdamW\'s '
            f'moments, as train_cls writes it) | {saved["lvvit_l"]["gb"]} GB, written in {saved["lvvit_l"]["seconds"]} '
            f's |',
            f'| CaiT-M48 at 448 ({saved["cait_m48_448"]["params_m"]}M parameters), the same | '
            f'{saved["cait_m48_448"]["gb"]} GB, written in {saved["cait_m48_448"]["seconds"]} s |'])
    if table != 'before-after':
        raise UsageError(f'rehearsal table {table!r}: give before-after or quiet')
    before, after = document['before'], document['after']
    pass_before, pass_after = before['pass'], after['pass']

    def growth(figures: dict) -> str:
        memory = figures['worker_private_mb']
        return f'{memory["start"]} -> {memory["end"]} MB ({memory["end"] - memory["start"]:+} MB)'

    return '\n'.join([
        f'| stage ({document["build"]["training_images"] / 1e6:.2f}M images) | before ({before["commit"]}) | '
        f'after ({after["commit"]}) |', '|---|---:|---:|',
        f'| listing the training split (cold / cached page cache) | {before["listing_s"]["cold"]} s / '
        f'{before["listing_s"]["cached"]} s | {after["listing_s"]["cached"]} s (cached) |',
        '| processes that list it under torchrun | every one | the main one; the others receive it |',
        f'| store opened without verification: time, memory | {before["store_open"]["seconds"]} s, '
        f'{before["store_open"]["mb"]} MB (a dict path -> row) | {after["store_open"]["seconds"]} s, '
        f'{after["store_open"]["mb"]} MB (`PathList`) |',
        f'| store verification ({document["build"]["store_gb"]} GB from the page cache) | '
        f'{before["store_verification_s"]} s, in every process, every start | '
        f'{after["store_verification_s"]["first"]} s, once per node; {after["store_verification_s"]["next_start"]} s '
        f'on the next start (`verified.json`) |',
        f'| dataset built (listing and store rows): time, main process memory | {before["dataset"]["seconds"]} s, '
        f'{before["dataset"]["mb"]} MB | {after["dataset"]["seconds"]} s, {after["dataset"]["mb"]} MB |',
        f'| one pass of {pass_after["images"]:,} shuffled images through {pass_after["workers"]} loader workers: each '
        f'worker\'s private dirty memory, start -> end | {growth(pass_before)} | {growth(pass_after)} |',
        f'| the same, images/s (decode of a tiny JPEG and its store row; no augmentation) | '
        f'{pass_before["img_s"]:,} | {pass_after["img_s"]:,} ({pass_after["beside"]} ran beside it) |',
        f'| `torchrun --nproc-per-node 2 train_cls.py` to its first update (2-block LV-ViT-S, token labeling) | '
        f'{before["first_update_s"]} s, both starts | {after["first_update_s"]} s on the first start '
        f'({after["first_update_beside"]} ran beside it) |'])


def gpu_session_table(files: DataFiles, name: str) -> str:
    """What one GPU session (tools/measure_gpu.py) measured, a row per figure it holds, then what it did not."""
    session = files[name]
    rows, missing = [], []
    for label, describe in GPU_FIGURES:
        text = describe(session)
        if text:
            rows.append(f'| {label} | {text} |')
        else:
            missing.append(label)
    head = (f'| {session["device"]}, {session["cores"]} cores, torch {session["torch"]}, at {session["commit"]} '
            f'({session["date"]}) | |')
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


def gpu_loop_text(files: DataFiles, name: str) -> str:
    """A GPU session's whole loop against its step, inline (its table's row)."""
    text = gpu_loop(files[name])
    if not text:
        raise DataError(f'{files.path(name)}: no loop figures')
    return text


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

# name -> (renderer, inline)
BLOCKS: dict[str, tuple[Callable[..., str], bool]] = {
    'value': (value, True),
    'seeds': (seeds, True),
    'reproduction-table': (reproduction_table, False),
    'reproduction-rows': (reproduction_rows, False),
    'reproduction-table7': (reproduction_table7, False),
    'reproduction-figure4': (reproduction_figure4, False),
    'segmentation-runs': (segmentation_runs, False),
    'dense-defaults': (dense_defaults, False),
    'loop-table': (loop_table, False),
    'timm-table': (timm_table, False),
    'burst-table': (burst_table, False),
    'rehearsal-table': (rehearsal_table, False),
    'gpu-session': (gpu_session_table, False),
    'gpu-loop': (gpu_loop_text, True),
}


def render_block(files: DataFiles, spec: str) -> tuple[str, bool]:
    """(a block's text, whether it is inline) from its marker's words."""
    words = shlex.split(spec)
    if not words or words[0] not in BLOCKS:
        raise UsageError(f'unknown results block {spec!r}: one of {", ".join(BLOCKS)}')
    render, inline = BLOCKS[words[0]]
    try:
        return render(files, *words[1:]), inline
    except TypeError as exc:  # the wrong number of words for its renderer
        raise UsageError(f'results block {spec!r}: {exc}') from None


def render_text(text: str, files: DataFiles, page: str) -> tuple[str, list[tuple[str, int]]]:
    """`text` with every block rendered, and the blocks that changed: (marker words, line)."""
    changed = []

    def replace(match: re.Match) -> str:
        try:
            rendered, inline = render_block(files, match['spec'])
        except (DataError, UsageError) as exc:
            line = text.count('\n', 0, match.start()) + 1
            raise type(exc)(f'{page}:{line}: {exc}') from None
        if not inline:
            indent = text[text.rfind('\n', 0, match.start()) + 1:match.start()]
            rendered = '\n\n' + '\n'.join(indent + line if line else '' for line in rendered.split('\n')) + \
                       '\n\n' + indent
        if rendered != match['body']:
            changed.append((match['spec'], text.count('\n', 0, match.start()) + 1))
        return f'<!-- results: {match["spec"]} -->{rendered}<!-- /results -->'

    return BLOCK.sub(replace, text), changed


def pages(root: Path) -> list[Path]:
    return [path for pattern in PAGES for path in sorted(root.glob(pattern))]


def render_pages(root: Path, write: bool = True) -> list[str]:
    """Render every block of the pages under `root` from the data files there; `write`: rewrite the pages whose
    blocks changed. Returns the blocks that differed, as 'PAGE:LINE: block "WORDS"'."""
    if not (root / 'README.md').is_file():  # a mistyped root would otherwise check nothing and pass
        raise UsageError(f'{root}: no README.md there (give the repository\'s folder)')
    files, differing = DataFiles(root), []
    for path in pages(root):
        text = path.read_text()
        rendered, changed = render_text(text, files, str(path.relative_to(root)))
        differing += [f'{path.relative_to(root)}:{line}: block "{spec}"' for spec, line in changed]
        if changed and write:
            write_text_atomic(path, rendered)
    return differing


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    parser = command_parser(description, 'render_results.py')
    parser.add_argument('--check', action='store_true',
                        help='change nothing; exit 1 naming each page and block whose text differs from its data')
    parser.add_argument('--root', type=Path, default=REPO,
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
