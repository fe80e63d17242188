"""The token-labeling paper's ablations in miniature (tools/reproduce_token_labeling.py): every row's
pretraining, transfer and test through the suite's own commands, the summary over seeds, its tables and figures."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from backbones.common.cli import add_device_argument, check_output_folder, command_parser, device_name, positive_int
from backbones.common.errors import SuiteError, UsageError
from backbones.common.files import write_json_atomic
from backbones.common.log import logger
from backbones.segmentation.config import load_config
from classification.digits.cls_data import ANNOTATOR, ANNOTATOR_KWARGS, ANNOTATORS, EmbeddedScans
from classification.digits.cls_data import RECIPE as DIGITS_RECIPE
from classification.engine.checkpoints import BEST, LAST, LOG, METRICS
from classification.recipes import recipe_for
from classification.studies.statistics import CONFIDENCE, describe_difference, mean_std, paired_difference
from classification.studies.timing import measured_on

REPO = Path(__file__).resolve().parents[2]  # the repository: its tools are what is run

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
DIGITS_ONLY = set(ANNOTATOR_ROWS.values()) - {'token-labeling'}  # the annotators are the digits' own
# The paper's tables as rows of this tool (`--table`). Table 7 transfers backbones to segmentation: with and without
# token labeling as the paper's, and MixToken with the image label, which differs from token labeling in the
# supervision alone. Table 4's Standard row comes with its one-factor twin at token labeling's lr.
TABLES = {'2': tuple(TABLE2_CELLS.values()), '4': (*TABLE4_ROWS, 'standard-same-lr'),
          '7': ('token-labeling', 'standard', 'mixtoken-label'),
          'fig4': (*PARTICIPATION.values(), *ANNOTATOR_ROWS.values())}
DEFAULT_TABLES = ('2', '4', '7')  # Figure 4 adds its six rows (--table fig4): docs/reproduction.md has the times
BASELINE = 'token-labeling'  # every other variant is compared with it, seed by seed
# The paper's other comparisons, each row minus the row it is set against (where both ran): online token labeling
# against online KD, each online row against its offline one (token labeling's is in every row's summary), the pooled
# map against the image label under MixToken, and Standard at token labeling's lr against Standard
PAIRS = (('online-token-labeling', 'online-kd'), ('online-kd', 'standard'), ('relabel-mixtoken', 'mixtoken-label'),
         ('standard-same-lr', 'standard'))
HEADS = {'fcn': 'FCN', 'upernet': 'UperNet'}
MODES = {'ss': 'SS', 'ms': 'MS'}
SEG_METRICS = ('mIoU', 'aAcc')
QUICK = dict(seeds=1, epochs=1, train_images=320, iters=20, images=16)  # --quick: every row, smoke-sized
SEEDS = 3


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    p = command_parser(description, 'reproduce_token_labeling.py')
    p.add_argument('--quick', action='store_true', help=(
        f'smoke-sized: every table\'s rows (unless --table or --variants say), {QUICK["seeds"]} seed, '
        f'{QUICK["epochs"]} pretraining epoch on at most {QUICK["train_images"]} images (spread over the classes), '
        f'{QUICK["iters"]} segmentation iterations, the first '
        f'{QUICK["images"]} validation images'))
    p.add_argument('--seeds', type=positive_int, help=f'seeds per variant (default {SEEDS}; mean and std over them; '
                   f'differences from token labeling paired by seed)')
    add_device_argument(p)
    p.add_argument('--out', default='output/reproduce_token_labeling', help='output folder')
    p.add_argument('--variants', nargs='+', choices=list(VARIANTS), help='pretraining rows to compare')
    p.add_argument('--table', nargs='+', choices=list(TABLES), help='the rows of these tables of the paper (added to '
                   '--variants; without either: ' + ' '.join(DEFAULT_TABLES) + '): ' +
                   '; '.join(f'{name}: {", ".join(dict.fromkeys(rows))}' for name, rows in TABLES.items()))
    p.add_argument('--transfer', choices=('table7', 'all', 'none'), default='table7', help=(
        'the rows whose backbones are transferred to segmentation (FCN and UperNet, SS and MS): those of Table 7 '
        'among the rows run (default), all of them, or none; the others are compared by classification alone'))
    p.add_argument('--fcn-config', default='seg_configs/fcn_lvvit_s.py', help='the FCN config of the transfer')
    p.add_argument('--upernet-config', default='seg_configs/upernet_lvvit_s.py',
                   help='the UperNet config of the transfer')
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
    tables = args.table or ([] if args.variants else list(TABLES) if args.quick else DEFAULT_TABLES)
    chosen = set(args.variants or ()) | {row for table in tables for row in TABLES[table]}
    if args.cls_data_dir and not (args.table or args.variants):
        chosen -= DIGITS_ONLY  # --quick's every row, on your data: those that can run there
    args.variants = [variant for variant in VARIANTS if variant in chosen]  # token labeling first
    transfer = {'all': args.variants, 'table7': TABLES['7'], 'none': ()}[args.transfer]
    args.transferred = [variant for variant in args.variants if variant in transfer]
    if args.cls_data_dir and DIGITS_ONLY & set(args.variants):
        raise UsageError('the annotator rows (Figure 4 right) train on the embedded digits; on your data, make a '
                         'store per annotator (tools/generate_token_labels.py) and run token-labeling once per store')
    if (args.cls_data_dir is None) != (args.token_label_dir is None) and 'token-labeling' in args.variants:
        raise UsageError('--cls-data-dir and --token-label-dir go together (token labeling needs the store)')
    if args.cls_data_dir and set(ONLINE) & set(args.variants) and not args.annotator_checkpoint:
        raise UsageError('the online rows on your data need --annotator and --annotator-checkpoint (the annotator '
                         'your store was made with)')
    args.seeds = args.seeds or (QUICK['seeds'] if args.quick else SEEDS)
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
        logger.info(f'[{time.strftime("%H:%M:%S")}] {name}')
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
        argv += ['--train-images', str(QUICK['train_images'])] if a.quick else []
        argv += ['--device', a.device] if a.device else []
        argv += ['--model-kwargs', *(f'{k}={v!r}' for k, v in model_kwargs.items())] if model_kwargs else []
        if a.cls_data_dir:
            argv += ['--data-dir', a.cls_data_dir] + (['--token-label-dir', a.token_label_dir] if a.token_label_dir
                                                      else [])
        argv += a.cls_args
        self.same_command(run_dir / 'cls.command.json', 'train_cls.py', argv, (out / 'last.pth').is_file())
        if not (out / METRICS).is_file():
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
        argv = [config, '--work-dir', str(work), *data, '--cfg-options', f'model.backbone.pretrained={backbone}',
                f'randomness.seed={seed}', *self.validation_subset('val_dataloader')]
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
            subset = self.validation_subset('test_dataloader')
            argv += ['--cfg-options', *subset] if subset else []
            self.same_command(run_dir / f'{head}_{mode}.command.json', 'test_seg.py', argv, report.is_file())
            if not report.is_file():
                self.run(f'{variant} seed {seed}: {HEADS[head]} {MODES[mode]} test', 'test_seg.py', argv,
                         run_dir / f'{head}_test.log')
            values = json.loads(report.read_text())
            scores[mode] = {key: values[key] for key in SEG_METRICS}
        return scores

    def validation_subset(self, loader: str) -> list[str]:
        """--quick: the config option that keeps the first validation images of `loader` alone (none otherwise)."""
        return [f'{loader}.dataset.indices={QUICK["images"]}'] if self.args.quick else []


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


def row_colour(variant: str) -> str:
    """A row's colour, the same in every figure."""
    return f'C{list(VARIANTS).index(variant) % 10}'


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


def cell(stats: dict) -> str:
    return f'{stats["mean"]:.1f} ± {stats["std"]:.1f}'


def markdown_table(summary: dict, model: str, seeds: int, annotators: dict) -> str:
    """Every row's pretraining (top-1, time, paired difference from token labeling); the transferred rows in the
    paper's Table 7 layout with their paired differences; then the paper's other layouts for the rows that ran."""
    lines = ['| Pretraining | Top-1 (%) | Top-1 minus token labeling | Pretraining time |', '|---|---:|---:|---:|']
    for variant, entry in summary.items():
        difference = describe_difference(entry['vs_token_labeling']['top1']) if 'vs_token_labeling' in entry else '—'
        lines.append(f'| {VARIANTS[variant]} | {cell(entry["top1"])} | {difference} | {time_cell(summary, variant)} |')
    text = (f'{model}, {seeds} seed(s). Top-1 on the validation split, mean ± standard deviation over the seeds; '
            f'each row minus token labeling paired by seed (the same initialisation and data order), mean difference '
            f'[{CONFIDENCE:.0%} t interval] in percentage points, "within noise" where the interval holds 0. '
            f'Pretraining time: its epochs\' seconds summed, the fastest seed\'s, and its ratio to the Standard '
            f'(vanilla) row\'s.\n\n' + '\n'.join(lines) + '\n')
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
    then each transferred row minus token labeling, paired by seed."""
    columns = [(head, mode) for head in HEADS for mode in MODES]
    summary = results['summary']
    transfers = [variant for variant, entry in summary.items() if transferred(entry)]
    lines = ['| Pretraining | Top-1 | ' + ' | '.join(f'{HEADS[h]} {MODES[m]}' for h, m in columns) + ' |',
             '|---|' + '---:|' * (len(columns) + 1)]
    lines += [f'| paper: {VARIANTS[variant]} | {row["top1"]:.1f} | ' +
              ' | '.join(f'{row[h][m]:.1f}' for h, m in columns) + ' |' for variant, row in paper_table7.items()]
    lines += [f'| {VARIANTS[variant]} | {cell(summary[variant]["top1"])} | ' +
              ' | '.join(cell(summary[variant][h][m]['mIoU']) for h, m in columns) + ' |' for variant in transfers]
    lines += [f'| {VARIANTS[variant]}, minus token labeling | {top1_minus_token_labeling(summary, variant)} | ' +
              ' | '.join(describe_difference(summary[variant]['vs_token_labeling'][h][m]) for h, m in columns) + ' |'
              for variant in transfers if transferred(summary[variant].get('vs_token_labeling', {}))]
    return '\n'.join(lines)


def annotator_facts(variants: list[str]) -> dict:
    """Size and top-1 of the digits' annotators whose token-labeling rows ran (Figure 4 right)."""
    import timm

    names = [name for name, variant in ANNOTATOR_ROWS.items() if variant in variants]
    if len(names) < 2:
        return {}
    facts = {}
    for name in names:
        metrics = json.loads((REPO / EmbeddedScans(annotator=name).annotator_dir() / METRICS).read_text())
        model = timm.create_model(name, num_classes=10, **ANNOTATOR_KWARGS)
        facts[name] = {'top1': metrics['best_top1'], 'params': sum(p.numel() for p in model.parameters())}
    return facts


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


def main(argv: list[str] | None = None, description: str | None = None) -> dict:
    args = build_parser(description).parse_args(argv)
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
            cls_metrics = json.loads((cls_dir / METRICS).read_text())
            runs[(variant, seed)] = {'variant': variant, 'seed': seed, 'top1': cls_metrics['best_top1'],
                                     'train_seconds': training_seconds(cls_dir),
                                     'cls_metrics': str(cls_dir / METRICS)}
    for seed in range(args.seeds):
        for variant in args.transferred:
            run_dir = run_folder(out, variant, seed)
            for head, config in configs.items():
                runs[(variant, seed)][head] = stages.segment(variant, seed, head, config, run_dir / 'cls' / BEST,
                                                             run_dir)
    runs = list(runs.values())
    summary = summarise(runs)
    annotators = {} if args.cls_data_dir else annotator_facts(args.variants)
    settings = {key: value for key, value in vars(args).items() if key != 'cls_args'}
    results = {**measured_on(device_name(args.device)), 'date': time.strftime('%Y-%m-%d'), 'model': model,
               'model_kwargs': model_kwargs, 'settings': settings, 'runs': runs, 'summary': summary,
               'pairs': compare_pairs(runs), 'annotators': annotators, 'stage_seconds': stages.seconds,
               'seconds': round(time.time() - started, 1)}
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / 'results.json', results)
    (out / 'table.md').write_text(markdown_table(summary, model, args.seeds, annotators))
    figures = plot_tables(summary, annotators, out, f'{model}, {args.seeds} seed(s)')
    logger.info((out / 'table.md').read_text())
    logger.info(f'-> {out / "table.md"}, {out / "results.json"}' + ''.join(f', {path}' for path in figures))
    return results

