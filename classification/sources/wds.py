"""timm's and the Hub's webdataset shards read as published (timm's `--dataset wds/`, `timm/imagenet-1k-wds`;
`WebDatasetShards`, asked before the tars): tars of images `KEY.EXT` with `KEY.cls` and/or `KEY.json` (its `label`).
A split is found by `D/_info.json` (or `.yaml`), a folder D/SPLIT/ of shards, or D's tars named as timm's and the
Hub's are (`find_split`). An image is named `SHARD.tar/KEY.EXT` relative to D; the shards are indexed once as the
tar reader indexes its tars, and each image is one pread, map-style. docs/imagenet.md ("Webdataset shards as timm
and the Hub publish them") gives every rule."""
from __future__ import annotations

import contextlib
import json
import re
import tarfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from backbones.common.errors import DataError
from backbones.common.images import TAR_SUFFIX, is_split_tar, split_entries
from backbones.common.log import logger
from classification.sources.path_list import PathList
from classification.sources.source import ImageSource, Listing, register_source, split_names
from classification.sources.tars import SIDECAR_SUFFIXES, TarMembers, TarReader, TarSplit, tar_index

INFO_FILES = ('_info.json', '_info.yaml')  # timm's data set information, beside the shards
SHARD_NUMBER = re.compile(r'-(\d+)\.tar$')  # a shard's number in its name: imagenet1k-train-0042.tar
PEEK = 8  # members of a split folder's first tar read to tell shards from per-class tars


@dataclass(frozen=True)
class ShardSplit:
    """A split's shards with the info file's record of it (`entry`), the whole file and its path."""

    name: str
    shards: list[Path]
    read_from: Path
    info_file: Path | None = None
    info: dict = field(default_factory=dict)
    entry: dict = field(default_factory=dict)


@dataclass
class Sample:
    """What a shard says of one key: its image's position in the index, its `.cls` and its JSON's label and name."""

    position: int
    cls: int | None = None
    label: int | None = None
    name: str | None = None
    alt: object = None  # its JSON's alt_label field, where the info file names one


# ------------------------------------------------------------------------------------------ finding a split's shards

def read_info(data_dir: Path) -> tuple[Path, dict] | None:
    for path in (data_dir / name for name in INFO_FILES):
        if not path.is_file():
            continue
        try:
            text = path.read_text()
            info = json.loads(text) if path.suffix == '.json' else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError) as e:
            raise DataError(f'{path} is not readable ({" ".join(str(e).split())})') from None
        if not isinstance(info, dict) or not isinstance(info.get('splits', {}), dict):
            raise DataError(f'{path} is not a data set information file (a mapping with "splits": name -> record)')
        check_info_fields(path, {'"classes"': (info.get('classes'), 'a list of class names'),
                                 '"num_classes"': (info.get('num_classes'), 'a positive integer')})
        return path, info
    return None


def info_split(data_dir: Path, info_file: Path, info: dict, split: str) -> ShardSplit | None:
    """The split as the info file names it, its shards there; None where it does not name it."""
    name = next((name for name in split_names(split) if name in info.get('splits', {})), None)
    if name is None:
        return None
    entry = info['splits'][name]
    filenames = entry.get('filenames') if isinstance(entry, dict) else None
    if not is_list_of(filenames, str) or not filenames:
        raise DataError(f'{info_file}: the split {name} names no shards (a list "filenames" of file names)')
    twice = next((filename for filename, times in Counter(filenames).items() if times > 1), None)
    if twice is not None:
        raise DataError(f'{info_file}: the split {name} names the shard {twice} twice (its images would be read '
                        f'twice)')
    check_info_fields(info_file, {
        f'the split {name}\'s "shard_lengths"': (entry.get('shard_lengths'), 'a list of integers'),
        f'the split {name}\'s "num_samples"': (entry.get('num_samples'), 'an integer')})
    shards = [data_dir / filename for filename in filenames]
    missing = [shard for shard in shards if not shard.is_file()]
    if missing:
        raise DataError(f'{info_file}: the shard {missing[0]} of the split {name} is not there ({len(missing)} of its '
                        f'{len(shards)} shards missing)')
    warn_unlisted(info_file, name, shards)
    return ShardSplit(name, shards, info_file, info_file, info, entry)


def warn_unlisted(info_file: Path, name: str, listed: list[Path]) -> None:
    """A warning naming the tars in the split's naming (`SPLIT-*.tar`, `*-SPLIT-*.tar`, beside the listed shards or
    beside the info file) that the info file does not list: a shard added after the file was written is not read."""
    folders = {info_file.parent, *(shard.parent for shard in listed)}
    named = {tar for folder in folders for pattern in (f'{name}-*{TAR_SUFFIX}', f'*-{name}-*{TAR_SUFFIX}')
             for tar in folder.glob(pattern) if is_split_tar(tar)}
    read = {shard.resolve() for shard in listed}
    unlisted = sorted(tar for tar in named if tar.resolve() not in read)
    if unlisted:
        logger.warning(f'warning: {unlisted[0]} ({len(unlisted)} tar(s) named as shards of the split {name}) is not '
                       f'read: {info_file} does not list it under the split\'s "filenames"')


def is_list_of(value: object, kind: type) -> bool:
    """Whether `value` is a list of `kind` (a bool is no int here)."""
    return isinstance(value, list) and all(isinstance(item, kind) and not isinstance(item, bool) for item in value)


VALID = {'a list of integers': lambda value: is_list_of(value, int),
         'an integer': lambda value: isinstance(value, int) and not isinstance(value, bool),
         'a list of class names': lambda value: is_list_of(value, str) and bool(value),
         'a positive integer': lambda value: isinstance(value, int) and not isinstance(value, bool) and value > 0}


def check_info_fields(info_file: Path, fields: dict[str, tuple[object, str]]) -> None:
    """The info file's fields the suite reads (what -> (value, kind: a key of VALID)), where given, of the types timm
    writes: never a count or a class list misread (a string of class names read letter by letter)."""
    for what, (value, kind) in fields.items():
        if value is not None and not VALID[kind](value):
            raise DataError(f'{info_file}: {what} is {str(value)[:40]!r}, not {kind}')


def is_shard(tar: Path) -> bool:
    """Whether the tar begins with flat members among which a label is: a webdataset shard."""
    # a tar that does not open is no shard: the tar reader names what is wrong with it
    with contextlib.suppress(OSError, tarfile.TarError), tarfile.open(tar, 'r:') as opened:
        for _, member in zip(range(PEEK), opened):
            name = member.name.removeprefix('./')
            if member.isfile() and '/' not in name and Path(name).suffix in SIDECAR_SUFFIXES:
                return True
    return False


def folder_shards(data_dir: Path, split: str) -> tuple[str, list[Path]]:
    """The split's folder and its shards, where it holds shards; beside them only hidden, lost+found, empty."""
    for name in split_names(split):
        folder = data_dir / name
        if not folder.is_dir():
            continue
        tars = sorted(p for p in folder.iterdir() if is_split_tar(p))
        if not tars or not is_shard(tars[0]):
            return split, []
        folders, tars = split_entries(folder)
        if folders:
            raise DataError(f'{folder}: the class folder {folders[0]}/ beside webdataset shards ({tars[0].name}): a '
                            f'split is shards or class folders, not both')
        return name, tars
    return split, []


def named_shards(data_dir: Path, split: str) -> tuple[str, list[Path]]:
    """The split's shards by timm's naming where nothing else stores the split (else named in a warning)."""
    found = {name: sorted(tar for tar in {*data_dir.glob(f'{name}-*{TAR_SUFFIX}'),
                                          *data_dir.glob(f'*-{name}-*{TAR_SUFFIX}')} if is_split_tar(tar))
             for name in split_names(split)}
    stored = next((path for path in (data_dir / split, data_dir / f'{split}{TAR_SUFFIX}') if path.exists()), None)
    if stored is not None:
        unread = [tar for tars in found.values() for tar in tars]
        if unread:
            logger.warning(f'warning: {len(unread)} webdataset shard(s) named for the split, {unread[0]} ..., are not '
                           f'read: the split {split} is read from {stored}')
        return split, []
    return next(((name, tars) for name, tars in found.items() if tars), (split, []))


def find_split(data_dir: Path, split: str) -> ShardSplit | None:
    """The split's shards, found as the module says; None where the split is not stored in shards."""
    if not data_dir.is_dir():
        return None
    info_file, info = read_info(data_dir) or (None, {})
    if info_file is not None and (found := info_split(data_dir, info_file, info, split)) is not None:
        return found
    name, shards = folder_shards(data_dir, split)
    if shards:
        check_numbering(shards)
        return ShardSplit(name, shards, data_dir / name, info_file, info)
    name, shards = named_shards(data_dir, split)
    check_numbering(shards)
    return ShardSplit(name, shards, shards[0], info_file, info) if shards else None


def check_numbering(shards: Sequence[Path]) -> None:
    """Shards numbered as timm's and the Hub's are (`...-0000.tar`, ...) without a gap a download left."""
    numbers = {int(match[1]): shard for shard in shards if (match := SHARD_NUMBER.search(shard.name))}
    if len(numbers) != len(shards) or not numbers:
        return  # not all numbered: nothing to tell
    skipped = sorted(set(range(min(numbers), max(numbers) + 1)) - set(numbers))
    if skipped:
        after = numbers[max(n for n in numbers if n < skipped[0])]
        raise DataError(f'{after.parent}: the shards skip number {skipped[0]} after {after.name} ({len(skipped)} '
                        f'number(s) skipped of {min(numbers)}..{max(numbers)}): download the missing shards, or list '
                        f'the shards to read in an _info.json (docs/imagenet.md)')


# --------------------------------------------------------------------------------------------------------- labels

def sample_key(member: str) -> str:
    """webdataset's key of a member: its path up to the first dot of its file name."""
    folder, _, file = member.rpartition('/')
    return f'{folder}/{file.split(".", 1)[0]}' if folder else file.split('.', 1)[0]


def class_index(value: object, where: str, text: bool = False) -> int:
    """A label as a class index: a `.cls` text or a JSON number (a JSON text could be a class's name)."""
    if isinstance(value, str) and text:
        with contextlib.suppress(ValueError):
            return int(value.strip())
    elif isinstance(value, int) and not isinstance(value, bool):
        return value
    kind = 'a JSON text, not a number' if isinstance(value, str) and not text else 'not an integer'
    raise DataError(f'{where}: {str(value).strip()[:40]!r} is not a class index ({kind})')


def read_sidecar(sample: Sample, member: str, text: str, where: str, alt_label: str | None = None) -> None:
    """A label member's content into the sample's record (a JSON's `alt_label` field too, where one is named)."""
    if member.endswith('.cls'):
        sample.cls = class_index(text, where, text=True)
        return
    try:
        record = json.loads(text)
    except ValueError as e:
        raise DataError(f'{where} is not readable JSON ({e})') from None
    if not isinstance(record, dict):
        raise DataError(f'{where} is not a JSON record (an object with "label")')
    if record.get('label') is not None:
        sample.label = class_index(record['label'], where)
    if alt_label is not None:
        sample.alt = record.get(alt_label)  # its class_name names the `label`'s class, not this one's
    elif record.get('class_name') is not None:
        sample.name = str(record['class_name'])


def sample_label(sample: Sample, where: str, count: int | None, count_from: str, alt_label: str | None = None) -> int:
    """The sample's class index: its `.cls`, or its JSON's `label` (both, where given, the same), in the classes; with
    an `alt_label`, its JSON's field of that name (-1: the sample is left out)."""
    if alt_label is not None:
        if sample.alt is None:
            raise DataError(f'{where}: no {alt_label!r} in a KEY.json (the info file\'s alt_label)')
        label = class_index(sample.alt, f'{where} ({alt_label!r})')
        if label == -1:
            return label
    elif sample.cls is None and sample.label is None:
        raise DataError(f'{where}: the image has no label (no KEY.cls, no "label" in a KEY.json)')
    elif sample.cls is not None and sample.label is not None and sample.cls != sample.label:
        raise DataError(f'{where}: the .cls says class {sample.cls}, the .json class {sample.label}')
    else:
        label = sample.cls if sample.cls is not None else sample.label
    if label < 0 or (count is not None and label >= count):
        scope = f'the {count} classes of {count_from}' if count is not None else 'the class indices (0, 1, ...)'
        raise DataError(f'{where}: class index {label} is outside {scope}')
    return label


def class_count(found: ShardSplit, classes: Sequence[str] | None, classes_from: str) -> tuple[int | None, str]:
    """The class count known before the labels are read, and where from (for messages)."""
    if classes is not None:
        return len(classes), classes_from
    if isinstance(found.info.get('classes'), list):
        return len(found.info['classes']), f'{found.info_file} ("classes")'
    if isinstance(found.info.get('num_classes'), int):
        return found.info['num_classes'], f'{found.info_file} ("num_classes")'
    return None, ''


def class_names(found: ShardSplit, count: int, given: Sequence[str] | None,
                named: dict[int, tuple[str, str]]) -> list[str]:
    """The class list in index order: the given or info file's names, else the samples' `class_name`, else indices."""
    listed = list(given) if given is not None else found.info.get('classes')
    width = len(str(count - 1))
    names = [str(listed[i]) if listed else named[i][0] if i in named else f'{i:0{width}d}' for i in range(count)]
    for index, (name, where) in sorted(named.items()):
        if name != names[index]:
            raise DataError(f'{where}: class {index} is named {name!r}, the class list says {names[index]!r}')
    twice = next((name for name, times in Counter(names).items() if times > 1), None)
    if twice is not None:
        raise DataError(f'{found.read_from}: two classes are named {twice!r}')
    return names


def check_counts(found: ShardSplit, per_shard: np.ndarray) -> None:
    """The info file's counts of the split (`shard_lengths`, `num_samples`) against the images in its shards."""
    lengths, total = found.entry.get('shard_lengths'), found.entry.get('num_samples')
    if lengths is not None:
        if len(lengths) != len(found.shards):
            raise DataError(f'{found.info_file}: the split {found.name} gives {len(lengths)} shard lengths for '
                            f'{len(found.shards)} shards')
        for shard, expected, held in zip(found.shards, lengths, per_shard.tolist()):
            if expected != held:
                raise DataError(f'{shard}: {held} samples, where {found.info_file} says {expected} (the shard is '
                                f'not the one described: copy it again)')
    if total is not None and total != int(per_shard.sum()):
        raise DataError(f'{found.info_file}: the split {found.name} holds {int(per_shard.sum())} samples in its '
                        f'shards, the file says {total} ("num_samples")')


# ----------------------------------------------------------------------------------------------------- the listing

def index_strings(index: dict[str, np.ndarray], buffer: str, ends: str) -> list[str]:
    """Strings the index keeps packed (a `PathList`'s two arrays), unpacked at once (one at a time is slower)."""
    packed = PathList()
    packed.buffer, packed.offsets = index[buffer], index[ends]
    return list(packed)


def read_samples(found: ShardSplit, index: dict[str, np.ndarray], members: Sequence[str],
                 alt_label: str | None) -> dict[tuple[int, str], Sample]:
    """Each (shard number, key) with its image and labels; an image or label alone or a key twice is an error."""
    samples: dict[tuple[int, str], Sample] = {}
    shard_of: dict[str, int] = {}
    for position, (member, number) in enumerate(zip(members, index['tar'].tolist())):
        key = (number, sample_key(member))
        if key in samples:
            raise DataError(f'{found.shards[number]}: key {key[1]}: two images ({members[samples[key].position]}, '
                            f'{member})')
        first = shard_of.setdefault(key[1], number)
        if first != number:
            raise DataError(f'{found.shards[number]}: key {key[1]} is also in {found.shards[first]}: a sample in two '
                            f'shards would be read twice (a shard copied in twice? each key once in a split)')
        samples[key] = Sample(position)
    side_names = index_strings(index, 'side_buffer', 'side_ends')
    texts = index_strings(index, 'text_buffer', 'text_ends')
    for member, text, number in zip(side_names, texts, index['side_tar'].tolist()):
        key = (number, sample_key(member))
        if key not in samples:
            raise DataError(f'{found.shards[number]}: key {key[1]}: the label {member} has no image')
        read_sidecar(samples[key], member, text, f'{found.shards[number]}: {member}', alt_label)
    return samples


def shard_listing(data_dir: Path, found: ShardSplit, classes: Sequence[str] | None, classes_from: str) -> Listing:
    """The split's classes, its images (named by shard and member) with their labels, and their reader."""
    index = tar_index(TarSplit(found.shards, False, True, data_dir / f'wds-{found.name}.index.npz'), shards=True)
    members = index_strings(index, 'buffer', 'ends')
    alt_label = found.entry.get('alt_label') or None
    samples = read_samples(found, index, members, alt_label)
    check_counts(found, np.bincount([number for number, _ in samples], minlength=len(found.shards)))
    count, count_from = class_count(found, classes, classes_from)
    listed, named, unlabelled = [], {}, 0
    for (number, key), sample in samples.items():
        where = f'{found.shards[number]}: key {key}'
        label = sample_label(sample, where, count, count_from, alt_label)
        if label == -1:  # alt_label's unlabelled samples, which timm skips
            unlabelled += 1
            continue
        if sample.name is not None:
            first = named.setdefault(label, (sample.name, where))
            if first[0] != sample.name:
                raise DataError(f'{where}: class {label} is named {sample.name!r}, at {first[1]} {first[0]!r}')
        listed.append((label, members[sample.position], number, sample.position))
    if alt_label is not None:
        logger.info(f'{found.info_file}: the split {found.name}\'s labels are KEY.json\'s {alt_label!r} (alt_label); '
                    f'{unlabelled} of {len(samples)} samples labelled -1 there are left out, as timm leaves them')
    if alt_label is not None and not listed:
        raise DataError(f'{found.info_file}: every sample of the split {found.name} is labelled -1 in {alt_label!r}')
    listed.sort()
    found_classes = class_names(found, count if count is not None else max(label for label, *_ in listed) + 1,
                                classes, named)
    shard_names = [shard.relative_to(data_dir).as_posix() for shard in found.shards]
    where = TarMembers([str(shard) for shard in found.shards], index['tar'], index['offset'], index['size'])
    return Listing(found_classes, [(f'{shard_names[number]}/{member}', label) for label, member, number, _ in listed],
                   TarReader(data_dir, where.take([position for *_, position in listed])), found.read_from)


@register_source
class WebDatasetShards(ImageSource):
    """A split in webdataset shards: asked before the tars, which would read a folder of them as per-class tars."""

    name = 'webdataset shards'
    precedence = 10  # before the tars (20)

    def list_split(self, data_dir: Path, split: str, classes: Sequence[str] | None,
                   classes_from: str) -> Listing | None:
        found = find_split(data_dir, split)
        return None if found is None else shard_listing(data_dir, found, classes, classes_from)

