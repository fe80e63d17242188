"""Tiny CIFAR-10/100 data sets in the real on-disk format: Python-2-style pickles (bytes keys) in the
`cifar-10-batches-py` / `cifar-100-python` folders, or packed as the official tar.gz archives."""
from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path

import numpy as np

from classification.data.cifar import FORMATS


def class_images(labels: np.ndarray, seed: int) -> np.ndarray:
    """uint8 (N, 32, 32, 3) images, H x W x RGB: noise around a colour and a stripe that depend on the class."""
    rng = np.random.default_rng(seed)
    n = len(labels)
    colour = np.stack([(labels * 37) % 256, (labels * 91 + 60) % 256, (labels * 53 + 120) % 256], axis=1)
    images = colour[:, None, None, :] + rng.normal(0, 25, (n, 32, 32, 3))
    for i, label in enumerate(labels):
        images[i, (label * 3) % 32:(label * 3) % 32 + 4] = 255
    return np.clip(images, 0, 255).astype(np.uint8)


def to_rows(images: np.ndarray) -> np.ndarray:
    """(N, 32, 32, 3) -> (N, 3072): the red plane, then green, then blue, each row-major (the CIFAR layout)."""
    return images.transpose(0, 3, 1, 2).reshape(len(images), -1)


def _pickle(obj: dict) -> bytes:
    buffer = io.BytesIO()
    pickle.dump(obj, buffer, protocol=2)
    return buffer.getvalue()


def cifar_files(dataset: str, splits: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, bytes]:
    """The data set's files (name -> pickle bytes) from {'train': (images, labels), 'test': (images, labels)}."""
    fmt = FORMATS[dataset]
    files = {}

    def batch(images, labels, name):
        entry = {b'batch_label': name.encode(), b'data': to_rows(images),
                 b'filenames': [f'img_{i}.png'.encode() for i in range(len(labels))]}
        if dataset == 'cifar100':
            entry[b'fine_labels'] = [int(v) for v in labels]
            entry[b'coarse_labels'] = [int(v) // 5 for v in labels]  # 20 superclasses: must not be read
        else:
            entry[b'labels'] = [int(v) for v in labels]
        return _pickle(entry)

    train_images, train_labels = splits['train']
    parts = np.array_split(np.arange(len(train_labels)), len(fmt.train))
    for name, part in zip(fmt.train, parts):
        files[name] = batch(train_images[part], train_labels[part], name)
    files[fmt.test[0]] = batch(*splits['test'], fmt.test[0])
    names = [f'class_{i}'.encode() for i in range(fmt.num_classes)]
    if dataset == 'cifar100':
        files[fmt.meta] = _pickle({b'fine_label_names': names,
                                   b'coarse_label_names': [f'super_{i}'.encode() for i in range(20)]})
    else:
        files[fmt.meta] = _pickle({b'num_cases_per_batch': len(parts[0]), b'label_names': names, b'num_vis': 3072})
    return files


def write_cifar(root: Path, dataset: str, splits: dict[str, tuple[np.ndarray, np.ndarray]],
                archive: bool) -> Path:
    """Write the data set under `root` as the official archive or its extracted folder; returns `root`."""
    fmt = FORMATS[dataset]
    root.mkdir(parents=True, exist_ok=True)
    files = cifar_files(dataset, splits)
    if archive:
        with tarfile.open(root / fmt.archive, 'w:gz') as tar:
            for name, raw in files.items():
                info = tarfile.TarInfo(f'{fmt.folder}/{name}')
                info.size = len(raw)
                tar.addfile(info, io.BytesIO(raw))
    else:
        folder = root / fmt.folder
        folder.mkdir(exist_ok=True)
        for name, raw in files.items():
            (folder / name).write_bytes(raw)
    return root


def tiny_cifar(root: Path, dataset: str, per_class_train: int, per_class_test: int, archive: bool = True,
               num_classes: int | None = None, seed: int = 0) -> tuple[Path, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """A class-balanced tiny data set (the first `num_classes` classes only, if given) and its arrays."""
    classes = num_classes or FORMATS[dataset].num_classes
    splits = {}
    for k, (split, per_class) in enumerate((('train', per_class_train), ('test', per_class_test))):
        labels = np.random.default_rng(seed + k).permutation(np.repeat(np.arange(classes), per_class))
        splits[split] = (class_images(labels, seed + 10 + k), labels)
    return write_cifar(root, dataset, splits, archive), splits
