"""Config preparation shared by tools/train_seg.py and tools/test_seg.py."""
from __future__ import annotations

import copy
import difflib
import os
import re
import zipfile
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from mmengine.config import Config
from mmengine.utils import import_modules_from_strings

from backbones.common.cli import EmbeddedData
from backbones.common.errors import AlreadyDone, CheckpointError, DataError, UsageError
from backbones.common.files import load_weights_only, ready_mark
from backbones.common.lifecycle import signals_held
from backbones.common.log import logger
from backbones.segmentation.cfg_options import merge_options
from backbones.segmentation.layouts import layout_of, layout_roots
from backbones.segmentation.mmengine_io import mmengine_checkpoint_globals, plain_values
from backbones.segmentation.runner import (
    FINISHED,
    finished_iterations,
    iteration_checkpoints,
    recorded_config,
    trained_data,
)
from backbones.segmentation.semantic.own_data import OWN_DATA_ROOT, is_own_data_config
from backbones.segmentation.tasks import (
    DenseTask,
    SmallDenseData,
    model_type,
    task_named,
    task_of,
    task_recognised_by,
    tasks,
)
from backbones.weights import TIMM_RELEASE, URL_SCHEMES, guess_family

ADE20K_ROOT = 'data/ade/ADEChallengeData2016'
COCO_ROOT = 'data/coco'
OWN_COCO_ROOT = 'data/own_coco'
NYU_ROOT = 'data/nyu'
# the data sets a config is written for, by its folder, which the embedded data stands in for when not on disk
KNOWN_ROOTS = {ADE20K_ROOT: 'ADE20K', COCO_ROOT: 'COCO', NYU_ROOT: 'NYU-v2', OWN_DATA_ROOT: 'a data set of your own',
               OWN_COCO_ROOT: 'a COCO-format set of your own'}
ADE20K_CROP = 512  # the configs' training crop side
LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')
_SIZE_KEYS = ('scale', 'crop_size', 'size', 'stride')
CONFIG_SUFFIXES = ('.py', '.json', '.yaml', '.yml')  # the files mmengine reads as configs


class FormattedOnceConfig(Config):
    """mmengine's Config, its text formatted once for each content it has.

    mmengine formats a config's text with yapf (0.2 s) each time it is asked for it: for the log, the dump, each
    visualizer backend and every checkpoint's meta, 9 times in a short run, half of a 2-iteration run's time."""

    @staticmethod
    def fromfile(filename: str | Path, **kwargs) -> FormattedOnceConfig:
        """mmengine's `Config.fromfile` (a staticmethod: it makes a plain Config), as this class: the config read
        is taken over through mmengine's own pickled state, so that it keeps everything mmengine keeps of it."""
        read = Config.fromfile(filename, **kwargs)
        once = FormattedOnceConfig.__new__(FormattedOnceConfig)
        once.__setstate__(read.__getstate__())
        return once

    @property
    def pretty_text(self) -> str:
        plain = self._laid_out(formatted=False)  # mmengine's layout before yapf: milliseconds
        if not self._format_python_code:
            return plain
        last = self.__dict__.get('_formatted')
        if last is None or last[0] != plain:
            last = plain, self._laid_out(formatted=True)
            object.__setattr__(self, '_formatted', last)  # Config's own __setattr__ sets config keys
        return last[1]

    def _laid_out(self, formatted: bool) -> str:
        view = copy.copy(self)  # its own setting, the same keys: this config's is left as it is for other callers
        object.__setattr__(view, '_format_python_code', formatted)
        with signals_held():  # mmengine turns anything raised while yapf formats into a SyntaxError
            return Config.pretty_text.fget(view)


# The suite's top-level packages before 0.2.0 (CHANGELOG.md's table of moved paths; but the embedded data's, which no
# config imports) and where they live now; their modules moved with them, but for those renamed. Configs and export
# folders saved before then name them in their custom_imports.
FORMER_PACKAGES = {'segmentation': 'backbones.segmentation', 'common': 'backbones.common',
                   'engine': 'classification.engine',
                   'token_labeling': 'classification.token_labeling', 'visualization': 'classification.pictures'}
RENAMED_MODULES = {'segmentation.notices': 'backbones.segmentation.silenced_warnings',
                   'segmentation.release': 'backbones.segmentation.released_segmentors',
                   'token_labeling.augment': 'classification.data.augment',
                   'token_labeling.batch_augment': 'classification.data.batch_augment',
                   'token_labeling.loss': 'classification.objectives.token_loss',
                   'token_labeling.pictures': 'classification.pictures.token_labels',
                   'token_labeling.released': 'classification.token_labeling.released_labels',
                   'token_labeling.targets': 'classification.objectives.token_targets',
                   'visualization.figures': 'backbones.common.drawing',
                   # semantic segmentation's modules, moved into its task's folder after 0.2.0
                   'segmentation.metrics': 'backbones.segmentation.semantic.metrics',
                   'segmentation.own_data': 'backbones.segmentation.semantic.own_data',
                   'segmentation.segmentor': 'backbones.segmentation.semantic.segmentor',
                   'backbones.segmentation.metrics': 'backbones.segmentation.semantic.metrics',
                   'backbones.segmentation.own_data': 'backbones.segmentation.semantic.own_data',
                   'backbones.segmentation.segmentor': 'backbones.segmentation.semantic.segmentor',
                   # what only classification uses, moved off the ground after 0.2.0
                   'common.memory': 'classification.engine.memory',
                   'common.path_list': 'classification.sources.path_list',
                   'common.statistics': 'classification.studies.statistics',
                   'common.timing': 'classification.studies.timing',
                   'backbones.common.memory': 'classification.engine.memory',
                   'backbones.common.path_list': 'classification.sources.path_list',
                   'backbones.common.statistics': 'classification.studies.statistics',
                   'backbones.common.timing': 'classification.studies.timing',
                   'backbones.common.image_tars': 'classification.sources.tars'}


def present_module(name: str) -> str:
    """A module a config imports, under its present path (the suite's modules before 0.2.0 moved; a renamed one's
    modules with it)."""
    parts = name.split('.')
    for end in range(len(parts), 0, -1):
        former, rest = '.'.join(parts[:end]), parts[end:]
        moved = RENAMED_MODULES.get(former) or (FORMER_PACKAGES.get(former) if end == 1 else None)
        if moved:
            return '.'.join([moved, *rest])
    return name


def import_custom_modules(path: str | Path, names: list[str], allow_failed: bool = False) -> list[str]:
    """A config's custom_imports imported under their present paths (returned); one that fails is a one-line error
    naming the config and the module as the config names it (and where it was looked for, where it moved), unless
    the config allows failed imports (mmengine's `allow_failed_imports`: then a warning)."""
    present = [present_module(name) for name in names]
    for name, module in zip(names, present):
        try:
            import_modules_from_strings(module)
        except Exception as e:  # an import raises anything its module raises
            said = name if module == name else f'{name} (looked for as {module}, where the suite\'s modules moved)'
            if allow_failed:
                logger.warning(f'warning: {path}: custom_imports: {said} does not import ({e}); left out')
                continue
            raise UsageError(f'{path}: custom_imports names {said}, which does not import ({type(e).__name__}: '
                             f'{e}); the suite\'s configs import backbones.segmentation (docs/layout.md lists its '
                             f'modules)') from e
    return present


def read_config(path: str | Path) -> Config:
    """A config file as mmengine reads it, its `custom_imports` under their present paths (a config saved before the
    suite's packages moved names `segmentation`), then imported."""
    try:
        cfg = FormattedOnceConfig.fromfile(str(path), import_custom_modules=False)
    except (SyntaxError, NameError) as e:  # the config's own code (or its bases')
        where = ''
        if isinstance(e, SyntaxError):  # mmengine parses the top file's text as '<unknown>'
            where = ('' if not e.filename or e.filename.startswith('<') else f'{e.filename}, ') + f'line {e.lineno}: '
        raise UsageError(f'{path}: not a readable config ({where}{type(e).__name__}: {e.msg if where else e})') from e
    except OSError as e:
        if e.filename and Path(e.filename).resolve() != Path(path).resolve():  # a base it names
            raise UsageError(f'{path}: its base {e.filename} cannot be read ({e.strerror or e})') from e
        if Path(path).suffix not in CONFIG_SUFFIXES:  # mmengine refuses other file types with an OSError
            raise UsageError(f'{path}: not a config file (mmengine reads {", ".join(CONFIG_SUFFIXES)})') from e
        raise UsageError(f'{path}: cannot be read ({e.strerror or e})') from e
    custom = cfg.get('custom_imports')
    if custom:
        names = custom['imports']
        custom['imports'] = import_custom_modules(path, [names] if isinstance(names, str) else list(names),
                                                  custom.get('allow_failed_imports', False))
    return cfg


def load_config(path: str, cfg_options: dict | None = None) -> Config:
    if not Path(path).is_file():
        raise UsageError(f'{path}: ' + ('a folder, not a config file' if Path(path).is_dir() else
                                        'config file not found'))
    cfg = read_config(path)
    merge_options(cfg, cfg_options)
    check_loader_sizes(cfg, path)
    check_model_type(cfg, path)
    return cfg


def check_model_type(cfg: Config, path: str) -> None:
    """The config builds a model mmseg or the suite registers (before any work: a run would fail on it after its
    data and backbone were prepared)."""
    from mmseg.registry import MODELS

    kind = model_type(cfg) if cfg.get('model') else None
    if not isinstance(kind, str) or MODELS.get(kind) is None:
        nearest = difflib.get_close_matches(str(kind), sorted(MODELS.module_dict), 1)
        raise UsageError(f'{path}: its model type {kind!r} is no model mmseg or the suite registers'
                         + (f' (the nearest: {nearest[0]!r})' if nearest else '')
                         + "; a module of your own that registers it goes in the config's custom_imports")


@dataclass(frozen=True)
class TrainedData:
    """The data a tool runs a trained checkpoint on: one folder for every loader (`data_root`; None: the config's
    own), the tool's embedded data (`embedded`: the checkpoint was trained on it), or none (`at_hand` False: its
    predictions need no data set, and the classes or categories the checkpoint records serve)."""

    data_root: str | None = None
    embedded: bool = False
    at_hand: bool = True
    embedded_root: str | None = None  # the embedded data's folder the checkpoint was trained on, where it is there


def trained_data_record(cfg: Config, embedded: bool) -> dict:
    """What a training run's checkpoints record of its data (their meta's TRAINED_DATA; the runner writes the
    config's): the training set's folder, whether the tool's embedded data stood in for the config's, the task, and
    the test pipeline its validations ran, whose sizes tests and predictions take."""
    root = cfg.train_dataloader.dataset.get('data_root') or ''
    return plain_values(dict(data_root=os.path.abspath(root), embedded=embedded, task=task_of(cfg).name,
                             test_pipeline=cfg.test_dataloader.dataset.pipeline,
                             **(embedded_data_facts(cfg) if embedded else {})))


def embedded_data_facts(cfg: Config) -> dict:
    """The embedded data a config reads (its test set's): the published layout it is written in (None: the
    suite's own) and its version (its READY mark)."""
    dataset = cfg.test_dataloader.dataset
    layout = layout_of(dataset)
    return dict(layout=layout.title if layout else None, data_version=ready_mark(dataset.get('data_root') or ''))


def check_same_embedded_data(cfg: Config, record: dict, checkpoint: str) -> None:
    """A checkpoint trained on the embedded data (`record`, what it records of it) is tested and predicts on that
    data as it was trained: in the same layout, of the same version; else its scores would be against other ground
    truth (a checkpoint from before this record is not checked)."""
    now = embedded_data_facts(cfg)
    if 'layout' in record and record['layout'] != now['layout']:
        raise DataError(f'{checkpoint} was trained on the embedded pages {layout_words(record["layout"])}; this '
                        f'config reads them {layout_words(now["layout"])}: give the config it was trained with')
    if record.get('data_version') and record['data_version'] != now['data_version']:
        trained, here = (' '.join(version.split()) for version in (record['data_version'], now['data_version']))
        raise DataError(f'{checkpoint} was trained on another version of the embedded data ({trained!r}; here: '
                        f'{here!r}): its scores would be against other ground truth; train it again')


def layout_words(layout: str | None) -> str:
    return f'in the {layout} layout' if layout else 'in the suite\'s own layout'


def checkpoint_record(checkpoint: str) -> dict | None:
    """What a checkpoint records of the data it was trained on (`trained_data_record`). One from before that record
    gives the same from the config its meta holds (read without running it), whether its folder was the embedded
    data's left open (`embedded` None: the tool's embedded data tells); None where it holds neither (mmseg's
    releases)."""
    record = trained_data(checkpoint)
    if record is not None:
        return record
    recorded = recorded_config(checkpoint)
    try:
        train, test = recorded['train_dataloader']['dataset'], recorded['test_dataloader']['dataset']
        return dict(data_root=os.path.abspath(train.get('data_root') or ''), embedded=None,
                    task=task_of(Config(recorded)).name, test_pipeline=test['pipeline'])
    except (KeyError, TypeError, AttributeError):
        return None


def choose_trained_data(cfg: Config, checkpoint: str, data_root: str | None = None, cfg_options: dict | None = None,
                        fallback: EmbeddedSegData | None = None, need_data: bool = True) -> TrainedData:
    """The data for a trained checkpoint: `data_root` (--data-root) if given, else the config's folders where they
    are on disk; else what the checkpoint records it was trained on: the embedded data for a checkpoint trained on
    it, the folder it was trained on where that is on disk, else none (an error where the tool `need_data`). A
    checkpoint that records nothing (mmseg's, a release, the suite's before this record) is taken as the config's folder
    decides: the embedded data stands in for a known data set's, an own-data config predicts without its data."""
    if data_root:
        return TrainedData(data_root)
    roots = data_roots(cfg, None, cfg_options)
    record = checkpoint_record(checkpoint)
    if record is not None and record['embedded'] is None:
        record['embedded'] = fallback is not None and Path(record['data_root']).resolve() == fallback.root.resolve()
    if all(Path(root).is_dir() for root in roots):
        if record and not record['embedded'] and record['data_root'] not in {os.path.abspath(r) for r in roots}:
            logger.warning(f'warning: {checkpoint} was trained on {record["data_root"]}; the data here is the '
                           f'config\'s, {", ".join(sorted(roots))}')
        return TrainedData()
    if record is None:
        if not need_data and own_data_absent(cfg, cfg_options):
            return TrainedData(at_hand=False)
        return TrainedData(embedded=missing_data(roots, fallback) is not None)
    if record['embedded']:
        if fallback is None:
            raise DataError(f'{checkpoint} was trained on the embedded data, which this caller does not give')
        # the folder it was trained on, where it is still there: the data is not written again elsewhere
        kept = record['data_root'] if Path(record['data_root']).is_dir() else None
        return TrainedData(embedded=True, embedded_root=kept)
    missing = ', '.join(sorted(root for root in roots if not Path(root).is_dir()))
    if Path(record['data_root']).is_dir():
        logger.info(f'data: {record["data_root"]}, which {checkpoint} was trained on (the config\'s {missing} is '
                    'not on disk)')
        return TrainedData(record['data_root'])
    if need_data:
        raise DataError(f'{checkpoint} was trained on {record["data_root"]}, which is not on disk, nor is the '
                        f'config\'s {missing}: --data-root names the data set\'s folder')
    return TrainedData(at_hand=False)


def load_trained_config(path: str, checkpoint: str, cfg_options: dict | None = None, data_root: str | None = None,
                        fallback: EmbeddedSegData | None = None, need_data: bool = True) -> tuple[Config, TrainedData]:
    """`load_config` for a trained checkpoint's config (test_seg, predict_seg, visualize, export), the checkpoint
    checked to be a model of the config's task first, and the data it runs on (`choose_trained_data`): where the
    embedded data stands in, the model takes the sizes it trained with there (`use_model`), under the command
    line's options. `resolve_trained_data` then applies the data."""
    cfg = load_config(path)
    check_segmentor_checkpoint(checkpoint, task_of(cfg), path)
    data = choose_trained_data(cfg, checkpoint, data_root, cfg_options, fallback, need_data)
    if data.embedded:
        fallback.use_model(cfg)
    if cfg_options:
        merge_options(cfg, cfg_options)
        check_loader_sizes(cfg, path)
        check_model_type(cfg, path)
    return cfg, data


def check_loader_sizes(cfg: Config, path: str) -> None:
    """Every data loader's batch size and workers are whole numbers that work (a batch of 0 ended in a division by
    zero when the schedule was sized to the data)."""
    for name in LOADERS:
        loader = cfg.get(name) or {}
        for key, least in (('batch_size', 1), ('num_workers', 0)):
            value = loader.get(key, least)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise UsageError(f'{path}: {name}.{key} = {value!r}; it must be a whole number of at least {least}')


class EmbeddedSegData(EmbeddedData, Protocol):
    """What a config runs on when its ADE20K is not on disk, which a tool gives the trainer and the tester (the
    segmentation tools: their embedded set): besides its options, the config pointed at it (written on first use),
    the schedule a run takes there, and the model's sizes there (which tests and predictions take too). Config
    edits only: a backbone pretrained for that data is the tool's to make (tools/train_seg.py's first stage), and
    reaches the trainer as a checkpoint."""

    root: Path  # where the data lives: a checkpoint trained on a data set there was trained on it

    def use_data(self, cfg: Config) -> None: ...

    def use_schedule(self, cfg: Config) -> None: ...

    def use_model(self, cfg: Config) -> None: ...

    def moved_to(self, root: Path) -> EmbeddedSegData:
        """The same data kept in `root` (where a checkpoint recorded it was trained on it)."""
        ...


def datasets(cfg: Config) -> Iterator[dict]:
    for loader in LOADERS:
        if cfg.get(loader):
            yield cfg[loader]['dataset']


def set_data_root(cfg: Config, root: str) -> None:
    for dataset in datasets(cfg):
        dataset['data_root'] = root


def scale_sizes(node, factor: float) -> None:
    """Multiply every (w, h) size under `node` (pipelines, preprocessor, slide window) by `factor`, in place."""
    if isinstance(node, list):
        for item in node:
            scale_sizes(item, factor)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in _SIZE_KEYS and isinstance(value, (tuple, list)) and all(isinstance(v, int) for v in value):
                node[key] = tuple(max(1, round(v * factor)) for v in value)
            else:
                scale_sizes(value, factor)


def describe_schedule(cfg: Config) -> str:
    """The schedule a run takes, in one line."""
    first, decay = cfg.param_scheduler[0], cfg.param_scheduler[-1]
    warmup = first.get('end', 0) if first['type'] == 'LinearLR' else 0
    accumulate = cfg.optim_wrapper.get('accumulative_counts', 1)
    batches = (f', {accumulate} accumulated per update' if accumulate > 1 else '')
    return (f'{cfg.train_cfg["max_iters"]} iterations of {cfg.train_dataloader["batch_size"]} images{batches}, '
            f'lr {cfg.optim_wrapper.optimizer["lr"]:.3g} ({warmup} warm-up, then to '
            f'{decay.get("eta_min", 0):.3g}), validation every {cfg.train_cfg["val_interval"]}, checkpoint every '
            f'{cfg.default_hooks["checkpoint"]["interval"]}')


def accumulate_gradients(cfg: Config, steps: int) -> None:
    """One optimizer update every `steps` iterations (mmengine's `accumulative_counts`: each loss divided by
    `steps`, the gradients summed). mmengine counts iterations, not updates, so every count of the schedule (its
    length, warm-up and decay, validation and checkpoint intervals) is multiplied by `steps`: the run makes the
    config's number of updates, each of `steps` times the batch, along the same lr curve. The lr is the config's,
    which the papers set for their global batch (ADE20K: 16 images per update)."""
    if steps == 1:
        return
    cfg.optim_wrapper['accumulative_counts'] = steps
    cfg.train_cfg['max_iters'] *= steps
    cfg.train_cfg['val_interval'] *= steps
    for scheduler in cfg.param_scheduler:
        for key in ('begin', 'end'):
            if key in scheduler:
                scheduler[key] *= steps
        if 'milestones' in scheduler:  # a step schedule's (ViTDet's)
            scheduler['milestones'] = [m * steps for m in scheduler['milestones']]
    cfg.default_hooks['checkpoint']['interval'] *= steps


def drop_one_step_warmup(cfg: Config) -> None:
    """A warm-up of one iteration (a short run's scaled one) is dropped: mmengine's LinearLR steps begin .. end - 1,
    so in one step it never leaves its start factor, and the chained decay after it would run the whole schedule at
    1e-6 of the lr."""
    phases = cfg.param_scheduler
    if len(phases) > 1 and phases[0]['type'] == 'LinearLR' and phases[0].get('end', 0) - phases[0].get('begin', 0) == 1:
        cfg.param_scheduler = phases[1:]


def drop_tta_flips(cfg: Config) -> None:
    """Test at every scale of the multi-scale test without the mirror images."""
    cfg.tta_model['flip'] = False


def flipping_tta_pipeline(pipeline: list) -> list:
    """mmseg's way of a multi-scale + flip test, for comparison: a copy of a test-time pipeline that flips every
    scale itself (each scale resized twice, ten views for SegTTAModel)."""
    pipeline = copy.deepcopy(pipeline)
    tta = next(step for step in pipeline if step['type'] == 'TestTimeAug')
    tta['transforms'].insert(1, [dict(type='RandomFlip', prob=0.0, direction='horizontal'),
                                 dict(type='RandomFlip', prob=1.0, direction='horizontal')])
    return pipeline


def tta_flips(cfg: Config) -> bool:
    """Whether the multi-scale test adds each scale's mirror image."""
    return bool(cfg.tta_model.get('flip', False))


def tta_scales(pipeline: list) -> list[dict]:
    """The Resize steps of a test-time pipeline's TestTimeAug, one a scale."""
    tta = next((step for step in pipeline if step['type'] == 'TestTimeAug'), None)
    return [step for step in tta['transforms'][0] if step['type'] == 'Resize'] if tta else []


def test_mode(cfg: Config, multi_scale: bool) -> str:
    """A test's mode in words, as its line names it: 'single-scale', 'multi-scale + flip', 'single-scale + flip'
    (a test-time augmentation of one scale, the depth papers' flip)."""
    if not multi_scale:
        return 'single-scale'
    scales = 'multi-scale' if len(tta_scales(cfg.tta_pipeline)) > 1 else 'single-scale'
    return scales + (' + flip' if tta_flips(cfg) else '')


def check_tta_settings(cfg: Config) -> None:
    """--ms (--tta) takes the config's `tta_pipeline` and `tta_model`: one line if it lacks either."""
    missing = [key for key in ('tta_pipeline', 'tta_model') if not cfg.get(key)]
    if missing:
        raise UsageError(f'--ms (--tta) tests with the config\'s {" and ".join(missing)}, which it does not set '
                         f'(each task\'s test-time settings: see seg_configs/_base_/datasets)')


def use_small_test_time(cfg: Config, data: SmallDenseData) -> None:
    """A small data set's multi-scale test: `data.test_ratios` of the single-scale test's size (already set), and
    no mirror images unless `data.mirrored`."""
    if cfg.get('tta_model') and not data.mirrored:
        drop_tta_flips(cfg)
    if cfg.get('tta_pipeline'):
        size = next(step['scale'] for step in cfg.test_dataloader.dataset.pipeline if step['type'] == 'Resize')
        tta = next(step for step in cfg.tta_pipeline if step['type'] == 'TestTimeAug')
        tta['transforms'][0] = [dict(type='Resize', scale=(round(size[0] * r), round(size[1] * r)), keep_ratio=True)
                                for r in data.test_ratios]


def data_roots(cfg: Config, data_root: str | None = None, cfg_options: dict | None = None) -> set[str]:
    """The data sets' folders: `data_root` (--data-root) for all, else each loader's as `cfg_options` (the command
    line's, not merged yet: `LOADER.dataset.data_root`) or the config give it."""
    if data_root:
        return {data_root}
    options = cfg_options or {}
    return {options.get(f'{loader}.dataset.data_root', cfg[loader]['dataset']['data_root'])
            for loader in LOADERS if cfg.get(loader)}


def own_data_absent(cfg: Config, cfg_options: dict | None = None) -> bool:
    """An own-data config whose data set is not on disk: what a checkpoint trained on it predicts for new images
    needs only the classes it records, never the embedded data's."""
    return is_own_data_config(cfg) and not any(Path(root).is_dir() for root in data_roots(cfg, None, cfg_options))


def known_roots() -> dict[str, str]:
    """The data sets a config is written for, by its folder (KNOWN_ROOTS and the published layouts'), which the
    embedded data stands in for when not on disk."""
    return {**KNOWN_ROOTS, **layout_roots()}


def missing_data(roots: set[str], fallback: EmbeddedSegData | None) -> str | None:
    """The config's own folder that is not on disk (one of `known_roots`: ADE20K's, COCO's, NYU-v2's, the
    published layouts', the own-data configs'), where `fallback`'s data stands in for it; None when every folder is
    there. Any other missing folder is an error."""
    missing = sorted(root for root in roots if not Path(root).is_dir())
    if not missing:
        return None
    if len(missing) > 1 or missing[0] not in known_roots() or fallback is None:
        raise DataError(f'data root not found: {", ".join(missing)} (--data-root names the data set\'s folder)')
    return missing[0]


def resolve_data(cfg: Config, data_root: str | None = None, fallback: EmbeddedSegData | None = None,
                 checkpoint: str | None = None) -> bool:
    """Apply `data_root`; an own-data config takes the data's folders and classes (`own_data`), a detector its class
    count (the training set's categories; with a trained `checkpoint`, the ones it records, which the test set must
    declare). When the config's own folder (one of `known_roots`) is not on disk, use `fallback`'s data. True if it
    did."""
    if data_root:
        set_data_root(cfg, data_root)
    roots = data_roots(cfg)
    missing = missing_data(roots, fallback)
    if missing is not None:
        logger.info(f'{known_roots()[missing]} not found at {missing} (docs/segmentation.md and '
                    'docs/instances_and_depth.md say how to use it; --data-root names another folder): the embedded '
                    'data')
        fallback.use_data(cfg)
    task_of(cfg).resolve_classes(cfg, roots, checkpoint, embedded=missing is not None)
    return missing is not None


def resolve_trained_data(cfg: Config, checkpoint: str, data: TrainedData, fallback: EmbeddedSegData | None = None,
                         cfg_options: dict | None = None) -> None:
    """`resolve_data` for a trained checkpoint on the data `choose_trained_data` chose. The data's classes must be
    the ones the checkpoint was trained on, by name (a detector's categories, by id and name), or the model's outputs
    would be scored, named and coloured as others; with no data at hand, the checkpoint's own serve. The test
    pipeline is the one its validations ran (`use_trained_pipeline`)."""
    task = task_of(cfg)
    if not data.at_hand:
        task.use_trained_classes(cfg, checkpoint)
    else:
        if data.embedded and data.embedded_root:
            fallback = fallback.moved_to(Path(data.embedded_root))
        resolve_data(cfg, data.data_root, fallback if data.embedded else None, checkpoint)
        if data.embedded:
            check_same_embedded_data(cfg, checkpoint_record(checkpoint) or {}, checkpoint)
        task.check_trained_classes(cfg, checkpoint)
    use_trained_pipeline(cfg, checkpoint, cfg_options)


def pipeline_sizes(pipeline: list) -> str:
    """A pipeline's sizes in words: `Resize (640, 480)` for each step that sets one."""
    return ', '.join(f'{step["type"]} {tuple(step[key])}' for step in pipeline for key in _SIZE_KEYS
                     if isinstance(step.get(key), (list, tuple))) or 'no sizes'


def use_trained_pipeline(cfg: Config, checkpoint: str, cfg_options: dict | None = None) -> None:
    """The test pipeline the checkpoint's validations ran, where it records one that differs from the config's
    (one line says so); the command line's options for the test loader win."""
    recorded = (checkpoint_record(checkpoint) or {}).get('test_pipeline')
    if recorded is None or any(key.startswith('test_dataloader') for key in cfg_options or {}):
        return
    own = plain_values(cfg.test_dataloader.dataset.pipeline)
    if own != recorded:
        logger.warning(f'warning: {checkpoint} was validated with another test pipeline than the config gives '
                       f'({pipeline_sizes(recorded)}, the config {pipeline_sizes(own)}): its own is used')
        cfg.test_dataloader.dataset.pipeline = recorded


def weight_names(checkpoint: str) -> list[str]:
    """The names in a checkpoint and in each dict right under it (its state dict's weights, wherever it keeps them),
    `module.` left out; read memory-mapped where the file allows (the tensors stay on disk)."""
    content = load_weights_only(checkpoint, 'checkpoint', mmengine_checkpoint_globals(),
                                mmap=zipfile.is_zipfile(checkpoint))
    if not isinstance(content, dict):
        return []
    return [re.sub(r'^module\.', '', key) for part in (content, *content.values()) if isinstance(part, dict)
            for key in part if isinstance(key, str)]


def checkpoint_task(checkpoint: str, names: list[str]) -> DenseTask | None:
    """The task a checkpoint's model was trained for: as it records it, else as its heads' weights (`names`) show;
    None if neither says."""
    return task_named((checkpoint_record(checkpoint) or {}).get('task')) or task_recognised_by(names)


def check_segmentor_checkpoint(checkpoint: str, task: DenseTask | None = None, config: str | None = None) -> None:
    """A checkpoint a dense tool is given: there (checked before any work, such as writing the embedded data), a
    dense model's (an image classifier's weights would fail on every key, after the tool had asked for the data set
    it was trained on), and of the config's `task` (a detector given to a depth config was refused as a class
    mismatch)."""
    if not Path(checkpoint).is_file():
        found = 'a folder, not a checkpoint file' if Path(checkpoint).is_dir() else 'checkpoint file not found'
        raise CheckpointError(f'{checkpoint}: {found}')
    names = weight_names(checkpoint)
    family = guess_family(names)
    heads = ('decode_head.', *(task.head_weights for task in tasks()))
    if family is not None and not any(name.startswith(heads) for name in names):
        raise CheckpointError(f'{checkpoint} holds an image classifier ({family} weights, no decode head), not a '
                              f'segmentor: tools/predict_cls.py and tools/eval_cls.py take it; a segmentor is trained '
                              f'from it by tools/train_seg.py CONFIG --cfg-options model.backbone.pretrained='
                              f'{checkpoint}')
    if task is not None:
        check_checkpoint_task(checkpoint, names, task, config)


def check_checkpoint_task(checkpoint: str, names: list[str], task: DenseTask, config: str | None) -> None:
    """The checkpoint (its weights' `names`) is a model of the config's `task`, where it says which task it is of."""
    trained = checkpoint_task(checkpoint, names)
    if trained is not None and trained is not task:
        raise CheckpointError(f'{checkpoint} holds a {trained.model_kind} ({trained.title}), and {config} is '
                              f'a {task.title} config: give the config it was trained with')


def check_resumed_run(work_dir: str, task: DenseTask, config: str, max_iters: int) -> None:
    """The run a work dir holds is of the config's `task`, as its newest readable checkpoint says (the one a resume
    continues from: `runner.SuiteRunner` falls back past those that do not read, and leaves their naming to it), and
    has something left to do: one that finished its `max_iters` (trained and validated) is AlreadyDone."""
    for candidate in iteration_checkpoints(work_dir):
        try:
            names = weight_names(str(candidate))
        except CheckpointError:
            continue
        check_checkpoint_task(str(candidate), names, task, config)
        break
    done = finished_iterations(work_dir)
    if done and done >= max_iters:
        raise AlreadyDone(f'{work_dir} holds a finished run ({FINISHED}: {done} of its {max_iters} iterations, '
                          f'validated): a new run (a longer schedule, other settings) needs another --work-dir')


def check_pretrained(cfg: Config) -> None:
    """The backbone's ImageNet file is there (a URL or `timm` is downloaded when the model is built)."""
    pretrained = cfg.model.backbone.get('pretrained')
    if pretrained and pretrained != TIMM_RELEASE and urlparse(pretrained).scheme not in URL_SCHEMES \
            and not Path(pretrained).is_file():
        raise CheckpointError(
            f'backbone checkpoint {pretrained} not found: download the ImageNet weights (README, "Segmentation on '
            'ADE20K"), or set model.backbone.pretrained to yours, to a URL, to timm (the release file the model\'s '
            'timm config names, downloaded once), or to None to train from scratch')


def shorten_schedule(cfg: Config, iters: int, given: Collection[str] = (),
                     validate_at_checkpoints: bool = False) -> None:
    """Run the schedule in `iters` iterations: warm-up, decay (a step schedule's milestones too) and the checkpoint
    interval shrink with it, and validation (the slow part of a short run) happens once, at the end, or at every
    checkpoint. The intervals the command line's --cfg-options name (`given`, their keys) keep the values it
    gave."""
    factor = iters / cfg.train_cfg['max_iters']
    cfg.train_cfg['max_iters'] = iters
    for scheduler in cfg.param_scheduler:
        for key in ('begin', 'end'):
            if key in scheduler:
                scheduler[key] = min(iters, max(1 if scheduler[key] else 0, round(scheduler[key] * factor)))
        if 'milestones' in scheduler:  # a step schedule's (ViTDet's) lr drops, at the same fractions of the run
            scheduler['milestones'] = [min(iters, max(1, round(m * factor))) for m in scheduler['milestones']]
    # a phase left with no iteration (the decay of a 1-iteration run) is dropped: mmengine refuses begin == end
    cfg.param_scheduler = [s for s in cfg.param_scheduler if s.get('end', iters) > s.get('begin', 0)]
    checkpoint, log = cfg.default_hooks['checkpoint'], cfg.default_hooks['logger']
    if 'default_hooks.checkpoint.interval' not in given:
        checkpoint['interval'] = max(1, round(checkpoint['interval'] * factor))
    if 'train_cfg.val_interval' not in given:
        cfg.train_cfg['val_interval'] = checkpoint['interval'] if validate_at_checkpoints else iters
    if 'default_hooks.logger.interval' not in given:
        log['interval'] = min(log['interval'], checkpoint['interval'])
