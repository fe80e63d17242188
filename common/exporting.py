"""A model as files for runtimes without the suite: torch.export's program and ONNX, each checked against the model's
own outputs before it counts, written into a folder that appears whole or not at all."""
from __future__ import annotations

import contextlib
import io
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from .errors import CheckpointError

EXPORTED_PROGRAM = 'model.pt2'
ONNX_MODEL = 'model.onnx'
TOLERANCE = dict(rtol=1e-4, atol=1e-4)  # float32, the same weights: the runtimes may order sums differently
DynamicDims = dict[int, str]  # input dimension -> its name, e.g. {0: 'batch'}


def check_same_outputs(expected: torch.Tensor, got: torch.Tensor, what: str) -> None:
    """`got` (an exported file's outputs) are the model's `expected` ones, else a CheckpointError."""
    if got.shape != expected.shape or not torch.allclose(expected, got, **TOLERANCE):
        difference = ((expected - got).abs().max().item() if got.shape == expected.shape
                      else f'shape {tuple(got.shape)} for {tuple(expected.shape)}')
        raise CheckpointError(f'{what} gives other outputs than the model ({difference}): nothing was written')


@contextlib.contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """A temporary folder beside `out` to write into; renamed to `out` (an earlier one replaced) when the block ends
    without an error, removed otherwise."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f'.{out.name}.', dir=out.parent))
    try:
        yield staging
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def export_dims(example: torch.Tensor, dynamic: DynamicDims) -> tuple[dict, ...]:
    """torch.export's `dynamic_shapes` for one input tensor."""
    return ({dim: torch.export.Dim(name, min=1 if dim == 0 else 16, max=4096 if dim == 0 else 8192)
             for dim, name in dynamic.items()},)


def write_exported_program(model: torch.nn.Module, examples: list[torch.Tensor], path: Path,
                           dynamic: DynamicDims) -> None:
    """torch.export's program of the eval-mode `model`, traced on `examples[0]` with the `dynamic` dimensions, and
    checked on every example (give ones of other sizes along those dimensions)."""
    program = torch.export.export(model, (examples[0],), dynamic_shapes=export_dims(examples[0], dynamic))
    torch.export.save(program, path)
    loaded = torch.export.load(path).module()
    with torch.no_grad():
        for example in examples:
            check_same_outputs(model(example), loaded(example), f'{path.name} at input {tuple(example.shape)}')


def write_onnx(model: torch.nn.Module, examples: list[torch.Tensor], path: Path, dynamic: DynamicDims,
               output_name: str) -> None:
    """The eval-mode `model` as ONNX (torch's dynamo exporter; input `images`, output `output_name`), with the
    `dynamic` dimensions, checked with onnxruntime on every example."""
    import onnxruntime  # the export's own dependencies, imported when asked for
    with contextlib.redirect_stdout(io.StringIO()):  # the exporter reports its steps on stdout
        torch.onnx.export(model, (examples[0],), str(path), dynamo=True, input_names=['images'],
                          output_names=[output_name], dynamic_shapes=export_dims(examples[0], dynamic))
    session = onnxruntime.InferenceSession(str(path), providers=['CPUExecutionProvider'])
    with torch.no_grad():
        for example in examples:
            got = torch.from_numpy(session.run(None, {'images': example.numpy()})[0])
            check_same_outputs(model(example), got, f'{path.name} in onnxruntime at input {tuple(example.shape)}')
