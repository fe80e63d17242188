"""A model as files for runtimes without the suite: torch.export's program and ONNX, each checked against the model's
own outputs before it counts, written into a folder that appears whole or not at all, marked as the suite's export
with its files' checksums (a folder it did not write is never replaced)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from backbones.common.errors import CheckpointError, CheckpointReadError, UsageError
from backbones.common.files import file_sha256, write_json_atomic

WEIGHTS = 'model.safetensors'
EXPORTED_PROGRAM = 'model.pt2'
ONNX_MODEL = 'model.onnx'
TOLERANCE = dict(rtol=1e-4, atol=1e-4)  # float32, the same weights: the runtimes may order sums differently
# input dimension -> its name and the multiple it must be, {0: ('batch', 1)}, and (optional) the fewest multiples it
# takes (default 2 of an image side's)
DynamicDims = dict[int, tuple[str, int] | tuple[str, int, int]]
Inputs = tuple[torch.Tensor, ...]  # what a network takes: the images first
BATCH: DynamicDims = {0: ('batch', 1)}  # a dynamic batch size, the rest of the input fixed
CHECKED_BATCHES = (2, 1, 3)  # traced on the first; 1 too, which a trace of 2 may have specialised away
MARKER = 'suite_export.json'  # in every export folder: the suite, the export's kind and source, its files' SHA-256
SUITE = 'vit-dense-transfer'


def example_images(count: int, height: int, width: int) -> torch.Tensor:
    """Normalised-looking (count, 3, height, width) inputs the exported files are traced and checked on."""
    return torch.randn(count, 3, height, width, generator=torch.Generator().manual_seed(0))


def batch_examples(height: int, width: int) -> list[torch.Tensor]:
    """Inputs of one size at each of CHECKED_BATCHES, the one to trace first."""
    return [example_images(count, height, width) for count in CHECKED_BATCHES]


def check_same_outputs(expected: torch.Tensor | Sequence[torch.Tensor], got: torch.Tensor | Sequence[torch.Tensor],
                       what: str) -> None:
    """`got` (an exported file's outputs) are the model's `expected` ones, else a CheckpointError."""
    if not torch.is_tensor(expected):
        if torch.is_tensor(got) or len(got) != len(expected):
            raise CheckpointError(f'{what} gives other outputs than the model: nothing was written')
        for number, (one, other) in enumerate(zip(expected, got)):
            check_same_outputs(one, other, f'{what} (output {number})')
        return
    if got.shape != expected.shape or not torch.allclose(expected, got, **TOLERANCE):
        difference = ((expected - got).abs().max().item() if got.shape == expected.shape
                      else f'shape {tuple(got.shape)} for {tuple(expected.shape)}')
        raise CheckpointError(f'{what} gives other outputs than the model ({difference}): nothing was written')


def read_marker(folder: Path) -> dict | None:
    """The marker of an export folder this suite wrote; None for any other folder."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and marker.get('suite') == SUITE else None


def check_export_folder(out: Path, kind: str | None = None) -> None:
    """`out` may be (re)written: absent, empty, or an export of this suite (its MARKER) of the same `kind` holding
    only its own files; anything else is a UsageError naming it, since an export replaces its folder whole."""
    if not out.exists() and not out.is_symlink():
        return
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        return
    marker = read_marker(out) if out.is_dir() and not out.is_symlink() else None
    if marker is None:
        raise UsageError(f'--out {out} exists and is not an export folder of this suite (no {MARKER}), which the '
                         f'export would replace whole: give a new or empty folder')
    if kind is not None and marker.get('export') != kind:
        raise UsageError(f'--out {out} holds a {marker.get("export")} export, which this {kind} export would replace: '
                         f'give another folder (or delete it first)')
    added = sorted(p.name + ('/' if p.is_dir() else '') for p in out.iterdir()
                   if p.name != MARKER and (p.is_dir() or p.name not in marker.get('files', {})))
    if added:
        raise UsageError(f'--out {out} is an earlier export with files it did not write ({", ".join(added[:5])}'
                         f'{", ..." if len(added) > 5 else ""}), which replacing it would delete: move them out or '
                         f'give another folder')


def check_exported_file(path: Path) -> None:
    """A file of an export folder has the SHA-256 its marker records, else a CheckpointReadError; others pass."""
    recorded = (read_marker(path.parent) or {}).get('files', {}).get(path.name)
    if recorded is not None and path.is_file() and file_sha256(path) != recorded:
        raise CheckpointReadError(f'{path}: damaged: its bytes do not match the SHA-256 {path.parent / MARKER} '
                                  f'records; the file changed after it was exported: export it again')


@contextlib.contextmanager
def staged_folder(out: Path, description: dict) -> Iterator[Path]:
    """A temporary folder beside `out`: on success marked as the suite's export and renamed to `out`, else removed."""
    check_export_folder(out, description.get('export'))
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f'.{out.name}.', dir=out.parent))
    try:
        give_the_umasks_mode(staging)
        yield staging
        for path in staging.iterdir():
            give_the_umasks_mode(path)
        files = {path.name: file_sha256(path) for path in sorted(staging.iterdir()) if path.is_file()}
        write_json_atomic(staging / MARKER, {'suite': SUITE, **description, 'files': files})
        check_export_folder(out, description.get('export'))  # again: it may have been filled while the export ran
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def give_the_umasks_mode(path: Path) -> None:
    """The umask's mode, for mkdtemp's folder and files staged through private temporary files."""
    mask = os.umask(0)
    os.umask(mask)
    path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def as_inputs(example: torch.Tensor | Inputs) -> Inputs:
    """An example as the network's inputs: a tensor alone is the images."""
    return example if isinstance(example, tuple) else (example,)


def export_dims(dynamic: DynamicDims | Sequence[DynamicDims]) -> tuple[dict, ...]:
    """torch.export's `dynamic_shapes` of the inputs (`dynamic`: one input's, or each's): each dynamic dimension any
    size, or any multiple of its `multiple` from its fewest; a name the inputs share is one dimension."""
    made: dict[str, torch.export.Dim] = {}

    def dim(name: str, multiple: int, fewest: int = 2):
        if multiple == 1:
            return made.setdefault(name, torch.export.Dim(name, min=1, max=65536))
        return multiple * made.setdefault(f'{name}_{multiple}', torch.export.Dim(f'{name}_{multiple}', min=fewest,
                                                                                 max=65536 // multiple))

    per_input = [dynamic] if isinstance(dynamic, dict) else list(dynamic)
    return tuple({number: dim(*spec) for number, spec in dims.items()} for dims in per_input)


def run_checked(run, example: torch.Tensor | Inputs, what: str) -> torch.Tensor:
    """An exported file's outputs for `example`; a runtime that refuses the input is a CheckpointError naming it."""
    inputs = as_inputs(example)
    try:
        return run(*inputs)
    except Exception as e:  # the guards torch.export recorded, onnxruntime's shape errors
        raise CheckpointError(f'{what} cannot run at input {tuple(inputs[0].shape)} ({type(e).__name__}: '
                              f'{str(e).splitlines()[0][:200]}): nothing was written') from e


def write_exported_program(model: torch.nn.Module, examples: Sequence[torch.Tensor | Inputs], path: Path,
                           dynamic: DynamicDims | Sequence[DynamicDims]) -> None:
    """torch.export's program of the eval-mode `model` with the `dynamic` dimensions, checked on every example."""
    program = torch.export.export(model, as_inputs(examples[0]), dynamic_shapes=export_dims(dynamic))
    torch.export.save(program, path)
    loaded = torch.export.load(path).module()
    with torch.no_grad():
        for example in examples:
            check_same_outputs(model(*as_inputs(example)), run_checked(loaded, example, path.name),
                               f'{path.name} at input {tuple(as_inputs(example)[0].shape)}')


def write_onnx(model: torch.nn.Module, examples: Sequence[torch.Tensor | Inputs], path: Path,
               dynamic: DynamicDims | Sequence[DynamicDims], output_name: str | Sequence[str],
               input_names: Sequence[str] = ('images',)) -> None:
    """The eval-mode `model` as ONNX with the `dynamic` dimensions, checked with onnxruntime on every example."""
    names = [output_name] if isinstance(output_name, str) else list(output_name)
    import onnxruntime  # the export's own dependencies, imported when asked for
    with contextlib.redirect_stdout(io.StringIO()):  # the exporter reports its steps on stdout
        torch.onnx.export(model, as_inputs(examples[0]), str(path), dynamo=True, input_names=list(input_names),
                          output_names=names, dynamic_shapes=export_dims(dynamic))
    session = onnxruntime.InferenceSession(str(path), providers=['CPUExecutionProvider'])

    def run(*inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        fed = {name: value.numpy() for name, value in zip(input_names, inputs)}
        outputs = tuple(torch.from_numpy(o) for o in session.run(None, fed))
        return outputs[0] if isinstance(output_name, str) else outputs

    with torch.no_grad():
        for example in examples:
            got = run_checked(run, example, f'{path.name} in onnxruntime')
            check_same_outputs(model(*as_inputs(example)), got,
                               f'{path.name} in onnxruntime at input {tuple(as_inputs(example)[0].shape)}')
