"""A training run's folder and what its checkpoints hold besides weights (the run's settings), read weights-only."""
from __future__ import annotations

from pathlib import Path

from backbones.common.errors import CheckpointError
from backbones.common.files import load_weights_only
from backbones.common.images import check_same_classes
from backbones.common.log import logger

# The files of a run folder: the latest state (resumable), the best epoch's weights, the final metrics, one line per
# epoch
LAST, BEST, METRICS, LOG = 'last.pth', 'best.pth', 'metrics.json', 'log.jsonl'
DATA_CONFIG = 'data_config'  # the run's settings key of its evaluation's preprocessing (timm's data-config keys)


def read_training_checkpoint(path: str | Path, mmap: bool = False) -> dict:
    """A checkpoint of ours, weights-only; with `mmap`, tensors are read only when used (for a look at its fields).
    One written before epochs were numbered from 1 (its `epoch` was 0-based, timm's way) reads as the same point."""
    ckpt = load_weights_only(path, mmap=mmap)
    if isinstance(ckpt, dict) and 'args' in ckpt and 'epoch' in ckpt and 'epochs_done' not in ckpt:
        ckpt['epochs_done'] = ckpt.pop('epoch') + 1
    return ckpt


def checkpoint_settings(path: str | Path) -> dict:
    """The settings a checkpoint of ours records (its `args`: the class list, the input size, ...); {} for other
    files (official releases)."""
    try:
        ckpt = read_training_checkpoint(path, mmap=True)
    except CheckpointError:  # not ours, or not readable: the weight loader reports a damaged file with its own error
        return {}
    args = ckpt.get('args') if isinstance(ckpt, dict) else None
    return args if isinstance(args, dict) else {}


def recorded_data_config(settings: dict) -> dict:
    """The preprocessing a run's settings record for its evaluation, in timm's data-config keys: `data_config`
    (input size, crop fraction, interpolation, mean, std); runs from before it was recorded give their input size
    (`img_size`), and a CIFAR transfer its mean and std."""
    if isinstance(settings.get(DATA_CONFIG), dict):
        return dict(settings[DATA_CONFIG])
    recorded = {key: tuple(settings[key]) for key in ('mean', 'std') if settings.get(key) is not None}
    if settings.get('img_size'):
        recorded['input_size'] = (3, settings['img_size'], settings['img_size'])
    return recorded


def checkpoint_data_config(checkpoint: str | Path | None, model_config: dict, img_size: int | None = None,
                           crop_pct: float | None = None) -> dict:
    """The preprocessing to run `checkpoint` with: the model's own (`model_config`, timm's data config), overlaid
    with what the checkpoint records of its run's evaluation (the input size it was trained at, ...), then with an
    explicit `img_size` and `crop_pct`. A size other than the one it records is said in the log (official releases
    record none: theirs is the model's own)."""
    recorded = recorded_data_config(checkpoint_settings(checkpoint)) if checkpoint else {}
    config = {**model_config, **recorded}
    if img_size is not None:
        trained = config['input_size'][-1]
        if 'input_size' in recorded and img_size != trained:
            logger.warning(f'warning: {checkpoint} was trained at {trained} px; it runs at {img_size} px here '
                           f'(--img-size)')
        config['input_size'] = (config['input_size'][0], img_size, img_size)
    if crop_pct is not None:
        config['crop_pct'] = crop_pct
    return config


def checkpoint_classes(path: str | Path) -> list[str] | None:
    """The class list a checkpoint of ours records (`args.classes`); None for other files (official releases)."""
    classes = checkpoint_settings(path).get('classes')
    return list(classes) if isinstance(classes, (list, tuple)) else None


def check_checkpoint_classes(path: str | Path, classes: list[str], classes_from: str) -> None:
    """A checkpoint of ours must have been trained on `classes` (names and order: the same count of other classes
    would turn its scores for one class into another's); other files record none and pass."""
    recorded = checkpoint_classes(path)
    if recorded is not None:
        check_same_classes(recorded, classes, f'the checkpoint {path}', classes_from)
