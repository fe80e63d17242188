"""The suite's mmengine Runner: a checkpoint must fit the model, and a run resumes from its newest readable one.

Any missing, unexpected or mis-shaped key of a loaded checkpoint is a CheckpointError naming them (mmengine loads
non-strictly). Resuming falls back past unreadable checkpoints to the newest readable `iter_*.pth`, takes only its
own work dir's files (`last_checkpoint` of a copied work dir names the original's) and logs the one it takes. The
suite's log lines go to the run's log file; loader processes leave SIGTERM and SIGUSR1 to the training process."""
from __future__ import annotations

import ast
import json
import logging
import re
import shutil
import zipfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import torch.nn as nn
from mmengine.registry import DATASETS
from mmengine.runner import BaseLoop, Runner
from mmengine.runner.checkpoint import (
    _load_checkpoint,
    _load_checkpoint_with_prefix,
    find_latest_checkpoint,
    load_checkpoint,
)
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.utils import _pair
from torch.utils.data import DataLoader

from backbones.common.errors import CheckpointError, CheckpointReadError, TrackerError, UsageError
from backbones.common.files import FolderAdditions, load_weights_only, write_json_atomic
from backbones.common.lifecycle import ignore_stop_signals, resumable_on_ctrl_c
from backbones.common.log import logger
from backbones.common.trackers import tracker_errors
from backbones.dense.backbone import TokenBackbone
from backbones.dense.mmengine_io import mmengine_checkpoint_globals, plain_values
from backbones.dense.restart import PlacedInfiniteSampler, SeededSamples
from backbones.dense.silenced_warnings import HarmlessLogLines
from backbones.weights import describe_mismatch, key_mismatch
from backbones.window_attention import REL_POS_KEYS

T = TypeVar('T')

FINISHED = 'finished.json'  # a work dir's mark of a run trained to its last iteration and validated: its count


def finished_iterations(work_dir: str | Path) -> int:
    """The iterations of the run the work dir holds where it finished (its FINISHED mark), else 0."""
    try:
        return int(json.loads((Path(work_dir) / FINISHED).read_text())['iterations'])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def iteration_checkpoints(work_dir: str | Path) -> list[Path]:
    """The run's `iter_N.pth` files, newest first."""
    found = [(int(m.group(1)), p) for p in Path(work_dir).glob('iter_*.pth')
             if (m := re.fullmatch(r'iter_(\d+)\.pth', p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def checkpoint_state(filename: str, prefix: str | None = None) -> dict:
    """A checkpoint's weights as mmengine reads them (`prefix`: only the keys under it, without it), no `module.`."""
    state = _load_checkpoint_with_prefix(prefix, filename) if prefix else _load_checkpoint(filename,
                                                                                           map_location='cpu')
    state = state.get('state_dict', state) if isinstance(state, dict) else {}
    return {re.sub(r'^module\.', '', k): v for k, v in state.items()}


# The key of what a run trained on in its checkpoints' meta and in its config (`config.trained_data_record`)
TRAINED_DATA = 'trained_data'


def pooled_batch_norms(model: nn.Module) -> list[str]:
    """The BatchNorm layers that normalise a map pooled to one pixel (pyramid pooling, DeepLab's image pool)."""
    found = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Sequential):
            continue
        children = list(module.named_children())
        for (_, pool), (after, layer) in zip(children, children[1:]):
            if isinstance(pool, nn.AdaptiveAvgPool2d) and _pair(pool.output_size) == (1, 1):
                found += [f'{name}.{after}.{inner}'.rstrip('.') for inner, norm in layer.named_modules()
                          if isinstance(norm, _BatchNorm)]
    return found


def check_batch_trains(model: nn.Module, batch_size: int, processes: int, option: str) -> None:
    """A UsageError naming `option` where a training batch of one image meets a BatchNorm of a pooled map, which cannot
    normalise one value per channel (torch fails in the first iteration); SyncBN over several processes trains."""
    if batch_size > 1:
        return
    unsynced = [name for name in pooled_batch_norms(model)
                if processes == 1 or not isinstance(model.get_submodule(name), nn.SyncBatchNorm)]
    if unsynced:
        raise UsageError(f'{option} 1: {unsynced[0]} ({len(unsynced)} such layer(s)) is a BatchNorm of a map pooled '
                         f'to one pixel: with one image a batch it gets one value per channel, which it cannot '
                         f'normalise; train with 2 or more images a batch (or several processes with SyncBN)')


def check_training_batch(cfg, processes: int) -> None:
    """`check_batch_trains` for a config's training batch, on its heads built alone, before any work."""
    from mmseg.registry import MODELS
    heads = nn.ModuleDict({key: nn.ModuleList(map(MODELS.build, head)) if isinstance(head, list) else MODELS.build(head)
                           for key in ('decode_head', 'auxiliary_head') if (head := cfg.model.get(key))})
    check_batch_trains(heads, cfg.train_dataloader.batch_size, processes, 'train_dataloader.batch_size')


def checkpoint_meta(filename: str) -> dict:
    """The `meta` mmengine writes into its checkpoints (config, `dataset_meta`, seed), or {}; read memory-mapped."""
    checkpoint = load_weights_only(filename, 'checkpoint', mmengine_checkpoint_globals(),
                                   mmap=zipfile.is_zipfile(filename))
    meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else None
    return meta if isinstance(meta, dict) else {}


def trained_data(filename: str) -> dict | None:
    """What a checkpoint records of its training data (`trained_data_record`), or None."""
    record = checkpoint_meta(filename).get(TRAINED_DATA)
    return record if isinstance(record, dict) else None


def recorded_config(filename: str) -> dict:
    """The config a checkpoint's run trained with, read from its meta's text without running it ({} without one)."""
    text = checkpoint_meta(filename).get('cfg')
    try:
        body = ast.parse(text).body if isinstance(text, str) else []
    except SyntaxError:
        return {}
    found = {}
    for node in body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = literal(node.value)
            except ValueError:
                continue
    return found


def literal(node: ast.expr) -> object:
    """A config expression's value: literals, lists, tuples, dicts and `dict(key=...)` calls; else a ValueError."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == 'dict' and not node.args \
            and all(keyword.arg for keyword in node.keywords):
        return {keyword.arg: literal(keyword.value) for keyword in node.keywords}
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {literal(key): literal(value) for key, value in zip(node.keys, node.values)}
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [literal(item) for item in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    return ast.literal_eval(node)


def misfit(state: dict, own: dict) -> str:
    """The missing, unexpected and mis-shaped keys of `state` against a module's `own` state dict, in words ('' when
    it fits; position tables and relative-position tables are resampled on loading, so their shape may differ)."""
    return describe_mismatch(key_mismatch(state, own, resampled=('pos_embed', *REL_POS_KEYS)))


def load_weights(model: nn.Module, filename: str) -> None:
    """Every weight of a checkpoint into `model`, nothing else, or a CheckpointError naming what does not fit."""
    problem = misfit(checkpoint_state(filename), model.state_dict())
    if problem:
        raise CheckpointError(f'{filename} does not fit the model of this config: {problem}')
    load_checkpoint(model, filename, map_location='cpu', strict=True)


def pretrained_inits(module: nn.Module) -> list:
    """The `Pretrained` entries of a module's init_cfg (a dict or a list of them)."""
    init = getattr(module, 'init_cfg', None)
    inits = init if isinstance(init, list) else [init] if init else []
    return [entry for entry in inits if isinstance(entry, dict) and entry.get('type') == 'Pretrained']


def start_worker(worker_id: int, init: Callable[[int], None] | None) -> None:
    """A loader worker's start: the stop signals left to the training process, then the loader's own `init`."""
    ignore_stop_signals(worker_id)
    if init is not None:
        init(worker_id)


def places_samples(dataloader: dict) -> bool:
    """Whether a loader's config samples with `PlacedInfiniteSampler`."""
    sampler = dataloader.get('sampler')
    kind = sampler.get('type') if isinstance(sampler, dict) else None
    return kind in (PlacedInfiniteSampler, PlacedInfiniteSampler.__name__)


def built_dataset(dataset: Any) -> Any:
    """A loader config's dataset built and fully initialised (as mmengine's Runner builds it), or the one given."""
    if not isinstance(dataset, dict):
        return dataset
    dataset = DATASETS.build(dataset)
    if hasattr(dataset, 'full_init'):
        dataset.full_init()
    return dataset


# mmengine's backends of the experiment trackers (`train.use_trackers` adds them): the flag that asks for each, and
# what it could not do
TRACKER_BACKENDS = {
    'WandbVisBackend': ('--log-wandb', 'wandb could not start its run (wandb login, or WANDB_MODE=offline)'),
    'MLflowVisBackend': ('--log-mlflow', 'MLflow could not start its run (MLFLOW_TRACKING_URI)'),
}


class SuiteRunner(Runner):
    """mmengine's Runner with strict checkpoint loading, a fallback to the newest readable one, a quieter log."""

    def __init__(self, model, work_dir: str, *args, **kwargs) -> None:
        additions = FolderAdditions(work_dir)
        try:
            super().__init__(model, work_dir, *args, **kwargs)
        except TrackerError:
            additions.remove()
            raise
        self.logger.addFilter(HarmlessLogLines())

    def build_visualizer(self, visualizer=None):
        """mmengine's visualizer, its trackers' runs started now, a failure one line naming its flag."""
        built = super().build_visualizer(visualizer)
        for name, (flag, what) in TRACKER_BACKENDS.items():
            backend = built.get_backend(name)  # None where the run has none, and on the processes but the main one
            if backend is not None:
                with tracker_errors(flag, what):
                    backend.experiment  # its first use starts its run
        return built

    def train(self):
        # mmengine's find_latest_checkpoint would print 'Did not find last_checkpoint' before the first one
        last = Path(self.work_dir) / 'last_checkpoint'
        with resumable_on_ctrl_c(lambda: Path(last.read_text().strip()) if last.is_file() else None):
            model = self._running(super().train)
        if self.rank == 0:  # its last validation done too: a --resume has nothing left to do
            write_json_atomic(Path(self.work_dir) / FINISHED, {'iterations': self.iter})
        return model

    def test(self):
        return self._running(super().test)

    def _running(self, action: Callable[[], T]) -> T:
        """`action()`, the suite's log lines also in mmengine's log file; the loader workers ended after it."""
        files = [handler for handler in self.logger.handlers if isinstance(handler, logging.FileHandler)]
        for handler in files:
            logger.addHandler(handler)
        try:
            return action()
        finally:
            for handler in files:
                logger.removeHandler(handler)
            self.end_loader_workers()

    def end_loader_workers(self) -> None:
        """End the loops' loader workers now: at exit they would be sent SIGTERM, which they ignore, and waited for."""
        for loop in (self._train_loop, self._val_loop, self._test_loop):
            if not isinstance(loop, BaseLoop):  # a loop not built (its config)
                continue
            kept = getattr(loop.dataloader, '_iterator', None)  # a persistent loader's iterator
            read = getattr(getattr(loop, 'dataloader_iterator', None), '_iterator', None)  # the iteration loop's
            for iterator in (kept, read):
                if hasattr(iterator, '_shutdown_workers'):  # one with worker processes
                    iterator._shutdown_workers()

    @staticmethod
    def build_dataloader(dataloader: DataLoader | dict, seed: int | None = None,
                         diff_rank_seed: bool = False) -> DataLoader:
        """mmengine's data loader, its worker processes leaving SIGTERM and SIGUSR1 to the training process; under a
        `PlacedInfiniteSampler` each sample is read with the streams seeded from (`seed`, pass, index)."""
        if isinstance(dataloader, dict) and places_samples(dataloader):
            dataloader = {**dataloader, 'dataset': SeededSamples(built_dataset(dataloader['dataset']), seed)}
        loader = Runner.build_dataloader(dataloader, seed=seed, diff_rank_seed=diff_rank_seed)
        if isinstance(dataloader, dict) and loader.num_workers:  # built here, not handed over built
            loader.worker_init_fn = partial(start_worker, init=loader.worker_init_fn)
        return loader

    def save_checkpoint(self, *args, meta: dict | None = None, **kwargs) -> None:
        """mmengine's checkpoint, its meta also recording what the run trained on (the config's TRAINED_DATA)."""
        record = self.cfg.get(TRAINED_DATA)
        if record is not None:
            meta = {**(meta or {}), TRAINED_DATA: plain_values(record)}
        super().save_checkpoint(*args, meta=meta, **kwargs)

    def load_checkpoint(self, filename: str, map_location='cpu', strict: bool = False,
                        revise_keys: list = [(r'^module.', '')]):  # mmengine's signature
        try:
            return super().load_checkpoint(filename, map_location=map_location, strict=True,
                                           revise_keys=revise_keys)
        except RuntimeError as e:  # mmengine's strict load: some key is missing, unexpected or mis-shaped
            mismatch = '' if isinstance(e, CheckpointError) else self.mismatch(filename)
            if not mismatch:  # every key fits: the load failed for another reason, which its own error gives
                raise
            raise CheckpointError(f'{filename} does not fit the model of this config (it would leave weights '
                                  f'unloaded): {mismatch}') from e

    def mismatch(self, filename: str) -> str:
        """The missing, unexpected and mis-shaped keys of a checkpoint against this runner's model."""
        model = self.model.module if hasattr(self.model, 'module') else self.model
        return misfit(checkpoint_state(filename), model.state_dict())

    def _init_model_weights(self) -> None:
        """mmengine's weight initialisation, after checking that every `Pretrained` init_cfg (loaded non-strictly by
        mmengine) holds every weight of its module and nothing else; the backbone loads its own, strictly."""
        model = self.model.module if hasattr(self.model, 'module') else self.model
        for name, module in model.named_modules():
            if isinstance(module, TokenBackbone):
                continue
            for init in pretrained_inits(module):
                state = checkpoint_state(init['checkpoint'], init.get('prefix'))
                problem = misfit(state, module.state_dict())
                if problem:
                    raise CheckpointError(f'init_cfg of {name or "the model"}: {init["checkpoint"]} does not fit it '
                                          f'(it would leave weights at random): {problem}')
        super()._init_model_weights()

    def load_or_resume(self) -> None:
        if self._resume and self._load_from is None:  # mmengine would take last_checkpoint's path as it is
            latest = find_latest_checkpoint(self.work_dir)
            if latest is not None:
                self._load_from = self.own_checkpoint(latest)
        return super().load_or_resume()

    def check_same_classes(self, filename: str) -> None:
        """A run resumes on the classes it started with (a detector's categories, by id and name): on renamed or
        other ones it would continue, and record them, without a word (mmengine warns deep in its log only)."""
        trained = checkpoint_meta(filename).get('dataset_meta') or {}
        current = getattr(self.train_dataloader.dataset, 'metainfo', None) or {}
        for key in ('classes', 'cat_ids'):
            before, now = trained.get(key), current.get(key)
            if before is not None and now is not None and list(before) != list(now):
                changed = [f'{a} -> {b}' for a, b in zip(before, now) if a != b][:5] or \
                    [f'{len(before)} -> {len(now)} entries']
                shutil.rmtree(self.log_dir, ignore_errors=True)  # the refused attempt's own log folder
                raise CheckpointError(f'{filename} was trained on other {key.replace("_", " ")} than the training data '
                                      f'now declares ({", ".join(map(str, changed))}): a resumed run continues on '
                                      f'the data it started on; give that data, or start a new run from this '
                                      f'checkpoint (--cfg-options load_from={filename})')

    def own_checkpoint(self, named: str) -> str:
        """This work dir's checkpoint `last_checkpoint` (`named`) means: it, its name here, or the newest iter_*.pth."""
        work = Path(self.work_dir).resolve()
        if Path(named).resolve().parent == work:
            return named
        own = work / Path(named).name
        chosen = own if own.is_file() else next(iter(iteration_checkpoints(work)), None)
        if chosen is None:
            raise CheckpointError(f'{work / "last_checkpoint"} names {named}, outside this work dir, which holds no '
                                  f'checkpoint of its own: resume the run where it is, or start a new one')
        logger.warning(f'warning: {work / "last_checkpoint"} names {named}, outside this work dir (a copied or moved '
                       f'run); resuming from this work dir\'s own {chosen}')
        return str(chosen)

    def resume(self, filename: str, *args, **kwargs) -> None:
        try:
            self.check_same_classes(filename)
            super().resume(filename, *args, **kwargs)
            logger.info(f'resumed from {filename}')
            return None
        except CheckpointReadError as error:
            older = [p for p in iteration_checkpoints(self.work_dir) if p.resolve() != Path(filename).resolve()]
            for candidate in older:
                try:
                    super().resume(str(candidate), *args, **kwargs)
                except CheckpointReadError:
                    continue
                logger.warning(f'warning: {filename} cannot be read ({error}); resumed from {candidate} instead')
                return None
            raise
