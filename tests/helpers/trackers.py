"""What the experiment trackers' real clients wrote, read back: a wandb offline run's records and an MLflow file
store's metrics and parameters."""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

BLOCK = 32768  # wandb's run file: a LevelDB-style log of 32 KiB blocks after a 7-byte header
FULL, LAST = 1, 4  # a record's whole body, or the last of its pieces


def wandb_records(run_file: Path):
    """The protobuf records of a wandb run file (`run-ID.wandb`), in order."""
    from wandb.proto import wandb_internal_pb2
    data = run_file.read_bytes()
    assert data[:4] == b':W&B', f'{run_file} is not a wandb run file'
    pos, body = 7, b''
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        _, length, kind = struct.unpack('<IHB', data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if length == 0 and kind == 0:  # a block's padding
            pos += left
            continue
        body += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(body)
            body = b''
            yield record


def wandb_history(folder: Path) -> tuple[list[dict], dict]:
    """The rows logged and the config of the one wandb run under `folder`."""
    (run_file,) = folder.rglob('run-*.wandb')
    rows, config = [], {}
    for record in wandb_records(run_file):
        kind = record.WhichOneof('record_type')
        if kind == 'history':
            rows.append({item.key or '/'.join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
        elif kind in ('run', 'config'):
            update = record.run.config.update if kind == 'run' else record.config.update
            config.update({item.key: json.loads(item.value_json) for item in update})
    return rows, config


def mlflow_run(store: Path, run_id: str) -> tuple[dict[str, list[tuple[int, float]]], dict[str, str]]:
    """An MLflow file store's metrics of a run (name -> [(step, value)]) and its parameters."""
    from mlflow.tracking import MlflowClient
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # as the trainer does for its own file store
    client = MlflowClient(store.resolve().as_uri())
    run = client.get_run(run_id)
    metrics = {name: [(m.step, m.value) for m in client.get_metric_history(run_id, name)] for name in run.data.metrics}
    return metrics, dict(run.data.params)
