"""The experiment trackers' options, shared by the classification and segmentation trainers: `--log-wandb` and
`--log-mlflow`, each client an optional extra checked before any work, its own errors while it starts one line
(`TrackerError`), and the MLflow store a run logs to."""
from __future__ import annotations

import argparse
import contextlib
import importlib
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from backbones.common.errors import TrackerError, UsageError


def import_extra(module: str, flag: str, extra: str | None = None) -> ModuleType:
    """The optional package a flag needs, imported; absent or broken, a UsageError naming the flag and the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise UsageError(f"{flag} needs {module}, which does not import here ({e}): pip install '.[{extra or module}]'"
                         ) from e


def add_tracker_arguments(parser: argparse.ArgumentParser, wandb_run: str, mlflow_run: str) -> None:
    """--log-wandb, --log-mlflow (optional extras); `wandb_run`, `mlflow_run`: what the run is named after."""
    parser.add_argument('--log-wandb', action='store_true', help=(
        f'also log to Weights & Biases (pip install \'.[wandb]\'): {wandb_run}; WANDB_MODE=offline keeps it on disk, '
        'without an account'))
    parser.add_argument('--log-mlflow', action='store_true', help=(
        f'also log to MLflow (pip install \'.[mlflow]\'): {mlflow_run}; to MLFLOW_TRACKING_URI when set'))


def check_trackers(wandb: bool, mlflow: bool) -> None:
    """Before any work: the clients of the trackers asked for import; those that do not are named in one line."""
    missing = []
    for module in [name for name, asked in (('wandb', wandb), ('mlflow', mlflow)) if asked]:
        try:
            import_extra(module, f'--log-{module}')
        except UsageError as e:
            missing.append(str(e))
    if missing:
        raise UsageError('; '.join(missing))


@contextlib.contextmanager
def tracker_errors(flag: str, what: str) -> Iterator[None]:
    """A tracker client's error while it starts its run, as a TrackerError naming `flag` and `what` failed."""
    try:
        yield
    except Exception as e:  # wandb's and MLflow's errors have no common base
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise TrackerError(f'{flag}: {what}: {type(e).__name__}: {reason}') from e


def mlflow_tracking_uri(default_folder: Path) -> str:
    """The MLflow store: MLFLOW_TRACKING_URI, else a file store in `default_folder`."""
    store = os.environ.get('MLFLOW_TRACKING_URI') or default_folder.resolve().as_uri()
    if store.startswith('file:'):
        # MLflow 3 refuses its file store unless asked; the package's extra (mlflow-skinny) has no database one
        os.environ.setdefault('MLFLOW_ALLOW_FILE_STORE', 'true')
    return store
