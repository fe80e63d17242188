"""tools/transfer_report.py: a classifier's transfer battery. Each protocol is evaluated by the suite's own tools, run
as a stage (`ToolStages`) whose record (STAGES/NAME.json) is written, atomically, only when its figures are in: a kill
leaves a stage done or not done, and a rerun into the same --out keeps the done ones (a stopped dense training goes on
from its last checkpoint). Then one results file in the suite's envelope, a Markdown table and a bar chart. The
protocols' definitions are in docs/frozen_features.md."""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from backbones.common.cli import (
    add_model_kwargs_argument,
    add_workers_argument,
    command_parser,
    parse_model_kwargs,
    positive_int,
)
from backbones.common.devices import add_device_argument, device_name
from backbones.common.errors import UsageError
from backbones.common.files import load_weights_only, write_json_atomic
from backbones.common.log import logger
from backbones.common.outputs import check_output_folder
from backbones.dense.config import load_config
from backbones.dense.layouts import layout_of
from backbones.dense.runner import trained_data
from backbones.registry import check_model_name
from classification.digits.cls_data import EmbeddedScans
from classification.engine.checkpoints import ARCHITECTURE
from classification.studies.launcher import ToolStages
from classification.studies.results_file import write_results
from classification.studies.timing import timed

STAGES = 'stages'  # the folder of the stages' records, their logs and work folders


@dataclass(frozen=True)
class Protocol:
    """One row of the report: the evaluation (`title`, as the papers name it), the stage whose run gives its figure
    (the two probes share one run of tools/probe_features.py; a dense protocol trains and tests `config`), and that
    figure: `metric` in the stage's scores, times `scale` (a fraction shown in percent)."""

    title: str
    metric: str
    unit: str
    config: str | None = None  # None: the classification probes
    ms: bool = False  # tested at several scales with flips
    default: bool = True  # run when no --protocols are given (the frozen-feature ones)
    scale: float = 1.0

    def stage(self, name: str) -> str:
        return 'probes' if self.config is None else name


PROTOCOLS = {
    'knn': Protocol('k-NN, T 0.07 (DINOv2)', 'knn', 'top-1 %'),
    'linear': Protocol('linear probe (DINOv2)', 'linear', 'top-1 %'),
    'seg-linear': Protocol('lin. (DINOv2)', 'mIoU', 'mIoU %', 'seg_configs/linear_lvvit_s.py'),
    'seg-linear-ms': Protocol('+ms (DINOv2)', 'mIoU', 'mIoU %', 'seg_configs/linear_ms_lvvit_s.py', ms=True),
    'depth-linear': Protocol('lin. 1 (DINOv2)', 'd1', 'd1 %', 'seg_configs/depth_linear_lvvit_s.py', scale=100),
    'depth-linear4': Protocol('lin. 4 (DINOv2)', 'd1', 'd1 %', 'seg_configs/depth_linear4_lvvit_s.py', scale=100),
    'depth-dpt-frozen': Protocol('DPT, frozen encoder', 'd1', 'd1 %', 'seg_configs/depth_frozen_lvvit_s.py',
                                 scale=100),
    'upernet': Protocol('UperNet, fine-tuned', 'mIoU', 'mIoU %', 'seg_configs/upernet_lvvit_s.py', default=False),
    'maskrcnn': Protocol('Mask R-CNN, fine-tuned', 'box_AP', 'box AP', 'seg_configs/maskrcnn_lvvit_s.py',
                         default=False),
    'depth-dpt': Protocol('DPT, fine-tuned', 'd1', 'd1 %', 'seg_configs/depth_lvvit_s.py', default=False, scale=100),
}


@dataclass(frozen=True)
class Weights:
    """The classifier every protocol starts from: its model, and the weights as the probes (`probe_args`) and the
    dense configs (`model.backbone.pretrained=dense`) take them."""

    model: str
    model_kwargs: dict
    probe_args: list[str]
    dense: str
    described: str


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    p = command_parser(description, 'transfer_report.py')
    p.add_argument('weights', metavar='CHECKPOINT_OR_MODEL', help=(
        'a classifier\'s checkpoint (train_cls\'s or transfer\'s, which name their model; a release file with '
        '--model), or a model name: with --pretrained timm\'s released weights, else the model pretrained with token '
        'labeling on the embedded scans (trained on first use, minutes on 2 cores), for the embedded data'))
    p.add_argument('--model', help='the model of a checkpoint that does not record it (a release file)')
    add_model_kwargs_argument(p)
    p.add_argument('--pretrained', action='store_true', help='a model name: timm\'s released weights')
    p.add_argument('--protocols', nargs='+', choices=list(PROTOCOLS), metavar='PROTOCOL', help=(
        'the protocols to run, in this order (default: the frozen-feature ones, '
        f'{" ".join(name for name, p in PROTOCOLS.items() if p.default)}; by name also the fine-tuned '
        f'{" ".join(name for name, p in PROTOCOLS.items() if not p.default)})'))
    p.add_argument('--config', nargs='+', default=[], metavar='PROTOCOL=CONFIG', help=(
        'a dense protocol\'s config instead of its LV-ViT-S one on ADE20K or NYU-v2: another model\'s, another data '
        'set\'s (e.g. seg-linear=seg_configs/linear_lvvit_s_cityscapes.py)'))
    p.add_argument('--data', nargs='+', default=[], metavar='PROTOCOL=DIR', help=(
        'a protocol\'s data set on disk (the probes\': an ImageNet-layout folder, or any source probe_features '
        'reads; a dense one\'s: its config\'s layout); without it a protocol runs on the embedded digits'))
    p.add_argument('--iters', type=positive_int, help='dense training iterations (default: each config\'s schedule; '
                                                      'on the embedded data, its own)')
    p.add_argument('--probe-epochs', type=positive_int, help='epochs of the linear probes (default: the tool\'s)')
    add_workers_argument(p)
    add_device_argument(p)
    p.add_argument('--out', help='output folder (default: output/transfer_report/MODEL, or RUN_CHECKPOINT: the '
                                 'checkpoint\'s folder and name)')
    return p


def check_args(args: argparse.Namespace) -> None:
    args.protocols = args.protocols or [name for name, protocol in PROTOCOLS.items() if protocol.default]
    args.config, args.data = by_protocol(args, '--config'), by_protocol(args, '--data')
    probes = [name for name in args.config if PROTOCOLS[name].config is None]
    if probes:
        raise UsageError(f'--config {probes[0]}=...: the probes take no config (they run tools/probe_features.py)')
    if len({value for name, value in args.data.items() if PROTOCOLS[name].config is None}) > 1:
        raise UsageError('--data knn=... and linear=...: the two probes share one run, so one data set')
    dense = [PROTOCOLS[name].config is not None for name in args.protocols]
    for option, value, used in (('--iters', args.iters, any(dense)), ('--probe-epochs', args.probe_epochs,
                                                                        not all(dense))):
        if value is not None and not used:
            raise UsageError(f'{option} {value}: none of the protocols run ({" ".join(args.protocols)}) takes it')


def by_protocol(args: argparse.Namespace, option: str) -> dict[str, str]:
    """`option`'s `PROTOCOL=VALUE ...` as a dict, each of the protocols run, given once."""
    values = {}
    for item in getattr(args, option.lstrip('-')):
        name, sep, value = item.partition('=')
        if not sep or not value:
            raise UsageError(f'{option} takes PROTOCOL=VALUE, got {item!r}')
        if name not in PROTOCOLS:
            raise UsageError(f'{option} {item}: no protocol {name!r} (the protocols: {", ".join(PROTOCOLS)})')
        if name not in args.protocols:
            raise UsageError(f'{option} {item}: {name} is not among the protocols run ({" ".join(args.protocols)})')
        if name in values:
            raise UsageError(f'{option}: {name} given twice')
        values[name] = value
    return values


CHECKPOINT_SUFFIXES = ('.pth', '.pt', '.tar', '.bin', '.ckpt')
# a run's model arguments that shape its training, not the model the protocols evaluate (they run it in eval mode, a
# dense config sets its own drop-path rate)
TRAINING_ONLY = {'drop_rate', 'drop_path_rate', 'attn_drop_rate', 'proj_drop_rate', 'pos_drop_rate', 'patch_drop_rate'}
# options that change how a stage runs, not what it makes: a rerun may change them
HOW_IT_RUNS = ('--workers', '--device')


def is_checkpoint(weights: str) -> bool:
    return Path(weights).exists() or weights.endswith(CHECKPOINT_SUFFIXES)


def default_out(weights: str) -> Path:
    """output/transfer_report/MODEL, or RUN_CHECKPOINT for a checkpoint (its folder's name and its own)."""
    name = f'{Path(weights).parent.name}_{Path(weights).stem}'.lstrip('_') if is_checkpoint(weights) else weights
    return Path('output') / 'transfer_report' / name


def report_model(args: argparse.Namespace) -> tuple[str, dict]:
    """The model the protocols start from and its arguments: a checkpoint's (what it records, else --model), or the
    name given."""
    kwargs = parse_model_kwargs(args.model_kwargs)
    if not is_checkpoint(args.weights):
        if args.model:
            raise UsageError(f'--model names the model of a checkpoint; {args.weights} is a model name')
        check_model_name(args.weights)
        return args.weights, kwargs
    if args.pretrained:
        raise UsageError(f'--pretrained takes timm\'s weights of a model name; {args.weights} is a checkpoint')
    checkpoint = load_weights_only(args.weights, 'classifier checkpoint', mmap=True)
    architecture = (checkpoint.get(ARCHITECTURE) if isinstance(checkpoint, dict) else None) or {}
    if args.model and architecture.get('model') not in (None, args.model):
        raise UsageError(f'--model {args.model}: {args.weights} holds {architecture["model"]}')
    model = args.model or architecture.get('model')
    if model is None:
        raise UsageError(f'{args.weights} does not record its model (a release file): give --model')
    check_model_name(model)
    recorded = {k: v for k, v in architecture.get('kwargs', {}).items() if k not in TRAINING_ONLY}
    return model, {**recorded, **kwargs}  # the run's own, then --model-kwargs


def report_weights(args: argparse.Namespace, model: str, kwargs: dict) -> Weights:
    """The weights as the probes and the dense configs take them (CHECKPOINT_OR_MODEL, see its help); a model pretrained
    on the embedded scans is trained here the first time."""
    if is_checkpoint(args.weights):
        path = str(Path(args.weights).resolve())
        return Weights(model, kwargs, ['--checkpoint', path], path, path)
    if args.pretrained:
        return Weights(model, kwargs, ['--pretrained'], 'timm', 'timm\'s released weights')
    if args.data:
        raise UsageError(f'{model} without a checkpoint or --pretrained is the model pretrained on the embedded '
                         f'scans, for the embedded data; --data {next(iter(args.data))}=... is yours: give a '
                         f'checkpoint or --pretrained')
    path = str(EmbeddedScans().pretrained_backbone(model, kwargs).resolve())
    return Weights(model, kwargs, ['--checkpoint', path], path, 'pretrained on the embedded scans')


def check_configs(args: argparse.Namespace, model: str, kwargs: dict) -> dict[str, str]:
    """Each dense protocol's config, whose backbone must be the report's model."""
    configs = {}
    for name in args.protocols:
        config = args.config.get(name, PROTOCOLS[name].config)
        if config is None:
            continue
        backbone = load_config(config).model.backbone
        built = (backbone.get('model_name'), dict(backbone.get('model_kwargs') or {}))
        if built != (model, kwargs):
            raise UsageError(f'{name}: {config} builds {described(*built)}, not {described(model, kwargs)}: give '
                             f'--config {name}=CONFIG with its backbone')
        configs[name] = config
    return configs


def without_options(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """`argv` without `options` and their values."""
    return [arg for i, arg in enumerate(argv) if arg not in options and (i == 0 or argv[i - 1] not in options)]


def described(model: str, kwargs: dict) -> str:
    return f'{model} with {kwargs}' if kwargs else model


class ReportStages(ToolStages):
    """The report's stages: each one's record STAGES/NAME.json ({'scores', 'data', 'seconds'}) written when it is
    done, and read instead of running it again (with the settings it was made with: `same_command`)."""

    def __init__(self, args: argparse.Namespace, weights: Weights, configs: dict[str, str], out: Path) -> None:
        super().__init__(args.device)
        self.args, self.weights, self.configs, self.folder = args, weights, configs, out / STAGES

    def record(self, stage: str) -> dict:
        """The stage's record: kept from an earlier run, or its run's."""
        tool, argv, started = self.probe_command() if stage == 'probes' else self.train_command(stage)
        if self.same_command(self.folder / f'{stage}.command.json', tool, without_options(argv, HOW_IT_RUNS), started):
            shutil.rmtree(self.folder / stage, ignore_errors=True)  # what a stopped try with other settings left
        path = self.folder / f'{stage}.json'
        if path.is_file():
            done = json.loads(path.read_text())
            logger.info(f'{stage}: done in an earlier run ({done["seconds"]:.0f} s), kept')
            return done
        (scores, data), seconds = timed(lambda: self.probes(argv) if stage == 'probes' else self.dense(stage, argv))
        done = {'scores': scores, 'data': data, 'seconds': round(seconds, 1)}
        write_json_atomic(path, done)
        logger.info(f'{stage}: done in {done["seconds"]:.0f} s')
        return done

    @property
    def probe_results(self) -> Path:
        return self.folder / 'probes' / 'results.json'

    def probe_data(self) -> str | None:
        """The probes' --data (one for both), None: the embedded scans."""
        return self.args.data.get('knn') or self.args.data.get('linear')

    def probe_command(self) -> tuple[str, list[str], bool]:
        a, w, out, data = self.args, self.weights, self.probe_results, self.probe_data()
        argv = [w.model, *w.probe_args, '--json', out, '--feature-cache', out.parent / 'features']
        argv += ['--model-kwargs', *(f'{k}={v!r}' for k, v in w.model_kwargs.items())] if w.model_kwargs else []
        argv += (['--data-dir', data] if data else []) + (['--epochs', a.probe_epochs] if a.probe_epochs else [])
        argv += ['--workers', a.workers, *(['--device', a.device] if a.device else [])]
        return 'probe_features', [str(arg) for arg in argv], out.is_file()

    def probes(self, argv: list[str]) -> tuple[dict, str]:
        self.probe_results.parent.mkdir(parents=True, exist_ok=True)
        self.run('probes: k-NN and linear (tools/probe_features.py)', 'probe_features', argv,
                 self.folder / 'probes.log')
        results = json.loads(self.probe_results.read_text())
        scores = {kind: results[kind]['chosen']['test'] for kind in ('knn', 'linear')}
        data = results['data'] if self.probe_data() else 'the embedded digits scans'
        return {**scores, 'chosen': {'k': results['knn']['chosen']['k'], 'head': results['linear']['chosen']}}, data

    def train_command(self, name: str) -> tuple[str, list[str], bool]:
        a, work = self.args, self.folder / name
        argv = [self.configs[name], '--work-dir', str(work), *self.data_root(name), '--cfg-options',
                f'model.backbone.pretrained={self.weights.dense}', *(['--iters', str(a.iters)] if a.iters else [])]
        return 'train_seg', argv, (work / 'last_checkpoint').is_file()

    def data_root(self, name: str) -> list[str]:
        return ['--data-root', self.args.data[name]] if name in self.args.data else []

    def dense(self, name: str, argv: list[str]) -> tuple[dict, str]:
        """train_seg then test_seg of the protocol's config from the report's weights; a stopped training goes on
        (--resume)."""
        protocol, config, work = PROTOCOLS[name], self.configs[name], self.folder / name
        if not (work / 'trained').is_file():
            argv += ['--resume'] if (work / 'last_checkpoint').is_file() else []
            self.run(f'{name}: {protocol.title}, training (tools/train_seg.py)', 'train_seg', argv,
                     self.folder / f'{name}.log')
            write_json_atomic(work / 'trained', (work / 'last_checkpoint').read_text().strip())
        checkpoint = json.loads((work / 'trained').read_text())
        report = work / 'scores.json'
        argv = [config, checkpoint, '--work-dir', str(work / 'test'), *self.data_root(name), '--out', str(report),
                *(['--ms'] if protocol.ms else [])]
        self.run(f'{name}: {protocol.title}, test (tools/test_seg.py)', 'test_seg', argv, self.folder / f'{name}.log')
        scores = json.loads(report.read_text())
        return {key: value for key, value in scores.items() if not isinstance(value, (dict, list))}, \
            data_words(config, checkpoint)


@contextlib.contextmanager
def locked(out: Path) -> Iterator[None]:
    """`out` held by this report alone (an advisory lock the system drops when the process ends): a second report into
    it, say one started while a hung-up one's stage still ran, is refused instead of training beside it."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / '.lock', 'w') as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f'{out} is in use by another transfer report: wait for it, or give another '
                             f'--out') from None
        yield


def data_words(config: str, checkpoint: str) -> str:
    """The data set a dense protocol ran on, in words: its config's layout, and the embedded digits or its folder."""
    dataset = load_config(config).test_dataloader.dataset
    layout = layout_of(dataset)
    title = layout.title if layout is not None else dataset.get('type', 'data set')
    record = trained_data(checkpoint) or {}
    return f'{title} ({"the embedded digits" if record.get("embedded") else record.get("data_root", "?")})'


def report_rows(protocols: list[str], done: dict[str, dict]) -> list[dict]:
    rows = []
    for name in protocols:
        protocol, stage = PROTOCOLS[name], done[PROTOCOLS[name].stage(name)]
        rows.append({'protocol': name, 'evaluation': protocol.title, 'data': stage['data'], 'metric': protocol.unit,
                     'score': round(stage['scores'][protocol.metric] * protocol.scale, 2),
                     'seconds': stage['seconds'], 'stage': protocol.stage(name)})
    return rows


def markdown_table(figures: dict) -> str:
    """The report's table, from its results' figures (docs/frozen_features.md renders it from the results file)."""
    lines = [f'Transfer report of {figures["model"]} ({figures["weights"]}), {figures["seconds"] / 60:.1f} min in all',
             '', '| protocol | evaluation | data set | metric | score | time |', '|---|---|---|---|---:|---:|']
    for row in figures['rows']:
        shared = ' (both probes)' if row['stage'] == 'probes' else ''
        lines.append(f'| {row["protocol"]} | {row["evaluation"]} | {row["data"]} | {row["metric"]} | '
                     f'{row["score"]:.2f} | {row["seconds"] / 60:.1f} min{shared} |')
    return '\n'.join(lines) + '\n'


def bar_chart(rows: list[dict], title: str, path: Path) -> None:
    """One horizontal bar per protocol, its score (every metric a percentage) written beside it."""
    from backbones.common.drawing import figure

    fig, axes = figure(1, 1, (7.0, 1.0 + 0.45 * len(rows)))
    ax = axes[0][0]
    labels = [f'{row["protocol"]}\n{row["metric"]}' for row in rows]
    bars = ax.barh(labels[::-1], [row['score'] for row in rows][::-1], color='tab:blue')
    ax.bar_label(bars, fmt='%.1f', padding=3)
    ax.set_xlim(0, 112)  # room for a label beside a bar at 100
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None, description: str | None = None) -> dict:
    args = build_parser(description).parse_args(argv)
    check_args(args)
    out = Path(args.out or default_out(args.weights))
    check_output_folder(out)
    model, kwargs = report_model(args)
    configs = check_configs(args, model, kwargs)
    weights = report_weights(args, model, kwargs)
    stages = ReportStages(args, weights, configs, out)
    order = list(dict.fromkeys(PROTOCOLS[name].stage(name) for name in args.protocols))
    done = {}
    with locked(out):
        for number, stage in enumerate(order, 1):
            logger.info(f'report stage {number}/{len(order)}: {stage}')
            done[stage] = stages.record(stage)
    rows = report_rows(args.protocols, done)
    figures = {'model': model, 'model_kwargs': kwargs, 'weights': weights.described, 'rows': rows, 'stages': done,
               'seconds': round(sum(stage['seconds'] for stage in done.values()), 1)}
    results = write_results(out / 'results.json', 'transfer_report', 'transfer_report.py', argv, figures,
                            device_name(args.device))
    (out / 'report.md').write_text(markdown_table(figures))
    bar_chart(rows, f'{model} ({weights.described})', out / 'report.png')
    logger.info((out / 'report.md').read_text())
    logger.info(f'-> {out / "report.md"}, {out / "report.png"}, {out / "results.json"}')
    return results
