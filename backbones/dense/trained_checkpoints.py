"""A checkpoint a dense tool is given, checked before any work: a file, a dense model's, of the config's task; a
resumed run's, with something left to do; a backbone's ImageNet file that is there. And a trained checkpoint's
config loaded with the data it runs on (`load_trained_config`)."""
from __future__ import annotations

import re
import zipfile
from pathlib import Path
from urllib.parse import urlparse

import torch.nn as nn
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmseg.registry import MODELS

from backbones.common.errors import AlreadyDone, CheckpointError
from backbones.common.files import load_weights_only
from backbones.dense.cfg_options import merge_options
from backbones.dense.config import check_loader_sizes, check_model_type, load_config
from backbones.dense.mmengine_io import mmengine_checkpoint_globals
from backbones.dense.run_data import EmbeddedSegData, TrainedData, checkpoint_record, choose_trained_data
from backbones.dense.runner import FINISHED, finished_iterations, iteration_checkpoints, load_weights
from backbones.dense.tasks import DenseTask, task_named, task_of, task_recognised_by, tasks
from backbones.weights import TIMM_RELEASE, URL_SCHEMES, guess_family


def load_trained_config(path: str, checkpoint: str, cfg_options: dict | None = None, data_root: str | None = None,
                        fallback: EmbeddedSegData | None = None, need_data: bool = True,
                        loaded: Config | None = None) -> tuple[Config, TrainedData]:
    """`load_config` for a trained checkpoint's config, the checkpoint checked to be of the config's task, and the data
    it runs on (`choose_trained_data`; where the embedded data stands in, the sizes it trained with there). `loaded`:
    the config already read from `path`."""
    cfg = loaded if loaded is not None else load_config(path)
    check_segmentor_checkpoint(checkpoint, task_of(cfg), path)
    data = choose_trained_data(cfg, checkpoint, data_root, cfg_options, fallback, need_data)
    if data.embedded:
        fallback.use_model(cfg)
    if cfg_options:
        merge_options(cfg, cfg_options)
        check_loader_sizes(cfg, path)
        check_model_type(cfg, path)
    return cfg, data


def weight_names(checkpoint: str) -> list[str]:
    """The names in a checkpoint and in each dict right under it, `module.` left out; read memory-mapped."""
    content = load_weights_only(checkpoint, 'checkpoint', mmengine_checkpoint_globals(),
                                mmap=zipfile.is_zipfile(checkpoint))
    if not isinstance(content, dict):
        return []
    return [re.sub(r'^module\.', '', key) for part in (content, *content.values()) if isinstance(part, dict)
            for key in part if isinstance(key, str)]


def check_segmentor_checkpoint(checkpoint: str, task: DenseTask | None = None, config: str | None = None) -> None:
    """A checkpoint a dense tool is given: there, a dense model's, and of the config's `task`; before any work."""
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
    trained = task_named((checkpoint_record(checkpoint) or {}).get('task')) or task_recognised_by(names)
    if trained is not None and trained is not task:
        raise CheckpointError(f'{checkpoint} holds a {trained.model_kind} ({trained.title}), and {config} is '
                              f'a {task.title} config: give the config it was trained with')


def check_resumed_run(work_dir: str, task: DenseTask, config: str, max_iters: int) -> None:
    """The work dir's run is of the config's `task` and has something left to do (else AlreadyDone)."""
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


def built_segmentor(cfg: Config, checkpoint: str | None = None) -> nn.Module:
    """The config's model in eval mode, every weight from `checkpoint` where given, none from its ImageNet file."""
    init_default_scope(cfg.get('default_scope', 'mmseg'))
    cfg.model.backbone.pretrained = None
    model = MODELS.build(cfg.model)
    if checkpoint is not None:
        load_weights(model, checkpoint)
    return model.eval()
