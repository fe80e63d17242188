"""The data a dense run reads: the config's folders, the tool's embedded data standing in for a known data set that
is not on disk (`EmbeddedSegData`), and, for a trained checkpoint, what it records of the data it was trained on
(`trained_data_record`), which its tests and predictions then read the same way."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from mmengine.config import Config

from backbones.common.cli import EmbeddedData
from backbones.common.errors import DataError
from backbones.common.files import ready_mark
from backbones.common.log import logger
from backbones.dense.config import LOADERS, pipeline_sizes, set_data_root
from backbones.dense.layouts import WrittenLayout, layout_of, layout_roots
from backbones.dense.mmengine_io import plain_values
from backbones.dense.own_data import is_own_data_config
from backbones.dense.runner import recorded_config, trained_data
from backbones.dense.tasks import task_of


@dataclass(frozen=True)
class TrainedData:
    """The data a tool runs a trained checkpoint on: one folder for every loader (`data_root`; None: the config's own),
    the tool's embedded data (`embedded`), or none (`at_hand` False: the checkpoint's classes serve)."""

    data_root: str | None = None
    embedded: bool = False
    at_hand: bool = True
    embedded_root: str | None = None  # the embedded data's folder the checkpoint was trained on, where it is there


def trained_data_record(cfg: Config, embedded: bool) -> dict:
    """What a training run's checkpoints record of its data: folder, embedded or not, task, test pipeline."""
    root = cfg.train_dataloader.dataset.get('data_root') or ''
    return plain_values(dict(data_root=os.path.abspath(root), embedded=embedded, task=task_of(cfg).name,
                             test_pipeline=cfg.test_dataloader.dataset.pipeline,
                             **(embedded_data_facts(cfg) if embedded else {})))


def embedded_data_facts(cfg: Config) -> dict:
    """The embedded data a config reads: its published layout (None: the suite's own) and version (READY mark)."""
    dataset = cfg.test_dataloader.dataset
    layout = layout_of(dataset)
    return dict(layout=layout.title if isinstance(layout, WrittenLayout) else None,
                data_version=ready_mark(dataset.get('data_root') or ''))


def check_same_embedded_data(cfg: Config, record: dict, checkpoint: str) -> None:
    """A checkpoint trained on the embedded data (`record`) runs on that data in the same layout and version, else its
    scores would be against other ground truth (a checkpoint from before this record is not checked)."""
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
    """What a checkpoint records of the data it was trained on (`trained_data_record`); for one from before that record,
    the same read from its meta's config (`embedded` None: unknown); None where it holds neither (mmseg's releases)."""
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
    """The data for a trained checkpoint: `data_root` if given, else the config's folders on disk, else the data it
    records (embedded, or its folder on disk), else none (an error if `need_data`)."""
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


class EmbeddedSegData(EmbeddedData, Protocol):
    """What a config runs on when its data set is not on disk (the tools' embedded set): its options, the config pointed
    at it, the schedule and model sizes there; a backbone pretrained for it comes as a checkpoint."""

    root: Path  # where the data lives: a checkpoint trained on a data set there was trained on it

    def use_data(self, cfg: Config) -> None: ...

    def use_schedule(self, cfg: Config) -> None: ...

    def use_model(self, cfg: Config) -> None: ...

    def moved_to(self, root: Path) -> EmbeddedSegData:
        """The same data kept in `root` (where a checkpoint recorded it was trained on it)."""
        ...


def data_roots(cfg: Config, data_root: str | None = None, cfg_options: dict | None = None) -> set[str]:
    """The data sets' folders: `data_root` for all, else each loader's as `cfg_options` or the config give it."""
    if data_root:
        return {data_root}
    options = cfg_options or {}
    return {options.get(f'{loader}.dataset.data_root', cfg[loader]['dataset']['data_root'])
            for loader in LOADERS if cfg.get(loader)}


def own_data_absent(cfg: Config, cfg_options: dict | None = None) -> bool:
    """An own-data config whose data set is not on disk: a checkpoint of it predicts with the classes it records."""
    return is_own_data_config(cfg) and not any(Path(root).is_dir() for root in data_roots(cfg, None, cfg_options))


def missing_data(roots: set[str], fallback: EmbeddedSegData | None) -> str | None:
    """The config's own folder (a registered layout's, `layout_roots`) that is not on disk, where `fallback`'s data
    stands in for it; None when every folder is there. Any other missing folder is an error."""
    missing = sorted(root for root in roots if not Path(root).is_dir())
    if not missing:
        return None
    if len(missing) > 1 or missing[0] not in layout_roots() or fallback is None:
        raise DataError(f'data root not found: {", ".join(missing)} (--data-root names the data set\'s folder)')
    return missing[0]


def resolve_data(cfg: Config, data_root: str | None = None, fallback: EmbeddedSegData | None = None,
                 checkpoint: str | None = None) -> bool:
    """Apply `data_root`, the own data's folders and classes, a detector's class count (with a trained `checkpoint`, the
    one it records); where the config's own folder is not on disk, use `fallback`'s data. True if it did."""
    if data_root:
        set_data_root(cfg, data_root)
    roots = data_roots(cfg)
    missing = missing_data(roots, fallback)
    if missing is not None:
        logger.info(f'{layout_roots()[missing]} not found at {missing} (docs/segmentation.md and '
                    'docs/instances_and_depth.md say how to use it; --data-root names another folder): the embedded '
                    'data')
        fallback.use_data(cfg)
    task_of(cfg).resolve_classes(cfg, roots, checkpoint, embedded=missing is not None)
    return missing is not None


def resolve_trained_data(cfg: Config, checkpoint: str, data: TrainedData, fallback: EmbeddedSegData | None = None,
                         cfg_options: dict | None = None) -> None:
    """`resolve_data` for a trained checkpoint on the data `choose_trained_data` chose."""
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


def use_trained_pipeline(cfg: Config, checkpoint: str, cfg_options: dict | None = None) -> None:
    """The test pipeline the checkpoint's validations ran, where it records another than the config's (logged)."""
    recorded = (checkpoint_record(checkpoint) or {}).get('test_pipeline')
    if recorded is None or any(key.startswith('test_dataloader') for key in cfg_options or {}):
        return
    own = plain_values(cfg.test_dataloader.dataset.pipeline)
    if own != recorded:
        logger.warning(f'warning: {checkpoint} was validated with another test pipeline than the config gives '
                       f'({pipeline_sizes(recorded)}, the config {pipeline_sizes(own)}): its own is used')
        cfg.test_dataloader.dataset.pipeline = recorded
