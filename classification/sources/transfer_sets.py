"""The fine-grained transfer sets of the DeiT, CaiT and ViT papers, read in the layouts they are published in
(`Flowers102`, `StanfordCars`, `OxfordPets`, `INaturalist2018`, `INaturalist2019`): each a source whose split `train`
is the set's official training split and `val` its official test split. Classes keep the set's own numbering; a
layout's missing or unreadable file is one line naming it. docs/cifar.md lists each set's files and splits."""
from __future__ import annotations

import json
import os
from abc import abstractmethod
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np

from backbones.common.errors import DataError
from classification.sources.class_folders import FilesIn
from classification.sources.source import ImageSource, Listing, register_source

TRAIN, TEST = 'train', 'val'  # the split names training asks for: the official training and test splits
Splits = dict[str, list[tuple[str, int]]]


class TransferLayout(ImageSource):
    """A published transfer set's layout: the files that mark it and how its splits are read from them."""

    key: ClassVar[str]  # the transfer tool's --dataset
    files: ClassVar[tuple[str, ...]]  # what it reads, relative to the data folder
    markers: ClassVar[int]  # how many of `files` (the first) are its own annotation files, which mark the layout
    layout: ClassVar[str]  # the layout in words, for messages
    precedence = 40  # after the storages of any data set: a transfer set is marked by its annotation files alone

    def claims(self, data_dir: Path) -> bool:
        """Whether `data_dir` holds one of the layout's annotation files (its image folders alone do not say)."""
        return any(self.where(data_dir, name).exists() for name in self.files[:self.markers])

    def marker(self, data_dir: Path) -> Path:
        return next(self.where(data_dir, name) for name in self.files[:self.markers]
                    if self.where(data_dir, name).exists())

    def where(self, data_dir: Path, name: str) -> Path:
        return data_dir / name

    def check(self, data_dir: Path) -> None:
        """A DataError naming the first of the layout's files missing from `data_dir`."""
        for name in self.files:
            if not self.where(data_dir, name).exists():
                raise DataError(f'{self.where(data_dir, name)} is missing: the {self.name} layout is {self.layout}')

    def list_split(self, data_dir: Path, split: str, classes: Sequence[str] | None,
                   classes_from: str) -> Listing | None:
        if not self.claims(data_dir):
            return None
        other = next((layout for layout in LAYOUTS.values()
                      if type(layout) is not type(self) and layout.claims(data_dir)), None)
        if other is not None:  # the first registered read: `--dataset pets` trained and scored on Flowers
            raise DataError(f'{data_dir} holds the annotation files of {self.name} ({self.marker(data_dir)}) and of '
                            f'{other.name} ({other.marker(data_dir)}): one data set a folder')
        self.check(data_dir)
        if split not in (TRAIN, TEST):
            raise DataError(f'{data_dir}: the {self.name} layout has the splits {TRAIN} (its training images) and '
                            f'{TEST} (its test images), not {split}')
        found, splits = self.read(data_dir)
        self.check_listed_once(data_dir, splits)
        if classes is not None and list(classes) != found:
            raise DataError(f'{data_dir} ({self.name}): its {len(found)} classes are not those of {classes_from} '
                            f'({len(classes)})')
        self.check_images_present(data_dir, splits[split])
        return Listing(found, splits[split], FilesIn(data_dir))

    @abstractmethod
    def read(self, data_dir: Path) -> tuple[list[str], Splits]:
        """The classes (in the set's numbering) and both splits' (image name, label)."""

    def check_images_present(self, data_dir: Path, samples: list[tuple[str, int]]) -> None:
        """Every image the split lists is a file, checked before any work (not found missing after an epoch)."""
        by_folder: dict[str, list[str]] = defaultdict(list)
        for name, _ in samples:
            folder, _, file = name.rpartition('/')
            by_folder[folder].append(file)
        for folder, files in by_folder.items():
            try:
                held = {entry.name for entry in os.scandir(data_dir / folder) if not entry.is_dir()}
            except OSError:
                held = set()
            absent = [file for file in files if file not in held]
            if absent:
                raise DataError(f'{data_dir / folder / absent[0]} is missing ({len(absent)} of the {len(files)} images '
                                f'the {self.name} annotation files list in {data_dir / folder}): the layout is '
                                f'{self.layout}')

    def check_listed_once(self, data_dir: Path, splits: Splits) -> None:
        """Each image file in one split once, however its path is spelt (a test image trained on inflates the top-1)."""
        seen: dict[str, tuple[str, str]] = {}
        for split, what in ((TRAIN, 'training'), (TEST, 'test')):
            for name, _ in splits[split]:
                file = os.path.normpath(os.path.join(data_dir, name))
                if file in seen:
                    first, where = seen[file]
                    twice = f'twice in the {what} split' if where == what else f'in the {where} and the test split'
                    spelt = '' if first == name else f' (as {first} and {name})'
                    raise DataError(f'{data_dir} ({self.name}): the image {name} is listed {twice}{spelt} (the layout '
                                    f'is {self.layout}, each image in one split)')
                seen[file] = name, what


def load_mat(path: Path, *keys: str) -> list[np.ndarray]:
    """The arrays `keys` of a MATLAB file (squeezed), each named with the file when it is missing."""
    from scipy.io import loadmat  # only these layouts need scipy
    from scipy.io.matlab import MatReadError
    try:
        content = loadmat(path, squeeze_me=True)
    except (OSError, ValueError, TypeError, IndexError, MatReadError) as e:  # a truncated file: IndexError
        raise DataError(f'{path}: not a readable MATLAB file ({e or type(e).__name__}): copy it again') from e
    missing = [key for key in keys if key not in content]
    if missing:
        raise DataError(f'{path}: no {", ".join(missing)} (holds {", ".join(k for k in content if k[0] != "_")})')
    return [np.atleast_1d(content[key]) for key in keys]


def numbered(values: np.ndarray, where: Path, what: str, count: int | None = None) -> np.ndarray:
    """`values` as integers 1..count (from 1), or a DataError naming the file and the first entry at fault."""
    values = np.asarray(values).ravel()
    try:  # a MATLAB struct's field is an object array of numbers
        whole = values.dtype.kind in 'iu' or np.all(np.mod(values.astype(np.float64), 1) == 0)
    except (TypeError, ValueError):  # text
        whole = False
    if values.dtype.kind in 'bSUV' or not whole:
        raise DataError(f'{where}: {what} are not whole numbers (found {values[:3].tolist()} ...)')
    values = values.astype(np.int64)
    outside = np.flatnonzero((values < 1) | (values > (count or np.iinfo(np.int64).max)))
    if outside.size:
        bounds = f'1..{count}' if count else 'whole numbers from 1'
        raise DataError(f'{where}: {what} must be {bounds}; entry {outside[0] + 1} is {values[outside[0]]} '
                        f'({outside.size} such)')
    return values


@register_source
class Flowers102(TransferLayout):
    """Oxford Flowers-102: `jpg/image_NNNNN.jpg`, `imagelabels.mat` (`labels`, 1..102, one per image number) and
    `setid.mat` (`trnid`, `valid`, `tstid`: image numbers); training is `trnid` + `valid` (2,040 images), as DeiT's."""
    name, key = 'Oxford Flowers-102', 'flowers102'
    files, markers = ('imagelabels.mat', 'setid.mat', 'jpg'), 2
    layout = 'jpg/image_NNNNN.jpg, imagelabels.mat (labels) and setid.mat (trnid, valid, tstid)'

    def read(self, data_dir: Path) -> tuple[list[str], Splits]:
        labels_file, ids_file = data_dir / 'imagelabels.mat', data_dir / 'setid.mat'
        labels, = load_mat(labels_file, 'labels')
        labels = numbered(labels, labels_file, 'labels')
        count = int(labels.max(initial=0))
        ids = dict(zip(('trnid', 'valid', 'tstid'), load_mat(ids_file, 'trnid', 'valid', 'tstid')))
        ids = {key: numbered(value, ids_file, f'image numbers ({key})', len(labels)) for key, value in ids.items()}

        def split(numbers: np.ndarray) -> list[tuple[str, int]]:
            return [(f'jpg/image_{n:05d}.jpg', int(labels[n - 1]) - 1) for n in numbers]

        return ([f'{c:03d}' for c in range(1, count + 1)],
                {TRAIN: split(np.concatenate([ids['trnid'], ids['valid']])), TEST: split(ids['tstid'])})


@register_source
class StanfordCars(TransferLayout):
    """Stanford Cars: `cars_train/`, `cars_test/` and the devkit's `cars_meta.mat` (`class_names`),
    `cars_train_annos.mat` and `cars_test_annos_withlabels.mat` (`annotations`: `fname`, `class` 1..196)."""
    name, key = 'Stanford Cars', 'cars'
    META, TRAIN_ANNOS, TEST_ANNOS = 'devkit/cars_meta.mat', 'devkit/cars_train_annos.mat', \
        'cars_test_annos_withlabels.mat'
    files, markers = (META, TRAIN_ANNOS, TEST_ANNOS, 'cars_train', 'cars_test'), 3
    layout = ('cars_train/, cars_test/, devkit/cars_meta.mat, devkit/cars_train_annos.mat and '
              'cars_test_annos_withlabels.mat (in devkit/ or the data folder)')

    def where(self, data_dir: Path, name: str) -> Path:
        if name == self.TEST_ANNOS and not (data_dir / name).exists():  # shipped apart; often put in devkit/
            return data_dir / 'devkit' / name
        return data_dir / name

    def read(self, data_dir: Path) -> tuple[list[str], Splits]:
        meta = data_dir / self.META
        names, = load_mat(meta, 'class_names')
        classes = [str(n) for n in names]
        if len(set(classes)) != len(classes):
            raise DataError(f'{meta}: class_names repeats a name')

        def split(annos: str, folder: str) -> list[tuple[str, int]]:
            path = self.where(data_dir, annos)
            table, = load_mat(path, 'annotations')
            if table.dtype.names is None or not {'fname', 'class'} <= set(table.dtype.names):
                raise DataError(f'{path}: annotations lack fname and class (have {table.dtype.names})')
            labels = numbered(table['class'], path, 'class', len(classes))
            return [(f'{folder}/{fname}', int(label) - 1) for fname, label in zip(table['fname'], labels)]

        return classes, {TRAIN: split(self.TRAIN_ANNOS, 'cars_train'), TEST: split(self.TEST_ANNOS, 'cars_test')}


@register_source
class OxfordPets(TransferLayout):
    """Oxford-IIIT Pets: `images/NAME.jpg`, `annotations/trainval.txt` and `annotations/test.txt`, lines
    `Abyssinian_100 1 1 1` (image name, class 1..37, species, breed); a class is named by its images' name stem."""
    name, key = 'Oxford-IIIT Pets', 'pets'
    files, markers = ('annotations/trainval.txt', 'annotations/test.txt', 'images'), 2
    layout = 'images/NAME.jpg, annotations/trainval.txt and annotations/test.txt (lines "Abyssinian_100 1 1 1")'

    def read(self, data_dir: Path) -> tuple[list[str], Splits]:
        names: dict[int, str] = {}  # class number -> the name stem of its images
        splits = {}
        for split, file in ((TRAIN, 'annotations/trainval.txt'), (TEST, 'annotations/test.txt')):
            splits[split] = []
            try:
                text = (data_dir / file).read_text()
            except (OSError, UnicodeDecodeError) as e:
                raise DataError(f'{data_dir / file}: not a readable text file ({e}): the layout is {self.layout}') \
                    from e
            for number, line in enumerate(text.splitlines(), 1):
                if not line.strip() or line.startswith('#'):
                    continue
                fields = line.split()
                if len(fields) < 2 or not fields[1].isdigit() or int(fields[1]) < 1:
                    raise DataError(f'{data_dir / file}, line {number}: expected "NAME CLASS SPECIES BREED" with '
                                    f'CLASS from 1, found {line!r}')
                image, label = fields[0], int(fields[1])
                stem = image.rsplit('_', 1)[0]
                if names.setdefault(label, stem) != stem:
                    raise DataError(f'{data_dir / file}, line {number}: {image} is in class {label}, whose images '
                                    f'are named {names[label]}_N')
                splits[split].append((f'images/{image}.jpg', label - 1))
        count = max(names, default=0)
        return [names.get(c, f'class {c}') for c in range(1, count + 1)], splits


class INaturalist(TransferLayout):
    """iNaturalist 2018 / 2019: `train2018.json` / `val2018.json` (or 2019's), COCO-like: `images` (`id`, `file_name`
    under the data folder), `annotations` (`image_id`, `category_id`), `categories` (`id`, `name`)."""

    def read(self, data_dir: Path) -> tuple[list[str], Splits]:
        train, test = (self.annotations(data_dir / name) for name in self.files)
        names = self.category_names(train, data_dir / self.files[0])
        if test['categories'] and self.category_names(test, data_dir / self.files[1]) != names:
            raise DataError(f'{data_dir / self.files[1]}: its categories are not those of {self.files[0]} (the same '
                            f'ids with the same names): its labels would name other classes')
        ids = sorted(names)
        unique = len(set(names.values())) == len(names)
        position = {category: i for i, category in enumerate(ids)}
        classes = [names[c] if unique else str(c) for c in ids]
        return classes, {TRAIN: self.samples(train, position, data_dir / self.files[0]),
                         TEST: self.samples(test, position, data_dir / self.files[1])}

    RECORDS: ClassVar[dict[str, tuple[str, ...]]] = {
        'images': ('id', 'file_name'), 'annotations': ('image_id', 'category_id'), 'categories': ('id',)}

    @classmethod
    def annotations(cls, path: Path) -> dict:
        """The file's content: lists of the records `RECORDS` names, each with its fields."""
        try:
            content = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise DataError(f'{path}: not a readable JSON file ({e})') from e
        missing = [key for key in cls.RECORDS if not isinstance(content, dict) or key not in content]
        if missing:
            raise DataError(f'{path}: no {", ".join(missing)} (an iNaturalist annotation file holds images, '
                            f'annotations and categories)')
        for key, fields in cls.RECORDS.items():
            if not isinstance(content[key], list):
                raise DataError(f'{path}: {key} is not a list of records')
            for number, record in enumerate(content[key]):
                if not isinstance(record, dict) or any(field not in record for field in fields):
                    raise DataError(f'{path}: {key}[{number}] is not a record with {" and ".join(fields)} '
                                    f'({str(record)[:60]})')
                odd = next((field for field in fields if field.endswith('id')
                            and (isinstance(record[field], bool) or not isinstance(record[field], (int, str)))), None)
                if odd is not None:
                    raise DataError(f'{path}: {key}[{number}]\'s {odd} is neither a number nor a text '
                                    f'({str(record)[:60]})')
        for ids in cls.ID_SPACES:
            cls.check_one_id_type(content, ids, path)
        return content

    # the fields holding one kind of id: 3 and "3" would be two keys here, and one in a reader that converts them
    ID_SPACES: ClassVar[tuple[tuple[tuple[str, str], ...], ...]] = (
        (('images', 'id'), ('annotations', 'image_id')), (('categories', 'id'), ('annotations', 'category_id')))

    @staticmethod
    def check_one_id_type(content: dict, fields: tuple[tuple[str, str], ...], path: Path) -> None:
        """Every id of one kind (`fields`) is a number, or every one a text: the first entry of each type named."""
        first_of: dict[type, str] = {}
        for key, field in fields:
            for number, record in enumerate(content[key]):
                first_of.setdefault(type(record[field]), f'{key}[{number}].{field} = {record[field]!r}')
        if len(first_of) > 1:
            raise DataError(f'{path}: ids of two types ({" and ".join(first_of.values())}): give every such id as a '
                            f'number, or every one as a text')

    @staticmethod
    def category_names(content: dict, path: Path) -> dict[int, str]:
        """Each category id's name (its id where it has none); an id given twice is an error naming the file."""
        names: dict[int, str] = {}
        for category in content['categories']:
            if category['id'] in names:
                raise DataError(f'{path}: the category id {category["id"]} is given twice')
            names[category['id']] = str(category.get('name', category['id']))
        return names

    @staticmethod
    def samples(content: dict, position: dict[int, int], path: Path) -> list[tuple[str, int]]:
        """Each image's (file name, label): images are keyed by id, so an id given twice (one image's category
        given to another) and an annotation of an image the file does not list are errors naming both entries."""
        file_of: dict[int, str] = {}
        for image in content['images']:
            first = file_of.setdefault(image['id'], image['file_name'])
            if first is not image['file_name']:
                raise DataError(f'{path}: the image id {image["id"]} is given twice ({first} and '
                                f'{image["file_name"]}): each image needs an id of its own')
        category = {}
        for number, a in enumerate(content['annotations']):
            if a['image_id'] not in file_of:
                raise DataError(f'{path}: annotations[{number}] (id {a.get("id")}, category {a["category_id"]}) '
                                f'names the image {a["image_id"]!r}, which the file does not list')
            if category.setdefault(a['image_id'], a['category_id']) != a['category_id']:
                raise DataError(f'{path}: image {a["image_id"]} has two categories ({category[a["image_id"]]} and '
                                f'{a["category_id"]}): one label per image')
        samples = []
        for image in content['images']:
            if image['id'] not in category:
                raise DataError(f'{path}: image {image["id"]} ({image["file_name"]}) has no annotation')
            if category[image['id']] not in position:
                raise DataError(f'{path}: image {image["id"]!r} has the category {category[image["id"]]!r}, which the '
                                f'training file does not list')
            samples.append((image['file_name'], position[category[image['id']]]))
        return samples


@register_source
class INaturalist2018(INaturalist):
    name, key = 'iNaturalist 2018', 'inat2018'
    files, markers = ('train2018.json', 'val2018.json'), 2
    layout = 'train2018.json and val2018.json (images, annotations, categories; image paths under the data folder)'


@register_source
class INaturalist2019(INaturalist):
    name, key = 'iNaturalist 2019', 'inat2019'
    files, markers = ('train2019.json', 'val2019.json'), 2
    layout = 'train2019.json and val2019.json (images, annotations, categories; image paths under the data folder)'


LAYOUTS: dict[str, TransferLayout] = {layout.key: layout for layout in (
    Flowers102(), StanfordCars(), OxfordPets(), INaturalist2018(), INaturalist2019())}
