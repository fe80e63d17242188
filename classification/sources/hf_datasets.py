"""A split saved by Hugging Face `datasets` (`save_to_disk`, or the Hub's parquet files): an image column (the `Image`
feature) and a label column (`ClassLabel`), read map-style, each image by its row, as timm's `hfds/` reader reads
one (`HuggingFaceDatasets`). An optional extra (`pip install '.[hf]'`): `datasets` is imported when such a split is
read. An image is named `SPLIT/ROW` (token-label stores key it so); the classes are the ClassLabel's names in its
order. docs/imagenet.md ("Hugging Face image data sets on disk") gives every rule."""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from backbones.common.errors import DataError
from backbones.common.images import ImageReadError
from backbones.common.log import logger
from backbones.common.trackers import import_extra
from classification.sources.source import ImageSource, Listing, register_source, split_names
from classification.sources.tars import MemberFile

IMAGE_COLUMN, LABEL_COLUMN = 'image', 'label'  # timm's input_key and target_key defaults
PARQUET_FOLDERS = ('.', 'data')  # where the Hub keeps a data set's parquet files, below its folder
NUMBERED = re.compile(r'-(\d+)-of-(\d+)\.parquet$')  # the Hub's file names: SPLIT-00000-of-00294.parquet


@dataclass(frozen=True)
class SavedSplit:
    """A split saved by `datasets`, as arrow files (`folder`) or `parquet` files; `name` as saved."""

    name: str
    folder: Path | None = None
    parquet: tuple[Path, ...] = ()

    @property
    def read_from(self) -> Path:
        return self.folder if self.folder is not None else self.parquet[0].parent


def saved_folder(folder: Path) -> SavedSplit | None:
    """The `save_to_disk` folder of one split (None without one); stray arrow files or dataset_info.json are named."""
    if (folder / 'state.json').is_file():
        return SavedSplit(folder.name, folder=folder)
    if folder.is_dir() and ((folder / 'dataset_info.json').is_file() or any(folder.glob('*.arrow'))):
        raise DataError(f'{folder} holds arrow files or dataset_info.json but no state.json: not a data set saved '
                        f'with save_to_disk (save it again, or read it with Dataset.from_file and save_to_disk)')
    return None


def find_saved_split(data_dir: Path, split: str) -> SavedSplit | None:
    """The split as `datasets` saved it under `data_dir`; None where nothing there is `datasets`', else a DataError."""
    if not data_dir.is_dir():
        return None
    names = split_names(split)
    if (data_dir / 'state.json').is_file():
        raise DataError(f'{data_dir} is one Dataset saved with save_to_disk, not its splits: save a DatasetDict '
                        f'(DatasetDict({{"train": ..., "val": ...}}).save_to_disk), and give its folder')
    saved = data_dir / 'dataset_dict.json'
    if saved.is_file():
        splits = dict_splits(saved)
        name = next((name for name in names if name in splits), None)
        if name is None:
            raise DataError(f'{saved}: a DatasetDict of the splits {", ".join(splits)}, none of them '
                            f'{" or ".join(names)}')
        found = saved_folder(data_dir / name)
        if found is None:
            raise DataError(f'{saved} names the split {name}, but {data_dir / name} holds no saved split '
                            f'(state.json): copy the whole folder save_to_disk wrote')
        return warn_unread_parquet(data_dir, names, found)
    for name in names:
        if (found := saved_folder(data_dir / name)) is not None:
            return warn_unread_parquet(data_dir, names, found)
    return parquet_split(data_dir, names)


def warn_unread_parquet(data_dir: Path, names: Sequence[str], found: SavedSplit) -> SavedSplit:
    """`found`, after a warning naming the split's parquet files beside it, which are not read."""
    unread = sorted(path for folder in PARQUET_FOLDERS for name in names
                    for path in (data_dir / folder).glob(f'{name}-*.parquet'))
    if unread:
        logger.warning(f'warning: {unread[0]} ({len(unread)} parquet file(s) of the split) is not read: the split '
                       f'{found.name} is read from {found.read_from}, saved with save_to_disk')
    return found


def dict_splits(saved: Path) -> list[str]:
    try:
        splits = json.loads(saved.read_text())['splits']
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f'{saved} is not a DatasetDict\'s dataset_dict.json ({type(e).__name__}: {e})') from None
    if not isinstance(splits, list):
        raise DataError(f'{saved} is not a DatasetDict\'s dataset_dict.json (its splits are not a list)')
    return [str(name) for name in splits]


def parquet_split(data_dir: Path, names: Sequence[str]) -> SavedSplit | None:
    """The split's parquet files (`SPLIT-*.parquet` in the data folder or its `data/`). Where there are none and no
    folder of the split either, a folder of other splits' parquet files is named with the splits it holds."""
    for folder in (data_dir / sub for sub in PARQUET_FOLDERS):
        for name in names:
            files = tuple(sorted(folder.glob(f'{name}-*.parquet')))
            if files:
                check_numbering(files, name)
                return SavedSplit(name, parquet=files)
    if any((data_dir / name).exists() for name in names):
        return None  # the split stored another way (class folders, a tar): theirs to read
    for folder in (data_dir / sub for sub in PARQUET_FOLDERS):
        held = sorted({path.name.split('-')[0] for path in folder.glob('*-*.parquet')})
        if held:
            raise DataError(f'{folder} holds parquet files of the splits {", ".join(held)} (SPLIT-*.parquet), none '
                            f'of {" or ".join(names)}')
    return None


def check_numbering(files: Sequence[Path], split: str) -> None:
    """Parquet files numbered as the Hub numbers them are all there, once (not part of a download, nor twice)."""
    numbered = {path: NUMBERED.search(path.name) for path in files}
    if not any(numbered.values()):
        return  # named otherwise: nothing says how many there are
    totals = sorted({int(match[2]) for match in numbered.values() if match})
    held = sorted(int(match[1]) for match in numbered.values() if match)
    stray = next((path for path, match in numbered.items() if not match or int(match[1]) >= totals[-1]), None)
    missing = sorted(set(range(totals[-1])) - set(held))
    if len(totals) > 1 or stray is not None or missing or len(held) != len(set(held)):
        problem = (f'{stray.name} is not one of them' if stray is not None else
                   f'numbered of {" and of ".join(map(str, totals))}' if len(totals) > 1 else
                   f'{len(missing)} missing, e.g. number {missing[0]}' if missing else 'a number twice')
        raise DataError(f'{files[0].parent}: the split {split} is in {totals[-1]} parquet files '
                        f'({files[0].name} ...), {len(files)} there: {problem} (download the split\'s files again)')


# ------------------------------------------------------------------------------------------------------- reading

def hf_datasets(where: Path) -> ModuleType:
    """`datasets`, imported for reading `where` (absent: one line naming the extra), its progress bars off."""
    datasets = import_extra('datasets', f'reading {where} (a Hugging Face data set)', 'hf')
    datasets.disable_progress_bars()
    return datasets


def load_split(found: SavedSplit, datasets: ModuleType):
    """The split as a `datasets.Dataset`, memory-mapped; a file that cannot be read is an error naming it."""
    check_parquet_files(found.parquet)
    try:
        if found.folder is not None:
            return datasets.load_from_disk(str(found.folder))
        return datasets.load_dataset('parquet', data_files={found.name: [str(p) for p in found.parquet]},
                                     split=found.name)
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise DataError(f'{found.read_from}: cannot read the split {found.name} ({type(e).__name__}: {e})') from None


def check_parquet_files(files: Sequence[Path]) -> None:
    """Each parquet file's footer (its schema and row groups) reads: a damaged file is named."""
    import pyarrow.parquet  # installed with datasets
    for path in files:
        try:
            pyarrow.parquet.read_metadata(path)
        except (OSError, ValueError) as e:
            raise DataError(f'{path} is not a readable parquet file ({type(e).__name__}: {e}): copy it again'
                            ) from None


def pick_column(features: dict, wanted: str, kind: type, what: str, where: str) -> str:
    """The column `wanted`, else the only column of the feature `kind`; neither is an error naming the columns."""
    if wanted in features:
        return wanted
    of_kind = [name for name, feature in features.items() if isinstance(feature, kind)]
    if len(of_kind) == 1:
        logger.info(f'{where}: no column {wanted!r}; the {what} are its only {kind.__name__} column, {of_kind[0]!r}')
        return of_kind[0]
    columns = ', '.join(f'{name} ({type(feature).__name__})' for name, feature in features.items())
    many = f', and {len(of_kind)} {kind.__name__} columns' if of_kind else f', and no {kind.__name__} column'
    raise DataError(f'{where} has no column {wanted!r} of the {what}{many}: its columns are {columns} (name the one '
                    f'to read {wanted!r}: dataset.rename_column(NAME, {wanted!r}), and save it again)')


def label_names(feature, column: str, where: str, datasets: ModuleType) -> list[str] | None:
    """A ClassLabel's names; None for plain ints (`numbered_classes`); any other feature is an error."""
    if isinstance(feature, datasets.ClassLabel):
        return list(feature.names)
    if isinstance(feature, datasets.Value) and feature.dtype.startswith(('int', 'uint')):
        return None
    raise DataError(f'{where}: the label column {column!r} is {feature!r}, not a ClassLabel: cast it '
                    f'(dataset.class_encode_column({column!r}) for class names) and save it again')


def numbered_classes(labels: np.ndarray, feature, column: str, where: str) -> list[str]:
    """Labels of plain ints are the classes 0 .. the largest, named by their number (with a warning)."""
    count = int(labels.max()) + 1
    logger.warning(f'warning: {where}: the label column {column!r} is {feature!r}, ints without class names (not a '
                   f'ClassLabel): its ints are the classes, named 0 .. {count - 1}; cast it to a ClassLabel to name '
                   f'them')
    return [str(label) for label in range(count)]


def split_labels(dataset, column: str, where: str) -> np.ndarray:
    """Every row's label, read without the images; a row without one is an error naming it."""
    labels = dataset.with_format('arrow')[column]
    if labels.null_count:
        row = int(np.flatnonzero(labels.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f'{where}: row {row} has no label ({labels.null_count} rows have none)')
    return labels.to_numpy().astype(np.int64)


def relabelled(labels: np.ndarray, names: list[str], classes: Sequence[str] | None, classes_from: str,
               where: str) -> tuple[list[str], np.ndarray]:
    """The classes and each row's label in them: the data set's own, or the given classes (from `classes_from`)
    matched by name. A label outside the names and a name outside the given classes are errors."""
    bad = np.flatnonzero((labels < 0) | (labels >= len(names)))
    if len(bad):
        row = int(bad[0])
        raise DataError(f'{where}: row {row} has the label {labels[row]}, outside the {len(names)} classes '
                        f'({len(bad)} such rows; a split without labels, as a test split, is not read)')
    if classes is None or list(classes) == names:
        return names, labels
    unknown = [name for name in names if name not in classes]
    if unknown:
        raise DataError(f'{where} has {len(unknown)} class(es) that {classes_from} does not: {", ".join(unknown[:5])}')
    position = {name: i for i, name in enumerate(classes)}
    return list(classes), np.array([position[name] for name in names], np.int64)[labels]


class ArrowRows:
    """The images of a listing by their rows of the split (memory-mapped arrow), each one's bytes as a file object."""

    def __init__(self, dataset, column: str, where: str, split: str, rows: np.ndarray) -> None:
        self.dataset, self.column, self.where, self.split, self.rows = dataset, column, where, split, rows

    def open(self, index: int, name: str) -> MemberFile:
        row = int(self.rows[index])
        what = f'{self.where}: split {self.split}, row {row}'
        image = self.dataset[row][self.column]
        if image and image.get('bytes'):
            return MemberFile(image['bytes'], what)
        if not image or not image.get('path'):
            raise ImageReadError(f'cannot read image {what}: the row holds no image')
        try:
            return MemberFile(Path(image['path']).read_bytes(), what)
        except OSError as e:
            raise ImageReadError(f'cannot read image {what}: its file {image["path"]}: {e.strerror or e}') from e

    def take(self, positions: Sequence[int] | np.ndarray) -> ArrowRows:
        return ArrowRows(self.dataset, self.column, self.where, self.split,
                         self.rows[np.asarray(positions, np.int64)])


def hf_listing(data_dir: Path, found: SavedSplit, classes: Sequence[str] | None, classes_from: str) -> Listing:
    """The saved split's classes, images (`SPLIT/ROW`) and their reader."""
    datasets = hf_datasets(found.read_from)
    dataset = load_split(found, datasets)
    where = str(found.read_from)
    features = dict(dataset.features)
    image = pick_column(features, IMAGE_COLUMN, datasets.Image, 'images', where)
    label = pick_column(features, LABEL_COLUMN, datasets.ClassLabel, 'labels', where)
    names = label_names(features[label], label, where, datasets)
    labels = split_labels(dataset, label, where)
    if not len(labels):
        raise DataError(f'{where}: the split {found.name} has no rows')
    if names is None:
        names = numbered_classes(labels, features[label], label, where)
    found_classes, labels = relabelled(labels, names, classes, classes_from, where)
    samples = [(f'{found.name}/{row}', label) for row, label in enumerate(labels.tolist())]
    images = dataset.select_columns([image]).cast_column(image, datasets.Image(decode=False))
    return Listing(found_classes, samples, ArrowRows(images, image, str(data_dir), found.name,
                                                     np.arange(len(labels), dtype=np.int64)), found.read_from)


@register_source
class HuggingFaceDatasets(ImageSource):
    name = 'Hugging Face datasets'
    precedence = 30  # after the tars: a split folder of tars beside other splits' parquet files is the tars'

    def list_split(self, data_dir: Path, split: str, classes: Sequence[str] | None,
                   classes_from: str) -> Listing | None:
        found = find_saved_split(data_dir, split)
        if found is None:
            return None
        if found.name != split:
            logger.info(f'{data_dir}: the split {split} is read from the saved split {found.name}')
        return hf_listing(data_dir, found, classes, classes_from)
