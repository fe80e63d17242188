"""CIFAR-10/100 from the standard Python archives, a held-out validation split, and the on-device input pipeline.

The data sets are read from `cifar-10-python.tar.gz` / `cifar-100-python.tar.gz` (without extracting them) or from
their extracted folders, with an unpickler that only builds NumPy arrays, so a tampered file cannot run code. Images
stay 32x32 uint8 until they reach the device; there a batch is upsampled to the model resolution and, for training,
randomly cropped from a zero-padded copy and flipped (the T2T-ViT transfer recipe), then normalised."""
from __future__ import annotations

import io
import pickle
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from backbones.common.distributed import on_device
from backbones.common.errors import DataError, UsageError
from backbones.common.random_state import batch_generator


@dataclass(frozen=True)
class CifarFormat:
    title: str
    folder: str  # the folder the archive extracts to
    archive: str
    train: tuple[str, ...]
    test: tuple[str, ...]
    meta: str
    label_key: str
    names_key: str
    num_classes: int

    @property
    def files(self) -> tuple[str, ...]:
        return (*self.train, *self.test, self.meta)


FORMATS: dict[str, CifarFormat] = {
    'cifar10': CifarFormat('CIFAR-10', 'cifar-10-batches-py', 'cifar-10-python.tar.gz',
                           tuple(f'data_batch_{i}' for i in range(1, 6)), ('test_batch',), 'batches.meta',
                           'labels', 'label_names', 10),
    'cifar100': CifarFormat('CIFAR-100', 'cifar-100-python', 'cifar-100-python.tar.gz', ('train',), ('test',), 'meta',
                            'fine_labels', 'fine_label_names', 100),
}


class CifarFormatError(DataError):
    """CIFAR data that is missing, incomplete or not in the standard Python format; the message names the file."""


@dataclass
class CifarSplit:
    images: np.ndarray  # uint8 (N, 3, 32, 32)
    labels: np.ndarray  # int64 (N,)

    def subset(self, indices: np.ndarray) -> 'CifarSplit':
        return CifarSplit(self.images[indices], self.labels[indices])


@dataclass
class CifarData:
    train: CifarSplit
    test: CifarSplit
    classes: list[str]


class _ArrayUnpickler(pickle.Unpickler):
    """Builds dicts, lists, strings and NumPy arrays only: what the CIFAR pickles hold (Python 2 or 3 written)."""

    ALLOWED = {('numpy.core.multiarray', '_reconstruct'), ('numpy._core.multiarray', '_reconstruct'),
               ('numpy.core.numeric', '_frombuffer'), ('numpy._core.numeric', '_frombuffer'),
               ('numpy', 'ndarray'), ('numpy', 'dtype'), ('_codecs', 'encode')}

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f'refusing to build {module}.{name}: not part of a CIFAR pickle')
        return super().find_class(module, name)


def _text(value) -> str:
    return value.decode('utf-8') if isinstance(value, bytes) else str(value)


def _unpickle(raw: bytes, where: str) -> dict:
    try:
        obj = _ArrayUnpickler(io.BytesIO(raw), encoding='bytes').load()
    except Exception as e:  # truncated or foreign files raise anything from EOFError to UnpicklingError
        raise CifarFormatError(f'{where}: not a readable CIFAR pickle ({type(e).__name__}: {e})') from e
    if not isinstance(obj, dict):
        raise CifarFormatError(f'{where}: expected a dict, found {type(obj).__name__}')
    return {_text(k): v for k, v in obj.items()}


def _decode_batch(batch: dict, label_key: str, num_classes: int, where: str) -> CifarSplit:
    missing = [key for key in ('data', label_key) if key not in batch]
    if missing:
        raise CifarFormatError(f'{where}: no {" or ".join(missing)} entry (has {", ".join(sorted(batch))})')
    data = np.asarray(batch['data'])
    labels = np.asarray(batch[label_key], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise CifarFormatError(f'{where}: data is {data.dtype} {data.shape}, expected uint8 (N, 3072)')
    if labels.shape != (data.shape[0],):
        raise CifarFormatError(f'{where}: {labels.size} labels for {data.shape[0]} images')
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise CifarFormatError(f'{where}: labels outside 0..{num_classes - 1}')
    return CifarSplit(data.reshape(-1, 3, 32, 32), labels)


Files = dict[str, tuple[bytes, str]]  # file name -> (contents, where it was read: named in errors)


def _read_folder(folder: Path, names: Sequence[str]) -> Files:
    return {name: ((folder / name).read_bytes(), str(folder / name)) for name in names if (folder / name).is_file()}


def _read_archive(archive: Path, folder: str, names: Sequence[str]) -> Files:
    """The wanted members of the tar.gz in one streaming pass; nothing is extracted, so no path in it can escape."""
    wanted = {f'{folder}/{name}': name for name in names}
    files = {}
    try:
        with tarfile.open(archive, 'r|gz') as tar:
            for member in tar:
                name = wanted.get(member.name.removeprefix('./'))
                if name is not None and member.isfile():
                    files[name] = (tar.extractfile(member).read(), f'{archive}:{folder}/{name}')
    except (tarfile.TarError, OSError, EOFError) as e:
        raise CifarFormatError(f'{archive}: not a readable tar.gz archive ({e})') from e
    return files


def _read_files(data_dir: Path, fmt: CifarFormat) -> tuple[Files, Path]:
    """The data set's files from its extracted folder (in `data_dir`, or `data_dir` itself) or else its archive."""
    for folder in (data_dir / fmt.folder, data_dir):
        if folder.is_dir() and (folder.name == fmt.folder or (folder / fmt.meta).is_file()):
            return _read_folder(folder, fmt.files), folder
    if (data_dir / fmt.archive).is_file():
        return _read_archive(data_dir / fmt.archive, fmt.folder, fmt.files), data_dir / fmt.archive
    others = [f'{other.folder} ({other.title}: --dataset {key})' for key, other in FORMATS.items()
              if other is not fmt and ((data_dir / other.folder).is_dir() or (data_dir / other.archive).is_file())]
    hint = f'; found {others[0]} instead' if others else ''
    raise CifarFormatError(f'no {fmt.title} data in {data_dir}: expected {data_dir / fmt.archive} or '
                           f'{data_dir / fmt.folder}/ with {", ".join(fmt.files)}{hint}')


def read_cifar(data_dir: str | Path, dataset: str) -> CifarData:
    if dataset not in FORMATS:
        raise UsageError(f'unknown data set {dataset!r}; choose from {", ".join(FORMATS)}')
    fmt = FORMATS[dataset]
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise CifarFormatError(f'data folder {data_dir} does not exist')
    files, source = _read_files(data_dir, fmt)
    missing = [name for name in fmt.files if name not in files]
    if missing:
        raise CifarFormatError(f'{source} lacks {", ".join(missing)} '
                               f'(a complete {fmt.title} has {", ".join(fmt.files)})')

    def split(names: Sequence[str]) -> CifarSplit:
        parts = [_decode_batch(_unpickle(*files[name]), fmt.label_key, fmt.num_classes, files[name][1])
                 for name in names]
        return CifarSplit(np.concatenate([p.images for p in parts]), np.concatenate([p.labels for p in parts]))

    meta = _unpickle(*files[fmt.meta])
    names = meta.get(fmt.names_key)
    if names is None or len(names) != fmt.num_classes:
        raise CifarFormatError(f'{files[fmt.meta][1]}: expected {fmt.num_classes} class names under {fmt.names_key!r}')
    return CifarData(split(fmt.train), split(fmt.test), [_text(n) for n in names])


def hold_out(labels: np.ndarray, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, validation): `fraction` of every class, drawn with `seed`, held out for model selection."""
    if not 0 < fraction < 1:
        raise UsageError(f'the validation fraction must lie in (0, 1), got {fraction}')
    rng = np.random.default_rng(seed)
    val = []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        val.append(members[:round(fraction * len(members))])
    val = np.sort(np.concatenate(val))
    train = np.setdiff1d(np.arange(len(labels)), val)
    if not len(val) or not len(train):
        raise UsageError(f'a validation fraction of {fraction} leaves {len(train)} training and {len(val)} '
                         f'validation images of {len(labels)}')
    return train, val


def channel_stats(images: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and standard deviation of uint8 (N, 3, H, W) images, on the [0, 1] scale."""
    counts = np.stack([np.bincount(images[:, c].ravel(), minlength=256) for c in range(images.shape[1])])
    values = np.arange(256) / 255.0
    total = counts.sum(axis=1)
    mean = counts @ values / total
    var = counts @ values ** 2 / total - mean ** 2
    return tuple(mean.tolist()), tuple(np.sqrt(var).tolist())


class CifarDataset(Dataset):
    """Items {'image': uint8 (3, 32, 32), 'label', 'index'} of an in-memory split; the device does the rest."""

    def __init__(self, split: CifarSplit) -> None:
        self.images = torch.from_numpy(np.ascontiguousarray(split.images))
        self.labels = split.labels.tolist()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict:
        return {'image': self.images[index], 'label': self.labels[index], 'index': index}


def bilinear_matrix(out_size: int, in_size: int) -> torch.Tensor:
    """(out_size, in_size) matrix of 1-D bilinear resampling, the weights of F.interpolate(align_corners=False)."""
    src = ((torch.arange(out_size, dtype=torch.float64) + 0.5) * in_size / out_size - 0.5).clamp(min=0)
    low = src.floor().long().clamp(max=in_size - 1)
    high = (low + 1).clamp(max=in_size - 1)
    frac = src - low
    matrix = torch.zeros(out_size, in_size, dtype=torch.float64)
    rows = torch.arange(out_size)
    matrix.index_put_((rows, low), 1 - frac, accumulate=True)
    matrix.index_put_((rows, high), frac, accumulate=True)
    return matrix.float()


class CifarInput:
    """uint8 (B, 3, 32, 32) batch on the device -> normalised model input at `img_size` (bilinear), for training a
    random crop of it zero-padded by `padding` (default `img_size // 8`) and a flip, seeded by `seed`."""

    def __init__(self, img_size: int, mean: Sequence[float], std: Sequence[float], train: bool,
                 hflip: float = 0.5, padding: int | None = None, in_size: int = 32) -> None:
        self.img_size, self.train, self.hflip = img_size, train, hflip
        self.padding = img_size // 8 if padding is None else padding
        self.framed = F.pad(bilinear_matrix(img_size, in_size), (0, 0, self.padding, self.padding))
        std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        self.scale = 1.0 / (255.0 * std)  # uint8 -> [0, 1] -> divided by std, folded into one multiply
        self.shift = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1) / std

    @staticmethod
    def data_config(img_size: int, mean: Sequence[float], std: Sequence[float]) -> dict:
        """This evaluation input in timm's data-config keys, for images of any size: the shorter side resized
        (bilinear) to img_size, the centre square kept (on CIFAR's square images, the whole image), normalised."""
        return {'input_size': (3, img_size, img_size), 'crop_pct': 1.0, 'crop_mode': 'center',
                'interpolation': 'bilinear', 'mean': tuple(mean), 'std': tuple(std)}

    def __call__(self, images: torch.Tensor, seed: int | None = None) -> torch.Tensor:
        B, device = images.shape[0], images.device
        if self.train:
            draws = batch_generator(seed, 'cpu')
            top, left = torch.randint(0, 2 * self.padding + 1, (2, B), generator=draws)
            flip = torch.rand(B, generator=draws) < self.hflip
        else:
            top = left = torch.full((B,), self.padding)
            flip = torch.zeros(B, dtype=torch.bool)
        framed, scale, shift = (on_device(t, device) for t in (self.framed, self.scale, self.shift))
        # the draws in one copy the host does not wait for (pinned, for a GPU)
        drawn = torch.stack([top, left, flip.long()])
        top, left, flip = (drawn.pin_memory() if device.type == 'cuda' else drawn).to(device, non_blocking=True)
        window = torch.arange(self.img_size, device=device)
        rows = framed[top.view(B, 1) + window]  # (B, S, 32)
        cols = framed[left.view(B, 1) + window]
        cols = torch.where(flip.bool().view(B, 1, 1), cols.flip(1), cols)
        x = images.float() * scale
        return (rows.unsqueeze(1) @ x @ cols.transpose(1, 2).unsqueeze(1)).sub_(shift)
