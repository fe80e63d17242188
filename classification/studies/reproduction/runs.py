"""The reproduction's runs (tools/reproduce_token_labeling.py): its options, every row's pretraining, transfer and
test through the suite's own commands (each through the studies' launcher, logged to a file, skipped when its result
exists), then the summary, its tables and figures written."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from backbones.common.cli import command_parser, positive_int
from backbones.common.devices import add_device_argument, device_name
from backbones.common.errors import UsageError
from backbones.common.log import logger
from backbones.common.outputs import check_output_folder
from backbones.dense.config import load_config
from classification.digits.cls_data import ANNOTATOR, ANNOTATOR_KWARGS, EmbeddedScans
from classification.digits.cls_data import RECIPE as DIGITS_RECIPE
from classification.engine.checkpoints import BEST, LAST, LOG, METRICS
from classification.recipes import recipe_for
from classification.studies.launcher import REPOSITORY, ToolStages
from classification.studies.reproduction.plots import plot_tables
from classification.studies.reproduction.rows import (
    ANNOTATOR_ROWS,
    DEFAULT_TABLES,
    DERIVED,
    DIGITS_ONLY,
    HEADS,
    MODES,
    ONLINE,
    SEG_METRICS,
    TABLES,
    VARIANTS,
)
from classification.studies.reproduction.summary import compare_pairs, summarise
from classification.studies.reproduction.tables import markdown_table
from classification.studies.results_file import write_results

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


class Stages(ToolStages):
    """The reproduction's stages: each row's pretraining and its transfers (`ToolStages`: one tool run each, logged,
    skipped when its result exists, refused when made with other settings)."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args.device)
        self.args = args

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
        self.same_command(run_dir / 'cls.command.json', 'train_cls', argv, (out / 'last.pth').is_file())
        if not (out / METRICS).is_file():
            argv += ['--resume'] if (out / 'last.pth').is_file() else []
            self.run(f'{variant} seed {seed}: pretraining {model}', 'train_cls', argv, run_dir / 'cls.log')
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
        if not (REPOSITORY / checkpoint).is_file():
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
        self.same_command(run_dir / f'{head}.command.json', 'train_seg', argv,
                          (work / 'last_checkpoint').is_file())
        if not (work / 'done').is_file():
            argv += ['--resume'] if (work / 'last_checkpoint').is_file() else []
            self.run(f'{variant} seed {seed}: {HEADS[head]} training', 'train_seg', argv, run_dir / f'{head}.log')
            (work / 'done').write_text((work / 'last_checkpoint').read_text())
        checkpoint = (work / 'done').read_text().strip()
        scores = {}
        for mode in MODES:
            report = work / f'{mode}.json'
            argv = [config, checkpoint, '--work-dir', str(work / f'test_{mode}'), *data, '--out', str(report),
                    *(['--ms'] if mode == 'ms' else [])]
            subset = self.validation_subset('test_dataloader')
            argv += ['--cfg-options', *subset] if subset else []
            self.same_command(run_dir / f'{head}_{mode}.command.json', 'test_seg', argv, report.is_file())
            if not report.is_file():
                self.run(f'{variant} seed {seed}: {HEADS[head]} {MODES[mode]} test', 'test_seg', argv,
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


def annotator_facts(variants: list[str]) -> dict:
    """Size and top-1 of the digits' annotators whose token-labeling rows ran (Figure 4 right)."""
    import timm

    names = [name for name, variant in ANNOTATOR_ROWS.items() if variant in variants]
    if len(names) < 2:
        return {}
    facts = {}
    for name in names:
        metrics = json.loads((REPOSITORY / EmbeddedScans(annotator=name).annotator_dir() / METRICS).read_text())
        model = timm.create_model(name, num_classes=10, **ANNOTATOR_KWARGS)
        facts[name] = {'top1': metrics['best_top1'], 'params': sum(p.numel() for p in model.parameters())}
    return facts


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
    figures = {'model': model, 'model_kwargs': model_kwargs, 'settings': settings, 'runs': runs, 'summary': summary,
               'pairs': compare_pairs(runs), 'annotators': annotators, 'stage_seconds': stages.seconds,
               'seconds': round(time.time() - started, 1)}
    out.mkdir(parents=True, exist_ok=True)
    results = write_results(out / 'results.json', 'reproduction', 'reproduce_token_labeling.py', argv, figures,
                            device_name(args.device))
    (out / 'table.md').write_text(markdown_table(summary, model, args.seeds, annotators))
    figures = plot_tables(summary, annotators, out, f'{model}, {args.seeds} seed(s)')
    logger.info((out / 'table.md').read_text())
    logger.info(f'-> {out / "table.md"}, {out / "results.json"}' + ''.join(f', {path}' for path in figures))
    return results

