"""A dense config file read as mmengine reads it (its former module paths rewritten, its text formatted once),
checked for what would fail a run late (loader sizes, the model type), and walked: its data sets and sizes."""
from __future__ import annotations

import copy
import difflib
from collections.abc import Iterator
from pathlib import Path

from mmengine.config import Config
from mmengine.utils import import_modules_from_strings

from backbones.common.errors import UsageError
from backbones.common.lifecycle import signals_held
from backbones.common.log import logger
from backbones.dense.cfg_options import merge_options
from backbones.dense.tasks import model_type

LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')
_SIZE_KEYS = ('scale', 'crop_size', 'size', 'stride')
CONFIG_SUFFIXES = ('.py', '.json', '.yaml', '.yml')  # the files mmengine reads as configs


class FormattedOnceConfig(Config):
    """mmengine's Config, its text formatted once for each content it has: mmengine formats it with yapf (0.2 s) for
    the log, the dump, each visualizer backend and every checkpoint, half of a 2-iteration run's time."""

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
FORMER_PACKAGES = {'segmentation': 'backbones.dense', 'common': 'backbones.common',
                   'engine': 'classification.engine',
                   'token_labeling': 'classification.token_labeling', 'visualization': 'classification.pictures'}
RENAMED_MODULES = {'segmentation.notices': 'backbones.dense.silenced_warnings',
                   'segmentation.release': 'backbones.dense.released_segmentors',
                   'token_labeling.augment': 'classification.data.augment',
                   'token_labeling.batch_augment': 'classification.data.batch_augment',
                   'token_labeling.loss': 'classification.objectives.token_loss',
                   'token_labeling.pictures': 'classification.pictures.token_labels',
                   'token_labeling.released': 'classification.token_labeling.released_labels',
                   'token_labeling.targets': 'classification.objectives.token_targets',
                   'visualization.figures': 'backbones.common.drawing',
                   # the dense stack, named `backbones.segmentation` in 0.2.0; own data serves every task
                   'backbones.segmentation': 'backbones.dense',
                   'backbones.segmentation.semantic.own_data': 'backbones.dense.own_data',
                   # semantic segmentation's modules, moved into its task's folder after 0.2.0
                   'segmentation.metrics': 'backbones.dense.semantic.metric',
                   'segmentation.segmentor': 'backbones.dense.semantic.segmentor',
                   'backbones.segmentation.metrics': 'backbones.dense.semantic.metric',
                   'backbones.segmentation.semantic.metrics': 'backbones.dense.semantic.metric',
                   'backbones.segmentation.segmentor': 'backbones.dense.semantic.segmentor',
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
    """A module a config imports, under its present path (the suite's modules moved after 0.2.0)."""
    parts = name.split('.')
    for end in range(len(parts), 0, -1):
        former, rest = '.'.join(parts[:end]), parts[end:]
        moved = RENAMED_MODULES.get(former) or (FORMER_PACKAGES.get(former) if end == 1 else None)
        if moved:
            return '.'.join([moved, *rest])
    return name


def import_custom_modules(path: str | Path, names: list[str], allow_failed: bool = False) -> list[str]:
    """A config's custom_imports imported under their present paths; a failure one line (a warning if allowed)."""
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
                             f'{e}); the suite\'s configs import backbones.dense (docs/layout.md lists its '
                             f'modules)') from e
    return present


def read_config(path: str | Path) -> Config:
    """A config file as mmengine reads it, its `custom_imports` under their present paths, then imported."""
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
    """The config builds a model mmseg or the suite registers (checked before any work)."""
    from mmseg.registry import MODELS

    kind = model_type(cfg) if cfg.get('model') else None
    if not isinstance(kind, str) or MODELS.get(kind) is None:
        nearest = difflib.get_close_matches(str(kind), sorted(MODELS.module_dict), 1)
        raise UsageError(f'{path}: its model type {kind!r} is no model mmseg or the suite registers'
                         + (f' (the nearest: {nearest[0]!r})' if nearest else '')
                         + "; a module of your own that registers it goes in the config's custom_imports")


def check_loader_sizes(cfg: Config, path: str) -> None:
    """Every data loader's batch size and workers are whole numbers that work (a batch of 0 failed late)."""
    for name in LOADERS:
        loader = cfg.get(name) or {}
        for key, least in (('batch_size', 1), ('num_workers', 0)):
            value = loader.get(key, least)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise UsageError(f'{path}: {name}.{key} = {value!r}; it must be a whole number of at least {least}')


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


def pipeline_sizes(pipeline: list) -> str:
    """A pipeline's sizes in words: `Resize (640, 480)` for each step that sets one."""
    return ', '.join(f'{step["type"]} {tuple(step[key])}' for step in pipeline for key in _SIZE_KEYS
                     if isinstance(step.get(key), (list, tuple))) or 'no sizes'


