#!/usr/bin/env python
"""The token-labeling paper's central comparison in miniature ("All Tokens Matter", Table 7): does a backbone
pretrained with token labeling segment better than one pretrained without?

    python tools/reproduce_token_labeling.py                      # LV-ViT-S on the embedded digits, 3 seeds, CPU
    python tools/reproduce_token_labeling.py --quick              # a smoke-sized run of every stage
    python tools/reproduce_token_labeling.py --seeds 3 --device cuda --out runs/tl_repro

For every seed, one model is pretrained three ways on the same data for the same epochs:
  token-labeling   token labeling with the annotator's score maps, and MixToken (LV-ViT's recipe)
  standard         the paper's Standard baseline: MixUp 0.8 + CutMix 1.0, no token labels, lr 1e-3 per 1024 images
  mixtoken-label   MixToken with the image label only (no annotator)
and each backbone is transferred with FCN and with UperNet, then tested single-scale (SS) and multi-scale (MS).
`--variants` adds the paper's other rows: Table 2 (relabel: CutMix + ReLabel, relabel-mixtoken: MixToken + ReLabel,
cutmix-label: CutMix + image label), Table 4 (online-kd, online-token-labeling: the annotator as a teacher), Figure
4 left (participation-20 ... -80: that share of the tokens in the token loss), token-labeling-no-mixtoken, and
standard-same-lr (Standard at token labeling's lr: one factor fewer).

DIR/table.md (the paper's layout, mean +- std over seeds, pretraining times; then each variant minus token labeling,
paired by seed, with its 95% interval and "within noise" where the interval holds 0), DIR/results.json (every run
and the summary) and DIR/results.png (bars with error bars) come out.

Every stage is the suite's own command (tools/train_cls.py, tools/train_seg.py, tools/test_seg.py), logged to
DIR/runs/VARIANT/seed_S/*.log. A stage whose result is on disk is not run again, and an interrupted one resumes
from its last checkpoint: rerun the same command to continue.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common.errors import SuiteError, UsageError
from common.cli import add_device_argument, check_output_folder, positive_int, run_command
from common.files import write_json_atomic
from classification.recipes import recipe_for
from digits.cls_data import ANNOTATOR, ANNOTATOR_KWARGS, ANNOTATORS, EmbeddedScans
from digits.cls_data import RECIPE as DIGITS_RECIPE
from engine.checkpoints import BEST, LAST, LOG
from common.statistics import CONFIDENCE, describe_difference, mean_std, paired_difference
from segmentation.config import load_config

REPO = Path(__file__).resolve().parent.parent

PARTICIPATION_RATES = (20, 40, 60, 80)  # percent of each image's tokens in the token loss (Figure 4 left; 100: token
# labeling itself)
OTHER_ANNOTATORS = ANNOTATORS[1:]  # Figure 4 right: token labeling from the digits' larger annotators
VARIANTS = {
    'token-labeling': 'token labeling + MixToken',
    'standard': 'Standard (MixUp + CutMix)',
    'mixtoken-label': 'MixToken, image label only',
    'relabel': 'ReLabel + CutMix',
    'relabel-mixtoken': 'ReLabel + MixToken',
    'cutmix-label': 'CutMix, image label only',
    'token-labeling-no-mixtoken': 'token labeling, no MixToken',
    'online-kd': 'online KD (annotator as DeiT teacher)',
    'online-token-labeling': 'online token labeling',
    'standard-same-lr': 'Standard at token labeling\'s lr',
    **{f'participation-{rate}': f'token labeling, {rate}% of tokens' for rate in PARTICIPATION_RATES},
    **{f'annotator-{name}': f'token labeling, {name} annotator' for name in OTHER_ANNOTATORS},
}
# The rows that are not a preset alone: the preset they start from, and their own options (Figure 4 left: the token
# participation rate; right: the digits' annotator); the online rows add the annotator as --teacher (Table 4);
# `standard-same-lr` is Standard with token labeling's lr, the one factor Standard changes besides the supervision
# and the mixing
DERIVED = {'standard-same-lr': ('standard', []),  # the lr: Stages.pretrain_argv (it depends on the data)
           **{f'participation-{rate}': ('token-labeling', ['--token-participation', f'{rate / 100:g}'])
              for rate in PARTICIPATION_RATES},
           **{f'annotator-{name}': ('token-labeling', ['--digits-annotator', name]) for name in OTHER_ANNOTATORS}}
ONLINE = {'online-kd': 'standard', 'online-token-labeling': 'token-labeling'}
# The paper's own layouts: Table 2 (augmentation x supervision), Table 4 (training, tokens used, time) and Figure 4
# (left: participation rate; right: annotator); a cell whose row did not run is a dash
TABLE2_CELLS = {('MixToken', 'token labeling'): 'token-labeling', ('MixToken', 'ReLabel'): 'relabel-mixtoken',
                ('CutMix', 'ReLabel'): 'relabel', ('MixToken', 'image label'): 'mixtoken-label',
                ('CutMix', 'image label'): 'cutmix-label'}
TABLE4_ROWS = {'standard': ('vanilla', '1'), 'online-kd': ('online KD', '2'),
               'online-token-labeling': ('online token labeling', 'all'), 'token-labeling': ('token labeling', 'all'),
               'relabel': ('ReLabel', '1')}
PARTICIPATION = {**{rate: f'participation-{rate}' for rate in PARTICIPATION_RATES}, 100: 'token-labeling'}
ANNOTATOR_ROWS = {ANNOTATOR: 'token-labeling', **{name: f'annotator-{name}' for name in OTHER_ANNOTATORS}}
# The paper's tables as rows of this tool (`--table`). Table 7 transfers backbones to segmentation: with and without
# token labeling as the paper's, and MixToken with the image label, which differs from token labeling in the
# supervision alone. Table 4's Standard row comes with its one-factor twin at token labeling's lr.
TABLES = {'2': tuple(TABLE2_CELLS.values()), '4': (*TABLE4_ROWS, 'standard-same-lr'),
          '7': ('token-labeling', 'standard', 'mixtoken-label'),
          'fig4': (*PARTICIPATION.values(), *ANNOTATOR_ROWS.values())}
DEFAULT_TABLES = ('2', '4', '7')  # about 3 hours on 2 CPU cores; Figure 4 adds its six rows (--table fig4)
BASELINE = 'token-labeling'  # every other variant is compared with it, seed by seed
HEADS = {'fcn': 'FCN', 'upernet': 'UperNet'}
MODES = {'ss': 'SS', 'ms': 'MS'}
METRICS = ('mIoU', 'aAcc')
QUICK = dict(epochs=2, iters=20)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--quick', action='store_true',
                   help=f'smoke-sized: {QUICK["epochs"]} pretraining epochs, {QUICK["iters"]} segmentation iterations')
    p.add_argument('--seeds', type=positive_int, default=3,
                   help='seeds per variant (mean and std over them; differences from token labeling paired by seed)')
    add_device_argument(p)
    p.add_argument('--out', default='output/reproduce_token_labeling', help='output folder')
    p.add_argument('--variants', nargs='+', choices=list(VARIANTS), help='pretraining rows to compare')
    p.add_argument('--table', nargs='+', choices=list(TABLES), help='the rows of these tables of the paper (added to '
                   '--variants; without either: ' + ' '.join(DEFAULT_TABLES) + '): ' +
                   '; '.join(f'{name}: {", ".join(rows)}' for name, rows in TABLES.items()))
    p.add_argument('--transfer', choices=('table7', 'all', 'none'), default='table7', help=(
        'the rows whose backbones are transferred to segmentation (FCN and UperNet, SS and MS): those of Table 7 '
        'among the rows run (default), all of them, or none; the others are compared by classification alone'))
    p.add_argument('--fcn-config', default='seg_configs/fcn_lvvit_s.py')
    p.add_argument('--upernet-config', default='seg_configs/upernet_lvvit_s.py')
    p.add_argument('--epochs', type=positive_int, help='pretraining epochs (default: the recipe\'s; 8 on the digits)')
    p.add_argument('--iters', type=positive_int,
                   help='segmentation iterations (default: the schedule\'s; 160 on the digits)')
    p.add_argument('--cls-data-dir', help='ImageNet-layout folder for pretraining (default: the embedded digits)')
    p.add_argument('--token-label-dir', help='its token-label store (needed with --cls-data-dir)')
    p.add_argument('--annotator', nargs='+', metavar=('MODEL', 'KEY=VALUE'), help=(
        'the online rows\' annotator and its model arguments (default on the embedded digits: their annotator, '
        f'{ANNOTATOR} {" ".join(f"{k}={v}" for k, v in ANNOTATOR_KWARGS.items())})'))
    p.add_argument('--annotator-checkpoint', help='its weights (default on the digits: the one token labeling trains '
                   f'first, {EmbeddedScans().annotator_dir() / LAST})')
    p.add_argument('--seg-data-root', help='ADE20K-layout folder (default: the configs\', else the embedded set)')
    p.add_argument('--cls-args', nargs=argparse.REMAINDER, default=[],
                   help='further tools/train_cls.py options, e.g. --batch-size 16 --workers 0 (put it last)')
    return p


def check_args(args: argparse.Namespace) -> None:
    check_output_folder(args.out)
    tables = args.table or ([] if args.variants else DEFAULT_TABLES)
    chosen = set(args.variants or ()) | {row for table in tables for row in TABLES[table]}
    args.variants = [variant for variant in VARIANTS if variant in chosen]  # token labeling first
    transfer = {'all': args.variants, 'table7': TABLES['7'], 'none': ()}[args.transfer]
    args.transferred = [variant for variant in args.variants if variant in transfer]
    if args.cls_data_dir and (set(ANNOTATOR_ROWS.values()) - {BASELINE}) & set(args.variants):
        raise UsageError('the annotator rows (Figure 4 right) train on the embedded digits; on your data, make a '
                         'store per annotator (tools/generate_token_labels.py) and run token-labeling once per store')
    if (args.cls_data_dir is None) != (args.token_label_dir is None) and 'token-labeling' in args.variants:
        raise UsageError('--cls-data-dir and --token-label-dir go together (token labeling needs the store)')
    if args.cls_data_dir and set(ONLINE) & set(args.variants) and not args.annotator_checkpoint:
        raise UsageError('the online rows on your data need --annotator and --annotator-checkpoint (the annotator '
                         'your store was made with)')
    if args.quick:
        args.epochs = args.epochs or QUICK['epochs']
        args.iters = args.iters or QUICK['iters']


def shared_backbone(configs: dict[str, str]) -> tuple[str, dict]:
    """The backbone model both configs use (name and model arguments): the model to pretrain."""
    models = {}
    for head, path in configs.items():
        backbone = load_config(path).model.backbone
        models[head] = (backbone.model_name, dict(backbone.get('model_kwargs') or {}))
    if len({repr(m) for m in models.values()}) != 1:
        raise UsageError('the FCN and UperNet configs must use the same backbone model, got ' +
                         ', '.join(f'{head}: {name} {kwargs or ""}' for head, (name, kwargs) in models.items()))
    return next(iter(models.values()))


class Stages:
    """Runs the suite's commands as subprocesses, each logged to a file, each skipped when its result exists. Each
    stage's command is recorded (`command.json` files) when it first runs; a rerun into the same --out with other
    settings is refused, naming the stage, rather than reusing results made with the old ones."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.env = dict(os.environ)
        if args.device == 'cpu':
            self.env['CUDA_VISIBLE_DEVICES'] = ''
        self.seconds: dict[str, float] = {}

    def run(self, name: str, tool: str, argv: list[str], log: Path) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        print(f'[{time.strftime("%H:%M:%S")}] {name}', flush=True)
        started = time.time()
        with open(log, 'a') as out:
            result = subprocess.run([sys.executable, str(REPO / 'tools' / tool), *argv], cwd=REPO, env=self.env,
                                    stdout=out, stderr=subprocess.STDOUT)
        self.seconds[name] = round(time.time() - started, 1)
        if result.returncode != 0:
            tail = log.read_text(errors='replace').splitlines()[-15:]
            raise SuiteError(f'{name} failed (exit {result.returncode}); the end of {log}:\n' + '\n'.join(tail))

    @staticmethod
    def same_command(record: Path, tool: str, argv: list[str], started: bool) -> None:
        """The stage whose command `record` holds must be run with the same command (`--resume` aside); the first
        time, the command is recorded. A stage `started` without a record (an older version's) is refused too."""
        command = [tool, *(arg for arg in argv if arg != '--resume')]
        if started and not record.is_file():
            raise UsageError(f'{record.parent} holds results with no record of the settings they were made with: '
                             f'use another --out')
        if record.is_file():
            made = json.loads(record.read_text())
            if made != command:
                changed = ' '.join(arg for arg in command if arg not in made) or 'fewer options'
                raise UsageError(f'{record.parent} was made by `{" ".join(made)}`; this run gives it {changed}: '
                                 f'use another --out, or the settings it was made with')
            return
        record.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(record, command)

    def pretrain_argv(self, variant: str, seed: int, model: str, out: Path) -> list[str]:
        """tools/train_cls.py's options for a row: its preset and the row's own options."""
        preset, options = DERIVED.get(variant, (ONLINE.get(variant, variant), []))
        argv = [model, '--preset', preset, '--seed', str(seed), '--output', str(out), *options]
        argv += self.annotator_args() if variant in ONLINE else []
        return argv + (['--lr-base', f'{self.token_labeling_lr(model):g}'] if variant == 'standard-same-lr' else [])

    def pretrain(self, variant: str, seed: int, model: str, model_kwargs: dict, run_dir: Path) -> Path:
        out, a = run_dir / 'cls', self.args
        argv = self.pretrain_argv(variant, seed, model, out)
        argv += ['--epochs', str(a.epochs)] if a.epochs else []
        argv += ['--device', a.device] if a.device else []
        argv += ['--model-kwargs', *(f'{k}={v!r}' for k, v in model_kwargs.items())] if model_kwargs else []
        if a.cls_data_dir:
            argv += ['--data-dir', a.cls_data_dir] + (['--token-label-dir', a.token_label_dir] if a.token_label_dir
                                                      else [])
        argv += a.cls_args
        self.same_command(run_dir / 'cls.command.json', 'train_cls.py', argv, (out / 'last.pth').is_file())
        if not (out / 'metrics.json').is_file():
            argv += ['--resume'] if (out / 'last.pth').is_file() else []
            self.run(f'{variant} seed {seed}: pretraining {model}', 'train_cls.py', argv, run_dir / 'cls.log')
        return out

    def token_labeling_lr(self, model: str) -> float:
        """lr_base of token labeling for `model` on the data of the run (what `standard` scales by 640/1024)."""
        return recipe_for(model, 'token-labeling', None if self.args.cls_data_dir else DIGITS_RECIPE).lr_base

    def annotator_args(self) -> list[str]:
        """The online rows' --teacher options: the annotator the stores come from (on the digits, the one the first
        token-labeling pretraining trained)."""
        a = self.args
        model, *kwargs = a.annotator or [ANNOTATOR, *(f'{k}={v}' for k, v in ANNOTATOR_KWARGS.items())]
        # the default relative to the repository, where the stages run: the runs' recorded commands stay valid there
        checkpoint = a.annotator_checkpoint or str(EmbeddedScans().annotator_dir() / LAST)
        if not (REPO / checkpoint).is_file():
            raise UsageError(f'the online rows need the annotator\'s weights, {checkpoint}: give '
                             f'--annotator-checkpoint, or, on the digits, add token-labeling to --variants (it trains '
                             f'the annotator first)')
        return ['--teacher', model, '--teacher-checkpoint', checkpoint] + (['--teacher-kwargs', *kwargs] if kwargs
                                                                            else [])

    def segment(self, variant: str, seed: int, head: str, config: str, backbone: Path, run_dir: Path) -> dict:
        work = run_dir / head
        data = ['--data-root', self.args.seg_data_root] if self.args.seg_data_root else []
        argv = [config, '--work-dir', str(work), *data,
                '--cfg-options', f'model.backbone.pretrained={backbone}', f'randomness.seed={seed}']
        argv += ['--iters', str(self.args.iters)] if self.args.iters else []
        self.same_command(run_dir / f'{head}.command.json', 'train_seg.py', argv,
                          (work / 'last_checkpoint').is_file())
        if not (work / 'done').is_file():
            argv += ['--resume'] if (work / 'last_checkpoint').is_file() else []
            self.run(f'{variant} seed {seed}: {HEADS[head]} training', 'train_seg.py', argv, run_dir / f'{head}.log')
            (work / 'done').write_text((work / 'last_checkpoint').read_text())
        checkpoint = (work / 'done').read_text().strip()
        scores = {}
        for mode in MODES:
            report = work / f'{mode}.json'
            argv = [config, checkpoint, '--work-dir', str(work / f'test_{mode}'), *data, '--out', str(report),
                    *(['--ms'] if mode == 'ms' else [])]
            self.same_command(run_dir / f'{head}_{mode}.command.json', 'test_seg.py', argv, report.is_file())
            if not report.is_file():
                self.run(f'{variant} seed {seed}: {HEADS[head]} {MODES[mode]} test', 'test_seg.py', argv,
                         run_dir / f'{head}_test.log')
            values = json.loads(report.read_text())
            scores[mode] = {key: values[key] for key in METRICS}
        return scores


def run_folder(out: Path, variant: str, seed: int) -> Path:
    return out / 'runs' / variant / f'seed_{seed}'


def training_seconds(run: Path) -> float:
    """The pretraining's own time: the sum of its epochs' times (training and validation) in its log."""
    return round(sum(json.loads(line)['time'] for line in (run / LOG).read_text().splitlines()), 1)


def summarise(runs: list[dict]) -> dict:
    """Per variant: mean and std over seeds of top-1, of the pretraining time and, for a transferred row, of every
    head/mode/metric; for each variant but token labeling, its paired difference from token labeling over the seeds
    both ran (`vs_token_labeling`)."""
    summary = {}
    for variant in dict.fromkeys(r['variant'] for r in runs):
        mine = [r for r in runs if r['variant'] == variant]
        entry = {'top1': mean_std([r['top1'] for r in mine]),
                 'train_seconds': mean_std([r['train_seconds'] for r in mine])}
        if transferred(mine):
            for head in HEADS:
                entry[head] = {mode: {key: mean_std([r[head][mode][key] for r in mine]) for key in METRICS}
                               for mode in MODES}
        summary[variant] = entry
    for variant, entry in summary.items():
        if variant != BASELINE and BASELINE in summary:
            entry['vs_token_labeling'] = compare(runs, variant)
    return summary


def transferred(runs: list[dict]) -> bool:
    """Whether these runs' backbones were all transferred to segmentation."""
    return all(head in run for run in runs for head in HEADS)


def compare(runs: list[dict], variant: str) -> dict:
    """`variant` against token labeling, seed by seed (the same seed: the same initialisation and data order):
    the paired difference of top-1 and, where both rows were transferred, of every head/mode mIoU."""
    by_seed = {(r['variant'], r['seed']): r for r in runs}
    seeds = [r['seed'] for r in runs if r['variant'] == variant and (BASELINE, r['seed']) in by_seed]
    pairs = [(by_seed[(variant, seed)], by_seed[(BASELINE, seed)]) for seed in seeds]

    def difference(value) -> dict:
        return paired_difference([value(mine) for mine, _ in pairs], [value(base) for _, base in pairs])

    result = {'top1': difference(lambda r: r['top1'])}
    if transferred([run for pair in pairs for run in pair]):
        for head in HEADS:
            result[head] = {mode: difference(lambda r, h=head, m=mode: r[h][m]['mIoU']) for mode in MODES}
    return result


def cell(stats: dict) -> str:
    return f'{stats["mean"]:.1f} ± {stats["std"]:.1f}'


def markdown_table(summary: dict, model: str, seeds: int) -> str:
    """The paper's Table 7 layout: backbone and its pretraining, segmentation head, SS and MS mIoU / pixel acc."""
    lines = ['| Backbone | Pretraining | Top-1 (%) | Segmentation | mIoU SS | Pixel acc. SS | mIoU MS '
             '| Pixel acc. MS | Pretraining time |',
             '|---|---|---:|---|---:|---:|---:|---:|---:|']
    for head, head_name in HEADS.items():
        for variant, entry in summary.items():
            scores = entry[head]
            lines.append(f'| {model} | {VARIANTS[variant]} | {cell(entry["top1"])} | {head_name} | '
                         f'{cell(scores["ss"]["mIoU"])} | {cell(scores["ss"]["aAcc"])} | '
                         f'{cell(scores["ms"]["mIoU"])} | {cell(scores["ms"]["aAcc"])} | '
                         f'{time_cell(summary, variant)} |')
    table = '\n'.join(lines) + (f'\n\nMean ± standard deviation over {seeds} seed(s); percent. Pretraining time: '
                                 f'its epochs\' seconds summed, mean over seeds; its ratio to the Standard (vanilla) '
                                 f'row\'s.\n')
    compared = {variant: entry['vs_token_labeling'] for variant, entry in summary.items()
                if 'vs_token_labeling' in entry}
    return table + (difference_table(compared, seeds) if compared else '') + paper_tables(summary)


def time_cell(summary: dict, variant: str) -> str:
    seconds = summary[variant]['train_seconds']['mean']
    if 'standard' not in summary:
        return f'{seconds:.0f} s'
    return f'{seconds:.0f} s (×{seconds / summary["standard"]["train_seconds"]["mean"]:.2f})'


def top1_and_miou(summary: dict, variant: str) -> str:
    """'top-1 / UperNet SS mIoU' of a row, or a dash where it did not run."""
    if variant not in summary:
        return '—'
    return f'{cell(summary[variant]["top1"])} / {cell(summary[variant]["upernet"]["ss"]["mIoU"])}'


def paper_tables(summary: dict) -> str:
    """The paper's Table 2, Table 4 and Figure 4 (left) in their layouts, for those with at least two rows run."""
    parts = []
    if len(set(TABLE2_CELLS.values()) & set(summary)) >= 2:
        lines = ['| Augmentation | token labeling | ReLabel | image label |', '|---|---:|---:|---:|']
        for mixing in ('MixToken', 'CutMix'):
            lines.append(f'| {mixing} | ' + ' | '.join(
                top1_and_miou(summary, TABLE2_CELLS[(mixing, supervision)]) if (mixing, supervision) in TABLE2_CELLS
                else '—' for supervision in ('token labeling', 'ReLabel', 'image label')) + ' |')
        parts.append('Table 2 layout (top-1 / UperNet mIoU SS):\n\n' + '\n'.join(lines))
    if len(set(TABLE4_ROWS) & set(summary)) >= 2:
        lines = ['| Training | Tokens used | Top-1 / UperNet mIoU SS | Pretraining time |', '|---|---|---:|---:|']
        lines += [f'| {name} | {tokens} | {top1_and_miou(summary, variant)} | {time_cell(summary, variant)} |'
                  for variant, (name, tokens) in TABLE4_ROWS.items() if variant in summary]
        parts.append('Table 4 layout:\n\n' + '\n'.join(lines))
    if len(set(PARTICIPATION.values()) & set(summary)) >= 2:
        rates = [rate for rate, variant in PARTICIPATION.items() if variant in summary]
        lines = ['| Token participation | ' + ' | '.join(f'{rate}%' for rate in rates) + ' |',
                 '|---|' + '---:|' * len(rates),
                 '| Top-1 | ' + ' | '.join(cell(summary[PARTICIPATION[r]]['top1']) for r in rates) + ' |',
                 '| UperNet mIoU SS | ' + ' | '.join(cell(summary[PARTICIPATION[r]]['upernet']['ss']['mIoU'])
                                                    for r in rates) + ' |']
        parts.append('Figure 4 (left) as a table:\n\n' + '\n'.join(lines))
    return ''.join(f'\n{part}\n' for part in parts)


def difference_table(compared: dict, seeds: int) -> str:
    """Each variant minus token labeling, paired by seed: mean difference and its 95% interval, per column."""
    columns = [(head, mode) for head in HEADS for mode in MODES]
    lines = ['', '| Pretraining, minus token labeling | Top-1 | ' +
             ' | '.join(f'{HEADS[h]} mIoU {MODES[m]}' for h, m in columns) + ' |',
             '|---|' + '---:|' * (1 + len(columns))]
    for variant, difference in compared.items():
        cells = [describe_difference(difference['top1'])]
        cells += [describe_difference(difference[head][mode]) for head, mode in columns]
        lines.append(f'| {VARIANTS[variant]} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + (f'\n\nPaired by seed ({seeds} seed(s): the same initialisation and data order); '
                                f'mean difference [{CONFIDENCE:.0%} t interval], percentage points; "within '
                                f'noise" where the interval holds 0.\n')


def plot(summary: dict, path: Path, title: str) -> None:
    from visualization.figures import figure

    groups = [(head, mode) for head in HEADS for mode in MODES]
    variants = list(summary)
    width = 0.8 / len(variants)
    fig, axes = figure(1, 2, (6.0, 4.5), width_ratios=[1, 3])
    ax_cls, ax_seg = axes[0]
    for i, variant in enumerate(variants):
        top1 = summary[variant]['top1']
        ax_cls.bar(i, top1['mean'], yerr=top1['std'], capsize=4, color=f'C{i}', label=VARIANTS[variant])
        means = [summary[variant][h][m]['mIoU']['mean'] for h, m in groups]
        stds = [summary[variant][h][m]['mIoU']['std'] for h, m in groups]
        ax_seg.bar([g + (i - (len(variants) - 1) / 2) * width for g in range(len(groups))], means, width, yerr=stds,
                   capsize=4, color=f'C{i}', label=VARIANTS[variant])
    ax_cls.set_xticks(range(len(variants)), [v.replace('-', '\n', 1) for v in variants], fontsize=8)
    ax_cls.set_ylabel('classification top-1 (%)')
    ax_seg.set_xticks(range(len(groups)), [f'{HEADS[h]} {MODES[m]}' for h, m in groups])
    ax_seg.set_ylabel('segmentation mIoU (%)')
    ax_seg.legend(loc='lower right', fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    check_args(args)
    configs = {'fcn': args.fcn_config, 'upernet': args.upernet_config}
    model, model_kwargs = shared_backbone(configs)
    out = Path(args.out)
    stages = Stages(args)
    started = time.time()
    runs = {}  # every row is pretrained (all seeds) before any is transferred: the classification rows come first
    for seed in range(args.seeds):
        for variant in args.variants:
            cls_dir = stages.pretrain(variant, seed, model, model_kwargs, run_folder(out, variant, seed))
            cls_metrics = json.loads((cls_dir / 'metrics.json').read_text())
            runs[(variant, seed)] = {'variant': variant, 'seed': seed, 'top1': cls_metrics['best_top1'],
                                     'train_seconds': training_seconds(cls_dir),
                                     'cls_metrics': str(cls_dir / 'metrics.json')}
    for seed in range(args.seeds):
        for variant in args.transferred:
            run_dir = run_folder(out, variant, seed)
            for head, config in configs.items():
                runs[(variant, seed)][head] = stages.segment(variant, seed, head, config, run_dir / 'cls' / BEST,
                                                             run_dir)
    runs = list(runs.values())
    summary = summarise(runs)
    settings = {key: value for key, value in vars(args).items() if key != 'cls_args'}
    results = {'model': model, 'model_kwargs': model_kwargs, 'settings': settings, 'runs': runs,
               'summary': summary, 'stage_seconds': stages.seconds, 'seconds': round(time.time() - started, 1)}
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / 'results.json', results)
    (out / 'table.md').write_text(markdown_table(summary, model, args.seeds))
    plot(summary, out / 'results.png', f'{model}: pretraining -> segmentation, {args.seeds} seed(s)')
    print((out / 'table.md').read_text())
    print(f'-> {out / "table.md"}, {out / "results.json"}, {out / "results.png"}')
    return results


if __name__ == '__main__':
    run_command(main)
