"""ImageNet's size rehearsed on local disk through the suite's own code (tools/rehearse_scale.py): file trees,
the label store, listing, loader-worker memory, the first update and checkpoints at full size."""
from __future__ import annotations

import argparse
import functools
import io
import os
import shutil
import tarfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from backbones import bare_model
from backbones.common.cli import SAME_WORK_EVERYWHERE, add_workers_argument, command_parser, fraction, positive_int
from backbones.common.distributed import DistInfo
from backbones.common.errors import UsageError
from backbones.common.files import write_atomic, write_json_atomic
from backbones.common.images import scan_split
from backbones.common.log import logger
from backbones.common.outputs import output_file, output_folder
from backbones.registry import check_model_name
from classification.data.folders import ImageFolderDataset, collate_skipping
from classification.engine.memory import ChildMemory, Memory, child_pids, process_memory
from classification.engine.samplers import Batching, sharded_loaders
from classification.engine.trainer import RunOptions, Trainer
from classification.models import model_data_config
from classification.recipes import recipe_for
from classification.sources.source import open_split
from classification.studies.launcher import REPOSITORY, LaunchedCommand, tool_command
from classification.studies.results_file import write_results
from classification.studies.timing import timed
from classification.token_labeling.label_store import (
    DEFAULT_SHARD_SIZE,
    VERIFIED,
    StoreRows,
    TokenLabelStore,
    read_marker,
    read_meta,
    write_label_store,
)
from classification.token_labeling.released_labels import (
    IMPORT_SHAPING,
    RELEASES,
    centre_square,
    import_released_labels,
    load_map,
    release_meta,
    store_row,
)
from classification.training_pieces import training_pieces

TRAIN_IMAGES, VAL_IMAGES, NUM_CLASSES = 1_281_167, 50_000, 1000
RELEASE_SHAPE = (2, 5, 18, 18)  # TokenLabeling's NFNet-F6 release: [scores, classes] x top-5 x 18 x 18
JPEG_SIZES = ((64, 48), (48, 64), (56, 56))  # wide, tall and square: the centre-square extents differ
STAGES = ('build', 'listing', 'import', 'store', 'dataset', 'pass', 'val-listing', 'first-step', 'checkpoint',
          'tar-build', 'tar-listing', 'tar-pass', 'tar-vs-folders', 'tar-first-step')
LAYOUTS = {'folders': 'imagenet', 'tars': 'imagenet-tar'}  # the data folder of each layout under --root
DEFAULT_STAGES = tuple(stage for stage in STAGES if stage != 'import' and not stage.startswith('tar-'))
CHECKPOINT_MODELS = ('lvvit_l', 'cait_m48_448')
MB = 1024 ** 2
COMPARE_ROUNDS, COMPARE_BATCHES = 4, 20  # tar-vs-folders: rounds of each reader, batches timed in each


def parse_args(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    p = command_parser(description, 'rehearse_scale.py')
    p.add_argument('--root', type=output_folder, default=REPOSITORY / 'output' / 'rehearse_scale',
                   help='where the trees, the store and the runs go (kept and reused)')
    p.add_argument('--scale', type=fraction, default=1.0, help="fraction of ImageNet's images (1,000 classes)")
    p.add_argument('--stages', nargs='+', choices=STAGES, default=list(DEFAULT_STAGES),
                   help='the stages to run (in the order above)')
    add_workers_argument(p, 2, SAME_WORK_EVERYWHERE, least=1)
    p.add_argument('--processes', type=positive_int, default=2, help='training processes of the first step')
    p.add_argument('--batch-size', type=positive_int, default=256, help='batch of the pass')
    p.add_argument('--pass-images', type=positive_int, metavar='N',
                   help='end the pass after about N images (default: the whole epoch)')
    p.add_argument('--checkpoint-models', nargs='+', default=list(CHECKPOINT_MODELS), metavar='MODEL',
                   help='the models whose training checkpoints are written and timed')
    p.add_argument('--json', type=output_file, metavar='FILE', help='also write the figures as JSON')
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------------------- trees

def class_names() -> list[str]:
    return [f'n{i:08d}' for i in range(NUM_CLASSES)]


def per_class(total: int, scale: float) -> list[int]:
    """Images of each class: `total x scale` spread over the classes, at least one each."""
    count = max(NUM_CLASSES, round(total * scale))
    return [count // NUM_CLASSES + (c < count % NUM_CLASSES) for c in range(NUM_CLASSES)]


def tiny_jpegs() -> list[bytes]:
    """Noise JPEGs of a few KB, one per size of JPEG_SIZES."""
    rng = np.random.default_rng(0)
    encoded = []
    for width, height in JPEG_SIZES:
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, 'JPEG', quality=75)
        encoded.append(buffer.getvalue())
    return encoded


def release_file() -> bytes:
    """One released map, as the release saves it: top-5 logits (descending) and class indices stored as floats."""
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(RELEASE_SHAPE[1:], generator=generator).sort(dim=0, descending=True).values
    classes = torch.randint(0, NUM_CLASSES, RELEASE_SHAPE[1:], generator=generator).float()
    buffer = io.BytesIO()
    torch.save(torch.stack([scores, classes]).half(), buffer)
    return buffer.getvalue()


def write_class(data: Path, release: Path, name: str, train: int, val: int, first_val: int, jpegs: list[bytes],
                label: bytes) -> None:
    for folder in (data / 'train' / name, data / 'val' / name, release / name):
        folder.mkdir(parents=True, exist_ok=True)
    for i in range(train):
        stem = f'{name}_{i}'
        (data / 'train' / name / f'{stem}.JPEG').write_bytes(jpegs[i % len(jpegs)])
        (release / name / f'{stem}.pt').write_bytes(label)
    for i in range(val):
        (data / 'val' / name / f'ILSVRC2012_val_{first_val + i + 1:08d}.JPEG').write_bytes(jpegs[i % len(jpegs)])


def write_class_tar(path: Path, names: list[str], jpegs: list[bytes]) -> None:
    """A tar of `names` (each member the tiny JPEG its position gives, as in the class folders), written atomically."""
    def write(f) -> None:
        with tarfile.open(fileobj=f, mode='w') as tar:
            for i, name in enumerate(names):
                info = tarfile.TarInfo(name)
                info.size = len(jpegs[i % len(jpegs)])
                tar.addfile(info, io.BytesIO(jpegs[i % len(jpegs)]))

    write_atomic(path, write)


def build_tars(root: Path, scale: float) -> dict:
    """The image tree as tars (`root/imagenet-tar`): the training split 1,000 per-class tars, the validation split one
    tar of class folders; the same names and bytes, so one label store serves both."""
    data = root / LAYOUTS['tars']
    shutil.rmtree(data, ignore_errors=True)
    (data / 'train').mkdir(parents=True)
    train, val = per_class(TRAIN_IMAGES, scale), per_class(VAL_IMAGES, scale)
    first_val = np.concatenate([[0], np.cumsum(val)[:-1]]).tolist()
    jpegs, names = tiny_jpegs(), class_names()

    def write() -> None:
        for c, name in enumerate(names):
            write_class_tar(data / 'train' / f'{name}.tar', [f'{name}_{i}.JPEG' for i in range(train[c])], jpegs)
        write_class_tar(data / 'val.tar', [f'{name}/ILSVRC2012_val_{first_val[c] + i + 1:08d}.JPEG'
                                           for c, name in enumerate(names) for i in range(val[c])], jpegs)
        os.sync()

    before = disk_used(root)
    _, seconds = timed(write)
    return {'scale': scale, 'train': sum(train), 'val': sum(val), 'seconds': seconds,
            'disk_bytes': disk_used(root) - before}


def disk_used(path: Path) -> int:
    usage = shutil.disk_usage(path)
    return usage.total - usage.free


def build_trees(root: Path, scale: float) -> dict:
    """The image tree and the release tree under `root`, unless `root/built.json` says they are at this scale."""
    record = root / 'built.json'
    built = read_marker(record) or {}  # unreadable (a build killed while writing it): built again
    if built.get('scale') == scale:
        if not (read_meta(root / 'store') or {}).get('complete'):  # a build stopped while writing the store
            shutil.rmtree(root / 'store', ignore_errors=True)
            write_store(root)
        return {**built, 'reused': True}
    for folder in ('imagenet', 'release', 'store'):
        shutil.rmtree(root / folder, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    train, val = per_class(TRAIN_IMAGES, scale), per_class(VAL_IMAGES, scale)
    first_val = np.concatenate([[0], np.cumsum(val)[:-1]]).tolist()
    jpegs, label = tiny_jpegs(), release_file()

    def write_trees() -> None:
        with ThreadPoolExecutor(4) as pool:  # file creation waits on the file system more than on Python
            list(pool.map(lambda c: write_class(root / 'imagenet', root / 'release', class_names()[c], train[c],
                                                val[c], first_val[c], jpegs, label), range(NUM_CLASSES)))
        write_store(root)
        os.sync()

    before = disk_used(root)
    _, seconds = timed(write_trees)
    built = {'scale': scale, 'train': sum(train), 'val': sum(val), 'files': 2 * sum(train) + sum(val),
             'seconds': seconds, 'disk_bytes': disk_used(root) - before}
    write_json_atomic(record, built)
    return {**built, 'reused': False}


def write_store(root: Path) -> None:
    """`root/store`: the store importing `root/release` gives (its meta data, rows and extents), written directly by
    the store's writer: every release file holds the same map, and the n-th image of a class has JPEG_SIZES[n % 3]."""
    classes, samples = scan_split(root / 'imagenet', 'train')
    paths = [path for path, _ in samples]
    release = RELEASES['tokenlabeling']
    value = load_map(root / 'release' / classes[0] / f'{Path(paths[0]).stem}.pt')
    meta = release_meta(release, tuple(value.shape), root / 'release', classes, paths, 'train', DEFAULT_SHARD_SIZE)
    scores, class_ids = store_row(value)
    extents = np.array([centre_square(size) for size in JPEG_SIZES], dtype=np.float32)
    sizes = np.array([int(Path(path).stem.rsplit('_', 1)[1]) % len(JPEG_SIZES) for path in paths])

    def shard_rows(start: int, stop: int) -> Iterator[StoreRows]:
        yield StoreRows(np.arange(start, stop), (scores, class_ids, extents[sizes[start:stop]]))

    write_label_store(root / 'store', meta, paths, IMPORT_SHAPING, DistInfo(), shard_rows, with_extent=True,
                      skipped_key='missing')


# --------------------------------------------------------------------------------------------------------- stages

class MeasurementTable:
    """The rehearsal's measurements: a table row each (stage, what, value), and the values by stage for JSON."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []
        self.values: dict[str, dict] = {}

    def add(self, stage: str, what: str, value: float | int | str | list, shown: str | None = None) -> None:
        self.values.setdefault(stage, {})[what] = value
        self.rows.append((stage, what, shown if shown is not None else str(value)))
        logger.info(f'  {stage:12s} {what:44s} {self.rows[-1][2]}')

    def markdown(self) -> str:
        lines = ['| stage | figure | value |', '|---|---|---:|']
        return '\n'.join(lines + [f'| {stage} | {what} | {value} |' for stage, what, value in self.rows])


Recorder = Callable[..., None]  # a stage's rows: MeasurementTable.add with the stage's name given


def mb(value: int) -> str:
    return f'{value / MB:,.0f} MB'


def stage_build(args: argparse.Namespace, add: Recorder) -> None:
    built = build_trees(args.root, args.scale)
    add('training / validation images', f'{built["train"]:,} / {built["val"]:,}')
    add('training images, millions', built['train'] / 1000000, f'{built["train"] / 1e6:.2f}M')
    if built['reused']:
        add('trees', 'reused from an earlier run')
        return
    add('files written (images and release)', built['files'])
    add('seconds', round(built['seconds'], 1))
    add('disk used', built['disk_bytes'], f'{built["disk_bytes"] / 1024 ** 3:.1f} GB')


def stage_listing(args: argparse.Namespace, add: Recorder, split: str = 'train') -> None:
    before = process_memory().uss
    (_, samples), seconds = timed(lambda: scan_split(args.root / 'imagenet', split))
    add('files listed', len(samples))
    add('seconds', round(seconds, 2))
    add('files/s', round(len(samples) / seconds), f'{len(samples) / seconds:,.0f}')
    grown = process_memory().uss - before
    add('memory of the listing (USS)', grown, mb(grown))


def stage_import(args: argparse.Namespace, add: Recorder) -> None:
    store = args.root / 'imported'
    shutil.rmtree(store, ignore_errors=True)
    _, seconds = timed(lambda: import_released_labels(args.root / 'imagenet', args.root / 'release', store,
                                                      DistInfo(), workers=args.workers))
    imported = TokenLabelStore(store, verify=False)
    rows = len(imported)
    size = sum(f.stat().st_size for f in store.iterdir() if f.is_file())
    add('files imported', rows)
    add('seconds', round(seconds, 1))
    add('files/s', round(rows / seconds), f'{rows / seconds:,.0f}')
    add('store size', size, f'{size / 1024 ** 3:.2f} GB')
    same = all(np.array_equal(a, b) for a, b in zip(imported.arrays(),
                                                      TokenLabelStore(args.root / 'store', verify=False).arrays()))
    add('rows equal to the directly written store', same)
    shutil.rmtree(store)


def stage_store(args: argparse.Namespace, add: Recorder) -> None:
    before = process_memory().uss
    store, seconds = timed(lambda: TokenLabelStore(args.root / 'store', verify=False))
    add('open without verification, seconds', round(seconds, 2))
    grown = process_memory().uss - before
    add('memory of the open store (USS)', grown, mb(grown))
    del store
    forget_verification(args.root)
    _, seconds = timed(lambda: TokenLabelStore(args.root / 'store', verify=True))
    add('open with verification, seconds', round(seconds, 1))
    if (args.root / 'store' / VERIFIED).exists():  # recorded: the next opening reads no row
        _, seconds = timed(lambda: TokenLabelStore(args.root / 'store', verify=True))
        add(f'open again ({VERIFIED} recorded), seconds', round(seconds, 2))


def forget_verification(root: Path) -> None:
    """Remove the store's record of its last verification: the next opening reads every row, as a first run's."""
    (root / 'store' / VERIFIED).unlink(missing_ok=True)


class ImageSize:
    """A stand-in for the augmentation: the decoded image's size (the pass measures the index and the store)."""

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return torch.tensor(image.size)


def training_set(args: argparse.Namespace, layout: str = 'folders', labels: bool = True) -> ImageFolderDataset:
    return ImageFolderDataset(args.root / LAYOUTS[layout], 'train', ImageSize(),
                              label_store=TokenLabelStore(args.root / 'store', verify=False) if labels else None)


def stage_dataset(args: argparse.Namespace, add: Recorder) -> None:
    before = process_memory().uss
    dataset, seconds = timed(lambda: training_set(args))
    add('images', len(dataset))
    add('seconds to build', round(seconds, 1))
    grown = process_memory().uss - before
    add('memory of the dataset (USS)', grown, mb(grown))


def stage_pass(args: argparse.Namespace, add: Recorder, layout: str = 'folders') -> None:
    dataset = training_set(args, layout)
    loader = sharded_loaders(dataset, [], Batching(args.batch_size, args.workers, 0, collate_skipping), DistInfo())[0]
    loader.sampler.set_epoch(0)
    dataset.set_epoch(0, 0)
    batches = min(len(loader), -(-(args.pass_images or len(dataset)) // args.batch_size))
    memory = ChildMemory()

    def read_pass() -> int:
        seen = 0
        for n, batch in enumerate(loader, 1):
            seen += len(batch['label'])
            if n in (1, batches):  # the workers' memory once they started, and once they read their last batch
                memory.sample()
            if n == batches:
                break
        return seen

    seen, seconds = timed(read_pass)
    add('images read (shuffled order)', seen)
    add('seconds', round(seconds, 1))
    add('images/s', round(seen / seconds), f'{seen / seconds:,.0f}')
    for n, pid in enumerate(sorted(memory.first)):
        first, last = memory.first[pid], memory.last[pid]
        add(f'worker {n}: USS at start / end', [first.uss, last.uss], f'{mb(first.uss)} / {mb(last.uss)}')
        add(f'worker {n}: private dirty at start / end', [first.dirty, last.dirty],
            f'{mb(first.dirty)} / {mb(last.dirty)}')
        add(f'worker {n}: private dirty growth over the pass', last.dirty - first.dirty, mb(last.dirty - first.dirty))
        add(f'worker {n}: PSS at end', last.pss, mb(last.pss))


def first_step(args: argparse.Namespace, output: Path, data: Path) -> tuple[float, list[Memory], list[str]]:
    """`torchrun train_cls.py` to its first logged update: seconds, the processes' memory then, the log."""
    shutil.rmtree(output, ignore_errors=True)
    command = tool_command(
        'train_cls',
        ['lvvit_s', '--model-kwargs', 'embed_dim=48', 'depth=2', 'num_heads=2', '--data-dir', data,
         '--token-label-dir', args.root / 'store', '--img-size', '32', '--batch-size', '32', '--workers', args.workers,
         '--log-interval', '1', '--pictures', '0', '--device', 'cpu', '--output', output], processes=args.processes)
    with LaunchedCommand(command, env={'OMP_NUM_THREADS': '1'}) as run:
        for _ in run.updates():
            memory = [process_memory(pid) for pid in child_pids(run.process.pid)]
            return run.seconds_since_launch(), memory, run.log.copy()  # the stop's lines are read into `log` too
        raise run.ended_before('its first update')


def stage_first_step(args: argparse.Namespace, add: Recorder, layout: str = 'folders') -> None:
    """Two starts of train_cls: the first as a first run's (the store verified; the tars indexed), then a restart."""
    data = args.root / LAYOUTS[layout]
    forget_verification(args.root)
    if layout == 'tars':
        forget_tar_indexes(data)
    for name in ('first start', 'second start'):
        seconds, memory, log = first_step(args, args.root / 'first_step', data)
        add(f'{name}: seconds to the first update', round(seconds, 1))
        add(f'{name}: training processes\' USS', [m.uss for m in memory], ' / '.join(mb(m.uss) for m in memory))
        store_lines = [line.split('] ')[-1][:120] for line in log
                       if ' verified' in line or ': listed ' in line or ': the index of ' in line]
        add(f'{name}: log', store_lines, '; '.join(store_lines))


def forget_tar_indexes(data: Path) -> None:
    """Remove the tars' kept indexes: the next listing indexes them again, as a first run's."""
    for index in [*data.glob('*.index.npz'), *data.glob('*/tars.index.npz')]:
        index.unlink()


def stage_tar_build(args: argparse.Namespace, add: Recorder) -> None:
    built = build_tars(args.root, args.scale)
    add('training / validation images', f'{built["train"]:,} / {built["val"]:,}')
    add('seconds', round(built['seconds'], 1))
    add('disk used', built['disk_bytes'], f'{built["disk_bytes"] / 1024 ** 3:.1f} GB')


def files_under(folder: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(folder))


def stage_tar_listing(args: argparse.Namespace, add: Recorder) -> None:
    data = args.root / LAYOUTS['tars']
    forget_tar_indexes(data)
    before = process_memory().uss
    for name in ('indexing the tars and listing', 'listing from the kept index'):
        samples, seconds = timed(lambda: open_split(data, 'train').samples)  # the listing alone, not its reader
        add(f'{name}: seconds', round(seconds, 1))
    add('images listed', len(samples))
    add('images listed, millions', len(samples) / 1000000, f'{len(samples) / 1e6:.2f}M')
    add('files of the training split on disk (tars and index)', files_under(data / 'train'))
    if (args.root / LAYOUTS['folders'] / 'train').is_dir():
        add('files of the training split as class folders', files_under(args.root / LAYOUTS['folders'] / 'train'))
    index = data / 'train' / 'tars.index.npz'
    add('index size', index.stat().st_size, mb(index.stat().st_size))
    grown = process_memory().uss - before
    add('memory of the listing (USS)', grown, mb(grown))


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process `pid` so far (/proc/PID/stat)."""
    fields = Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def timed_batches(loader, batches: int) -> tuple[int, float, float]:
    """Images, wall and CPU seconds (with its workers) of `batches` batches after an untimed first."""
    iterator = iter(loader)
    next(iterator)
    pids = [os.getpid()] + child_pids()
    cpu_before, start, seen = sum(map(cpu_seconds, pids)), time.perf_counter(), 0
    for _ in range(batches):
        seen += len(next(iterator)['label'])
    seconds, cpu = time.perf_counter() - start, sum(map(cpu_seconds, pids)) - cpu_before
    del iterator  # its workers end
    return seen, seconds, cpu


def stage_tar_vs_folders(args: argparse.Namespace, add: Recorder) -> None:
    """The two readers in the same run, interleaved round by round (the order alternating), so that the machine's
    other load falls on both: images per wall second, and per CPU second of the reading processes."""
    loaders = {}
    for layout in LAYOUTS:
        dataset = training_set(args, layout, labels=False)  # the readers alone: no store row
        loaders[layout] = sharded_loaders(dataset, [], Batching(args.batch_size, args.workers, 0, collate_skipping),
                                          DistInfo())[0]
    totals = {layout: np.zeros(3) for layout in LAYOUTS}
    load_before = os.getloadavg()
    for round_ in range(COMPARE_ROUNDS):
        for layout in (list(LAYOUTS) if round_ % 2 == 0 else list(LAYOUTS)[::-1]):
            loaders[layout].sampler.set_epoch(round_)
            totals[layout] += timed_batches(loaders[layout], min(COMPARE_BATCHES, len(loaders[layout]) - 1))
    add('load average (1 min) before / after', [load_before[0], os.getloadavg()[0]],
        f'{load_before[0]:.2f} / {os.getloadavg()[0]:.2f}')
    for layout, (seen, seconds, cpu) in totals.items():
        add(f'{layout}: images', int(seen))
        add(f'{layout}: images/s', round(seen / seconds), f'{seen / seconds:,.0f}')
        add(f'{layout}: images per CPU second', round(seen / cpu), f'{seen / cpu:,.0f}')
    tar, folders = totals['tars'], totals['folders']
    add('tars / folders, images/s', round((tar[0] / tar[1]) / (folders[0] / folders[1]), 2))
    add('tars / folders, images per CPU second', round((tar[0] / tar[2]) / (folders[0] / folders[2]), 2))


def stage_checkpoint(args: argparse.Namespace, add: Recorder) -> None:
    for name in args.checkpoint_models:
        recipe = recipe_for(name)
        recipe = replace(recipe, img_size=recipe.img_size or model_data_config(name)['input_size'][-1])
        output = args.root / 'checkpoint' / name
        shutil.rmtree(output, ignore_errors=True)
        trainer = Trainer(RunOptions(output=output), DistInfo())
        model, objective = training_pieces(name, recipe, NUM_CLASSES, trainer.options.seed, trainer.info)
        optimization = recipe.optimization(trainer.options.global_batch(recipe.batch_size, trainer.info.world_size))
        fit = trainer.start(model, bare_model(model), optimization, objective, {'model': name}, 1)
        for param in model.parameters():
            param.grad = torch.zeros_like(param)
        fit.state.optimizer.step()  # AdamW's moments exist, as in any checkpoint after the first update
        _, seconds = timed(lambda: fit.save(1, is_best=False))
        size = (output / 'last.pth').stat().st_size
        params = sum(p.numel() for p in model.parameters())
        add(f'{name} ({params / 1e6:.0f}M parameters): last.pth size', size, f'{size / 1024 ** 3:.2f} GB')
        add(f'{name}: seconds to write', round(seconds, 1))
        shutil.rmtree(output)


RUNNERS: dict[str, Callable[[argparse.Namespace, Recorder], None]] = {
    'build': stage_build, 'listing': stage_listing, 'import': stage_import, 'store': stage_store,
    'dataset': stage_dataset, 'pass': stage_pass, 'val-listing': lambda a, f: stage_listing(a, f, 'val'),
    'first-step': stage_first_step, 'checkpoint': stage_checkpoint, 'tar-build': stage_tar_build,
    'tar-listing': stage_tar_listing, 'tar-pass': lambda a, f: stage_pass(a, f, 'tars'),
    'tar-vs-folders': stage_tar_vs_folders, 'tar-first-step': lambda a, f: stage_first_step(a, f, 'tars')}


def main(argv: list[str] | None = None, description: str | None = None) -> dict:
    args = parse_args(argv, description)
    if 'checkpoint' in args.stages:
        for name in args.checkpoint_models:  # before hours of other stages
            check_model_name(name)
    needs_trees = set(args.stages) - {'build', 'checkpoint', 'tar-build', 'tar-listing'}
    needs_tars = {stage for stage in args.stages if stage.startswith('tar-')} - {'tar-build'}
    if needs_tars and 'tar-build' not in args.stages and not (args.root / LAYOUTS['tars'] / 'val.tar').is_file():
        raise UsageError(f'{args.root} holds no rehearsal tars yet: run the tar-build stage first')
    if needs_trees and 'build' not in args.stages and read_marker(args.root / 'built.json') is None:
        raise UsageError(f'{args.root} holds no rehearsal trees yet: run the build stage first')
    if needs_trees and 'build' not in args.stages and not (read_meta(args.root / 'store') or {}).get('complete'):
        raise UsageError(f'{args.root / "store"} is not complete (a build interrupted): run the build stage again')
    measurements = MeasurementTable()
    logger.info(f'rehearsal at scale {args.scale} in {args.root} ({os.cpu_count()} cores, torch {torch.__version__})')

    def write_figures() -> None:  # after every stage: an interrupted rehearsal keeps the stages it measured
        if args.json and measurements.values:
            write_results(args.json, 'scale_rehearsal', 'rehearse_scale.py', argv, measurements.values)

    started = time.perf_counter()
    for stage in [stage for stage in STAGES if stage in args.stages]:
        RUNNERS[stage](args, functools.partial(measurements.add, stage))
        write_figures()
    measurements.add('all', 'seconds', round(time.perf_counter() - started, 1))
    logger.info(measurements.markdown())
    write_figures()
    return measurements.values

