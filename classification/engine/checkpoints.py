"""A training run's folder: what its checkpoints hold besides weights (the run's settings), read weights-only; the
settings it was launched with (`args.yaml`, which `--config` relaunches) and its epochs as a table (`summary.csv`)."""
from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

import yaml

from backbones.common.errors import CheckpointError, DataError
from backbones.common.files import load_weights_only, write_text_atomic
from backbones.common.images import check_same_classes
from backbones.common.log import logger
from backbones.weights import MODEL_WEIGHTS

# The files of a run folder: the latest state (resumable), the best epoch's weights, the final metrics, one line per
# epoch, the settings the run was launched with, the epochs as a table (timm's names)
LAST, BEST, METRICS, LOG = 'last.pth', 'best.pth', 'metrics.json', 'log.jsonl'
ARGS, SUMMARY = 'args.yaml', 'summary.csv'
ARGS_VERSION = 1  # args.yaml's layout: the command's option names (dests) and values
UNRECORDED = ('help', 'config', 'resume')  # what says how a run was launched, not what it is
# settings added to layout 1 since it was first written, each absent from older files and read as the value that runs
# as those runs did
ADDED_SETTINGS = {'layer_decay': None, 'frozen': False, 'fast_decode': False}
DATA_CONFIG = 'data_config'  # the run's settings key of its evaluation's preprocessing (timm's data-config keys)
# A checkpoint's key recording the architecture with the arguments that built it (classification.models.
# create_classifier's); backbones.weights.MODEL_WEIGHTS names the weights its `state_dict` holds
ARCHITECTURE = 'architecture'


def read_training_checkpoint(path: str | Path, mmap: bool = False) -> dict:
    """A checkpoint of ours, weights-only (`mmap`: tensors read when used); an older 0-based epoch read as 1-based."""
    ckpt = load_weights_only(path, mmap=mmap)
    if isinstance(ckpt, dict) and 'args' in ckpt and 'epoch' in ckpt and 'epochs_done' not in ckpt:
        ckpt['epochs_done'] = ckpt.pop('epoch') + 1
    return ckpt


def checkpoint_settings(path: str | Path) -> dict:
    """The settings (`args`) a checkpoint of ours records; {} for other files."""
    try:
        ckpt = read_training_checkpoint(path, mmap=True)
    except CheckpointError:  # not ours, or not readable: the weight loader reports a damaged file with its own error
        return {}
    args = ckpt.get('args') if isinstance(ckpt, dict) else None
    return args if isinstance(args, dict) else {}


def recorded_data_config(settings: dict) -> dict:
    """The preprocessing a run's settings record for its evaluation, in timm's data-config keys."""
    if isinstance(settings.get(DATA_CONFIG), dict):
        return dict(settings[DATA_CONFIG])
    recorded = {key: tuple(settings[key]) for key in ('mean', 'std') if settings.get(key) is not None}
    if settings.get('img_size'):
        recorded['input_size'] = (3, settings['img_size'], settings['img_size'])
    return recorded


def checkpoint_data_config(checkpoint: str | Path | None, model_config: dict, img_size: int | None = None,
                           crop_pct: float | None = None) -> dict:
    """The model's data config, under what the checkpoint records, under `img_size` and `crop_pct`."""
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


def weights_taken(path: str | Path, use_ema: bool | None) -> str:
    """'ema' or 'trained': what a loader takes from `path` with `use_ema`. By default the checkpoint's model, which a
    checkpoint of ours names (`weights`); other files' is their trained weights."""
    if use_ema is not None:
        return 'ema' if use_ema else 'trained'
    try:
        ckpt = read_training_checkpoint(path, mmap=True)
    except CheckpointError:
        return 'trained'
    return ckpt.get(MODEL_WEIGHTS, 'trained') if isinstance(ckpt, dict) else 'trained'


def checkpoint_classes(path: str | Path) -> list[str] | None:
    """The class list a checkpoint of ours records; None for other files (official releases)."""
    classes = checkpoint_settings(path).get('classes')
    return list(classes) if isinstance(classes, (list, tuple)) else None


def check_checkpoint_classes(path: str | Path, classes: list[str], classes_from: str) -> None:
    """A checkpoint of ours must have been trained on `classes`, names and order; other files record none and pass."""
    recorded = checkpoint_classes(path)
    if recorded is not None:
        check_same_classes(recorded, classes, f'the checkpoint {path}', classes_from)


# ---- args.yaml: the run's settings, which `--config` relaunches


def write_run_args(output: Path, command: str, settings: dict) -> None:
    """OUTPUT/args.yaml: the `command`'s settings (option dest -> value, as `run_arguments` reads them back)."""
    plain = {key: str(value) if isinstance(value, Path) else list(value) if isinstance(value, tuple) else value
             for key, value in settings.items()}
    text = yaml.safe_dump({'command': command, 'args_version': ARGS_VERSION, **plain}, sort_keys=False)
    write_text_atomic(output / ARGS, f'# {command} --config {output / ARGS} launches this run again\n{text}')


def read_run_args(path: str | Path, command: str) -> dict:
    """The settings an args.yaml of `command` holds; any other file is a DataError naming it."""
    try:
        values = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise DataError(f'--config {path}: {e.strerror or e}') from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise DataError(f'--config {path}: not a YAML file ({str(e).splitlines()[0]})') from None
    if not isinstance(values, dict) or 'command' not in values:
        raise DataError(f'--config {path}: not the args.yaml of a run of this suite (it names no command; timm\'s '
                        f'args.yaml is another format: give its values as options)')
    if values['command'] != command:
        raise DataError(f'--config {path}: the settings of a {values["command"]} run, not of {command}')
    if type(values.get('args_version')) is not int or values['args_version'] != ARGS_VERSION:
        raise DataError(f'--config {path}: args.yaml layout {values.get("args_version")!r}; this version of the suite '
                        f'reads layout {ARGS_VERSION}: launch it with the suite\'s version that wrote it')
    return {key: value for key, value in values.items() if key not in ('command', 'args_version')}


def run_arguments(parser: argparse.ArgumentParser, settings: dict, source: str | Path) -> list[str]:
    """The command line that gives `parser` an args.yaml's `settings`, each value checked as a typed one."""
    actions: dict[str, list[argparse.Action]] = {}
    for action in parser._actions:
        actions.setdefault(action.dest, []).append(action)
    unknown = [key for key in settings if key not in actions]
    if unknown:
        raise DataError(f'--config {source}: settings this version of {parser.prog} does not have: '
                        f'{", ".join(unknown)} (written by another version of the suite?)')
    settings = {**{dest: value for dest, value in ADDED_SETTINGS.items() if dest in actions}, **settings}
    missing = [dest for dest in actions if dest not in settings and dest not in UNRECORDED]
    if missing:  # a file cut short, or edited: the run would take today's defaults for them, silently
        raise DataError(f'--config {source}: settings missing: {", ".join(missing)}')
    positional, options = [], []
    for dest, value in settings.items():
        first = actions[dest][0]
        if not first.option_strings:
            positional.append(str(value))
            continue
        tokens = next((tokens for action in actions[dest] if (tokens := option_tokens(action, value)) is not None),
                      None)
        if tokens is None:
            raise DataError(f'--config {source}: {dest}: {value!r} is not a value {first.option_strings[0]} takes')
        options += tokens
    return positional + options


def option_tokens(action: argparse.Action, value: object) -> list[str] | None:
    """`action`'s option with `value` as typed ([]: left out for the default), or None where it cannot give it."""
    flag = action.option_strings[0]
    if isinstance(action, argparse.BooleanOptionalAction):
        return [] if value is None else [flag if value else action.option_strings[1]]
    if action.nargs == 0:  # store_true, store_false, store_const
        return [flag] if value == action.const else [] if value == action.default else None
    if action.nargs in ('*', '+'):
        return [flag, *map(str, value)] if isinstance(value, list) and (value or action.nargs == '*') else None
    if value is None:  # a recipe field (absent unless typed) takes the word `none`; other options default to None
        return [flag, 'none'] if action.default is argparse.SUPPRESS else [] if action.default is None else None
    if action.nargs == '?' and value == action.const:
        return [flag]
    if action.choices is not None and value not in action.choices:
        return None
    return [flag, str(value)]


# ---- summary.csv: the epochs' records as a table


def write_summary(output: Path) -> None:
    """OUTPUT/summary.csv from log.jsonl: one row per epoch, a column per figure (in the order they first appear)."""
    records = [json.loads(line) for line in (output / LOG).read_text().splitlines() if line.strip()]
    columns = list(dict.fromkeys(key for record in records for key in record))
    table = io.StringIO()
    writer = csv.DictWriter(table, columns, lineterminator='\n')
    writer.writeheader()
    writer.writerows(records)
    write_text_atomic(output / SUMMARY, table.getvalue())
