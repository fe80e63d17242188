"""Experiment trackers beside TensorBoard: Weights & Biases (`--log-wandb`) and MLflow (`--log-mlflow`).

Each is an optional extra of the package (`pip install .[wandb]`, `.[mlflow]`), imported only when asked for. The
main process starts them (`start_trackers`) before the run's data is read; a tracker that cannot start is one line,
and what it wrote into the folder is removed. A resumed run continues the same tracker run (its id is kept in the
run folder). Where the tracker writes is the client's own setting (wandb's `WANDB_MODE`, `WANDB_DIR`, default: the
run folder; MLflow's `MLFLOW_TRACKING_URI`, default: `OUTPUT/mlruns`). docs/imagenet.md tells what they log."""
from __future__ import annotations

import os
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from backbones.common.files import write_text_atomic
from backbones.common.trackers import import_extra, mlflow_tracking_uri, tracker_errors


class Tracker(Protocol):
    def log(self, scalars: dict[str, float], step: int, axis: str) -> None:
        """`scalars` at `step` of `axis` ('update' for training scalars, 'epoch' for the epochs' records)."""

    def log_images(self, images: dict[str, np.ndarray], step: int) -> None:
        """(H, W, 3) uint8 pictures at epoch `step`."""

    def close(self, finished: bool) -> None:
        """The tracker run ended: `finished`, or stopped (a signal) to be resumed."""


def run_id(output: Path, name: str, make: Callable[[], str]) -> str:
    """The tracker run id kept in OUTPUT/`name`, made by `make()` where there is none."""
    path = output / name
    if path.exists() and (kept := path.read_text().strip()):
        return kept
    value = make()
    write_text_atomic(path, value + '\n')
    return value


class WandbTracker:
    """A wandb run, resumed by its id; each axis a step metric of its own (a resume goes back in updates)."""

    def __init__(self, output: Path, experiment: str, settings: dict) -> None:
        wandb = import_extra('wandb', '--log-wandb')
        self.wandb = wandb
        with tracker_errors('--log-wandb', 'wandb could not start its run (wandb login, or WANDB_MODE=offline)'):
            self.run = wandb.init(project=experiment, name=output.name, config=settings,
                                  id=run_id(output, 'wandb_id', lambda: uuid.uuid4().hex[:12]), resume='allow',
                                  dir=os.environ.get('WANDB_DIR', str(output)))
        for axis, prefix in (('update', 'train'), ('epoch', 'epoch')):
            self.run.define_metric(axis)
            self.run.define_metric(f'{prefix}/*', step_metric=axis)

    def log(self, scalars: dict[str, float], step: int, axis: str) -> None:
        self.run.log({**scalars, axis: step})

    def log_images(self, images: dict[str, np.ndarray], step: int) -> None:
        self.run.log({**{f'epoch/{tag}': self.wandb.Image(image) for tag, image in images.items()}, 'epoch': step})

    def close(self, finished: bool) -> None:
        self.run.finish(exit_code=0 if finished else 1)


class MlflowTracker:
    """An MLflow run, resumed by its id; the settings as its parameters, logged on the first start only."""

    def __init__(self, output: Path, experiment: str, settings: dict) -> None:
        mlflow = import_extra('mlflow', '--log-mlflow')
        store = mlflow_tracking_uri(output / 'mlruns')
        self.client = mlflow.tracking.MlflowClient(store)
        resumed = (output / 'mlflow_run_id').exists()
        with tracker_errors('--log-mlflow', f'MLflow could not start its run in the store {store}'):
            self.run_id = run_id(output, 'mlflow_run_id', lambda: self.new_run(experiment, output.name))
        with tracker_errors('--log-mlflow', f'MLflow run {self.run_id} (kept in {output / "mlflow_run_id"}) in the '
                                            f'store {store}: the store a resumed run started with is '
                                            f'MLFLOW_TRACKING_URI\'s'):
            if not resumed:
                for key, value in settings.items():
                    self.client.log_param(self.run_id, key, str(value)[:6000])  # MLflow's longest parameter value
            self.client.update_run(self.run_id, 'RUNNING')

    def new_run(self, experiment: str, name: str) -> str:
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        return self.client.create_run(experiment_id, run_name=name).info.run_id

    def log(self, scalars: dict[str, float], step: int, axis: str) -> None:
        for key, value in scalars.items():
            self.client.log_metric(self.run_id, key, value, step=step)

    def log_images(self, images: dict[str, np.ndarray], step: int) -> None:
        for tag, image in images.items():
            self.client.log_image(self.run_id, image, key=tag.replace('/', '_'), step=step)

    def close(self, finished: bool) -> None:
        self.client.set_terminated(self.run_id, 'FINISHED' if finished else 'KILLED')


class StartedTrackers:
    """The tracker runs of one training run as one Tracker, closed once (as stopped where never closed)."""

    def __init__(self, runs: list[Tracker]) -> None:
        self.runs = runs
        self.unclosed = weakref.finalize(self, close_all, runs, False)

    def log(self, scalars: dict[str, float], step: int, axis: str) -> None:
        for run in self.runs:
            run.log(scalars, step, axis)

    def log_images(self, images: dict[str, np.ndarray], step: int) -> None:
        for run in self.runs:
            run.log_images(images, step)

    def close(self, finished: bool) -> None:
        if self.unclosed.detach() is not None:  # not closed yet
            close_all(self.runs, finished)


def close_all(runs: list[Tracker], finished: bool) -> None:
    for run in runs:
        run.close(finished)


def start_trackers(output: Path, experiment: str, settings: dict, wandb: bool, mlflow: bool) -> StartedTrackers:
    """The trackers asked for, started (or resumed); one that cannot start is a TrackerError, the others stopped."""
    runs: list[Tracker] = []
    try:
        for asked, tracker in ((wandb, WandbTracker), (mlflow, MlflowTracker)):
            if asked:
                runs.append(tracker(output, experiment, settings))
    except BaseException:
        close_all(runs, False)
        raise
    return StartedTrackers(runs)
