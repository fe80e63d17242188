"""ImageNet-layout splits kept in tar files, read in place (`Tars`, the source; `tar_index`, which the webdataset reader
shares): per-class tars or shards in D/SPLIT/, one D/SPLIT.tar, or D itself a tar. Every image keeps the relative
path it has in the folder layout (`train/n01440764/n01440764_10026.JPEG`), so token-label stores work unchanged; the
tars are indexed once (the index cached, rebuilt when a tar changes) and an image is one `os.pread` of its bytes
(`TarMembers`). docs/imagenet.md ("ImageNet in tar files") gives every rule."""
from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import resource
import tarfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from backbones.common.errors import DataError
from backbones.common.files import write_atomic
from backbones.common.images import (
    FOLDER_INDEX,
    IMG_EXTENSIONS,
    TAR_SUFFIX,
    ImageReadError,
    class_files,
    decompress,
    is_image_name,
    is_split_tar,
    label_samples,
    split_entries,
    unread_tar_fix,
)
from backbones.common.log import logger
from classification.sources.path_list import ENCODING, PathList
from classification.sources.source import ImageSource, Listing, register_source

GZIP_MAGIC = b'\x1f\x8b'
INDEX_VERSION = 2  # 2: the key holds each tar's inode and status-change time
TRAIN_SPLIT = 'train'  # the split a tar without split folders holds (the original ILSVRC2012 training tar)
BLOCK = tarfile.BLOCKSIZE
THIRD_LEVEL = 'a tar inside a per-class tar: the reader opens one level of tars in a tar; extract it'
ON_DISK = -1  # the tar number of an image of a class folder beside the tars: read as a file
SIDECAR_SUFFIXES = ('.cls', '.json')  # a webdataset shard's label members: the class index, a JSON record


class MemberFile(io.BytesIO):
    """An image's bytes read from its tar; `str()` names the tar and the image (for error messages)."""

    def __init__(self, data: bytes, name: str) -> None:
        super().__init__(data)
        self.name = name

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__  # Pillow's errors name the file by its repr


# ------------------------------------------------------------------------------------------------- the split's tars

@dataclass(frozen=True)
class TarSplit:
    """A split's tars: `whole` (the data folder's own tar) or a `folder`'s, its class `folders` beside; `index`."""

    tars: list[Path]
    whole: bool
    folder: bool
    index: Path
    folders: Sequence[str] = ()


def split_tars(data_dir: Path, split: str) -> TarSplit | None:
    """The tars of `split` of `data_dir`; None where the split is class folders alone (or nothing)."""
    if data_dir.is_file():
        return TarSplit([data_dir], True, False, data_dir.with_name(data_dir.name + '.index.npz'))
    folder = data_dir / split
    if folder.is_dir():
        if not any(is_split_tar(p) for p in folder.iterdir()):
            return None  # class folders: the folder reader accounts for every entry
        folders, tars = split_entries(folder)
        return TarSplit(tars, False, True, folder / FOLDER_INDEX, folders)
    tar = data_dir / f'{split}{TAR_SUFFIX}'
    if tar.is_file():
        return TarSplit([tar], False, False, tar.with_name(tar.name + '.index.npz'))
    return None


def cache_location(beside: Path) -> Path:
    """The index's place in the user's cache, for data folders that cannot be written."""
    cache = Path(os.environ.get('XDG_CACHE_HOME') or Path.home() / '.cache') / 'backbones' / 'tar-index'
    digest = hashlib.sha256(str(beside.resolve()).encode()).hexdigest()[:16]
    return cache / f'{beside.name}.{digest}.npz'


def tars_key(tars: Sequence[Path]) -> str:
    """Each tar's name, size, mtime, inode and ctime: a replaced or copied tar is indexed again."""
    stats = [p.stat() for p in tars]
    return json.dumps([INDEX_VERSION] + [[p.name, s.st_size, s.st_mtime_ns, s.st_ino, s.st_ctime_ns]
                                         for p, s in zip(tars, stats)])


# -------------------------------------------------------------------------------------------------------- indexing

def check_archive_end(tar: tarfile.TarFile, fileobj: BinaryIO, what: str) -> None:
    """`tarfile` ends its listing quietly at a damaged or cut header: a complete archive ends with a zero block."""
    fileobj.seek(tar.offset)
    end = fileobj.read(BLOCK)
    if len(end) < BLOCK or end.count(0) != BLOCK:
        raise DataError(f'{what} is truncated or damaged at byte {tar.offset} (no tar header or end of archive '
                        f'there): copy it again')


def index_members(fileobj: BinaryIO, size: int, what: str, base: int, prefix: str,
                  out: tuple[list[str], list[int], list[int]], nested: bool,
                  sidecars: list[tuple[str, bytes]] | None = None) -> None:
    """Append (name, offset in the outer file, size) of each image member of the tar in `fileobj` to `out`, nested
    tars as `X/NAME`; with `sidecars`, the label members' contents. A tar or member not taken is an error naming it."""
    names, offsets, sizes = out
    links, others, before = [], set(), len(names)
    try:
        with tarfile.open(fileobj=fileobj, mode='r:') as tar:
            while (member := tar.next()) is not None:
                tar.members.clear()  # tarfile keeps every TarInfo it read: a million of them take most of a gigabyte
                if member.islnk() or member.issym():
                    links.append(member.name)
                if not member.isfile():
                    continue
                name = member.name.removeprefix('./')
                if member.offset_data + member.size > size:
                    raise DataError(f'{what}: member {name} runs past the end of the file (bytes '
                                    f'{member.offset_data}..{member.offset_data + member.size} of {size}): the tar '
                                    f'is truncated; copy it again')
                if nested and name.endswith(TAR_SUFFIX):
                    index_members(tar.extractfile(member), member.size, f'{what}:{name}', base + member.offset_data,
                                  f'{prefix}{name[:-len(TAR_SUFFIX)]}/', out, nested=False)
                elif is_image_name(name):
                    names.append(prefix + name)
                    offsets.append(base + member.offset_data)
                    sizes.append(member.size)
                elif sidecars is not None:
                    if Path(name).suffix not in SIDECAR_SUFFIXES:
                        raise DataError(f'{what}: member {name} is neither an image ({", ".join(IMG_EXTENSIONS)}) '
                                        f'nor a label ({", ".join(SIDECAR_SUFFIXES)}): a webdataset shard holds '
                                        f'KEY.EXT images with their KEY.cls or KEY.json (docs/imagenet.md)')
                    sidecars.append((prefix + name, tar.extractfile(member).read()))
                elif not prefix and '/' not in name and Path(name).suffix in SIDECAR_SUFFIXES:
                    raise DataError(f'{what}: member {name} is a webdataset label beside flat images, which the '
                                    f'tar reader would take for a class named after the tar: keep the shards in a '
                                    f'split folder of shards alone (docs/imagenet.md)')
                elif (fix := unread_tar_fix(name)) or name.endswith(TAR_SUFFIX):
                    raise DataError(f'{what}: member {name} is {fix or THIRD_LEVEL}')
                else:
                    others.add(Path(name).suffix.lower() or Path(name).name)
            check_archive_end(tar, fileobj, what)
        if links:  # GNU tar stores a second copy of a hard-linked file as a link: the folder would hold both
            logger.warning(f'warning: {what}: {len(links)} link member(s) left out, e.g. {links[0]}: the tar holds '
                           f'links, not images; make it with --hard-dereference and --dereference to read them')
        if len(names) == before:
            files = f'its files: {", ".join(sorted(others)[:5])}' if others else 'no files'
            raise DataError(f'{what} holds no image the suite reads ({files}; read: {", ".join(IMG_EXTENSIONS)})')
    except tarfile.TarError as e:
        fileobj.seek(0)
        if fileobj.read(2) == GZIP_MAGIC:
            raise DataError(f'{what} is gzip-compressed: {decompress("gunzip")}') from None
        raise DataError(f'{what} is not a readable tar ({e}): copy it again') from None


def build_index(tars: Sequence[Path], shards: bool = False) -> dict[str, np.ndarray]:
    """The images of `tars`: names, tar numbers, offsets, sizes (`shards`: label members too, as `side_*`)."""
    names: list[str] = []
    offsets: list[int] = []
    sizes: list[int] = []
    tar_of: list[int] = []
    sidecars: list[tuple[str, bytes]] | None = [] if shards else None
    side_tar: list[int] = []
    for number, path in enumerate(tars):
        before, side_before = len(names), len(sidecars or ())
        with open(path, 'rb') as f:
            index_members(f, path.stat().st_size, str(path), 0, '', (names, offsets, sizes), not shards, sidecars)
        tar_of += [number] * (len(names) - before)
        side_tar += [number] * (len(sidecars or ()) - side_before)
    packed = PathList(names)
    index = {'key': np.array(tars_key(tars)), 'buffer': packed.buffer, 'ends': packed.offsets,
             'tar': np.array(tar_of, np.int32), 'offset': np.array(offsets, np.int64),
             'size': np.array(sizes, np.int64)}
    if sidecars is not None:
        side_names = PathList(name for name, _ in sidecars)
        side_text = PathList(content.decode(*ENCODING) for _, content in sidecars)
        index.update(side_tar=np.array(side_tar, np.int32), side_buffer=side_names.buffer, side_ends=side_names.offsets,
                     text_buffer=side_text.buffer, text_ends=side_text.offsets)
    return index


def read_index(path: Path, key: str) -> dict[str, np.ndarray] | None:
    """The index stored at `path` if it is of these tars as they are now; else None (absent, stale, unreadable)."""
    try:
        with np.load(path) as stored:
            index = {name: stored[name] for name in stored.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError):  # a damaged file: built again
        return None
    return index if str(index.get('key')) == key else None


def write_index(index: dict[str, np.ndarray], beside: Path) -> Path:
    """Store the index beside the data, or in the user's cache where that folder cannot be written."""
    for place in (beside, cache_location(beside)):
        try:
            place.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(place, lambda f: np.savez(f, **index))
            return place
        except OSError as e:
            logger.warning(f'warning: cannot write the tar index {place} ({e.strerror or e})')
    raise DataError(f'cannot write the tar index of {beside.parent} beside the data or in {cache_location(beside)}')


def tar_index(found: TarSplit, shards: bool = False) -> dict[str, np.ndarray]:
    """The index of the split's tars, read from beside them or the cache, or built (once) and stored."""
    key = tars_key(found.tars)
    for place in (found.index, cache_location(found.index)):
        if (index := read_index(place, key)) is not None:
            return index
    logger.info(f'indexing {len(found.tars)} tar file(s) in {found.tars[0].parent} (once: the index is kept)')
    index = build_index(found.tars, shards)
    place = write_index(index, found.index)
    logger.info(f'{place}: the index of {len(index["size"])} images')
    return index


# ---------------------------------------------------------------------------------------------- reading the members

@functools.cache
def open_files_allowed() -> int:
    """The process's limit of open files, raised to the system's (often 1,024 by default, 4,096 or more allowed)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return hard if hard != resource.RLIM_INFINITY else 1 << 20
        except (ValueError, OSError):
            pass
    return soft


class TarMembers:
    """Where each image of a listing is: its tar (`ON_DISK`: a class folder's file), offset and size."""

    def __init__(self, tars: Sequence[str], tar: np.ndarray, offset: np.ndarray, size: np.ndarray) -> None:
        self.tars, self.tar, self.offset, self.size = list(tars), tar, offset, size
        self._files: dict[int, int] = {}  # tar number -> file descriptor

    def take(self, positions: Sequence[int] | np.ndarray) -> TarMembers:
        positions = np.asarray(positions, np.int64)
        return TarMembers(self.tars, self.tar[positions], self.offset[positions], self.size[positions])

    def _descriptor(self, number: int) -> int:
        if number not in self._files:
            if len(self._files) >= open_files_allowed() // 2:  # 1,000 per-class tars in every worker
                os.close(self._files.pop(next(iter(self._files))))  # the first opened
            self._files[number] = os.open(self.tars[number], os.O_RDONLY)
        return self._files[number]

    def file(self, i: int, path: str) -> MemberFile:
        """Image `i` (relative path `path`) as an in-memory file; a short read names the tar and the image."""
        number, offset, size = int(self.tar[i]), int(self.offset[i]), int(self.size[i])
        name = f'{self.tars[number]}:{path}'
        try:
            data = os.pread(self._descriptor(number), size, offset)
        except OSError as e:
            raise ImageReadError(f'cannot read image {name}: {e.strerror or e}') from e
        if len(data) != size:
            raise ImageReadError(f'cannot read image {name}: {len(data)} of its {size} bytes at byte {offset} (the '
                                 f'tar was truncated or changed after it was indexed)')
        return MemberFile(data, name)

    def __getstate__(self) -> dict:
        return {**self.__dict__, '_files': {}}  # descriptors stay with their process


# ----------------------------------------------------------------------------------------------------- the listing

def member_sample(name: str, split: str, found: TarSplit, tar: Path, split_folders: bool) -> tuple[str, str] | None:
    """(class, file name) of an image of the index, None where it is another split's or in a hidden folder; a
    DataError where it is in no class folder or below one (`split_folders`: the tar holds `SPLIT/CLASS/FILE`)."""
    parts = name.split('/')
    if found.whole and len(parts) == 3:
        return (parts[1], parts[2]) if parts[0] == split else None
    if split_folders and len(parts) == 2:
        if parts[0] != split:
            return None  # another split's, flat (Kaggle's ILSVRC test folder): not read
        raise DataError(f'{tar}: image {name} is directly in the split folder {parts[0]}, in no class folder: sort the '
                        f'images into class folders first (docs/imagenet.md)')
    if found.folder and len(parts) == 1:
        return tar.stem, parts[0]  # a per-class tar
    if len(parts) == 2 and not (found.whole and split != TRAIN_SPLIT):
        return parts[0], parts[1]
    if found.whole and len(parts) == 2:
        return None  # the original training tar holds no other split
    expected = f'{split}/CLASS/FILE, CLASS/FILE or CLASS.tar' if found.whole else 'CLASS/FILE or CLASS.tar'
    if len(parts) > 2:
        raise DataError(f'{tar}: image {name} is in a folder inside a class folder (expected {expected}): make the tar '
                        f'from the folder that holds the class folders (docs/imagenet.md)')
    raise DataError(f'{tar}: image {name} is not in a class folder (expected {expected}): sort the images into class '
                    f'folders first (docs/imagenet.md)')


def check_tar_layouts(found: TarSplit, first: dict[tuple[int, int], str]) -> None:
    """Each tar of a split folder holds one layout (`first`'s), and beside class folders only per-class tars stand."""
    for number, tar in enumerate(found.tars):
        if (number, 0) in first and (number, 1) in first:
            raise DataError(f'{tar}: flat images ({first[number, 0]}) beside images in class folders '
                            f'({first[number, 1]}): a per-class tar holds its images flat, a shard CLASS/KEY members, '
                            f'not both')
    per_class = sorted(number for number, kind in first if kind == 0)
    shards = sorted(number for number, kind in first if kind == 1)
    if per_class and shards:
        flat, shard = per_class[0], shards[0]
        raise DataError(f'{found.index.parent}: {found.tars[flat].name} is a per-class tar (flat images: '
                        f'{first[flat, 0]}), {found.tars[shard].name} a shard (images in class folders: '
                        f'{first[shard, 1]}): the tars of a split folder are per-class tars or shards, not both')
    if shards and found.folders:
        raise DataError(f'{found.index.parent}: {found.tars[shards[0]].name} holds class folders '
                        f'({first[shards[0], 1]}) beside the class folder {found.folders[0]}/: beside class folders '
                        f'a tar is one class of flat images, named as the tar')


def add_class_folders(found: TarSplit, by_class: dict[str, list[tuple[str, int]]], on_disk: int) -> None:
    """The images of the class folders beside per-class tars; a class both a folder and a tar is an error."""
    for name in found.folders:
        if name in by_class:
            raise DataError(f'{found.index.parent}: the class {name} is both a folder ({name}/) and a tar '
                            f'({name}{TAR_SUFFIX}): keep one of them')
        by_class[name] = [(file, on_disk) for file in class_files(found.index.parent / name)]


def tar_listing(data_dir: Path, split: str, found: TarSplit, classes: Sequence[str] | None,
                classes_from: str) -> tuple[list[str], list[tuple[str, int]], TarMembers]:
    """`scan_split` for a split in tars (and the class folders beside them), and where each image is."""
    index = tar_index(found)
    names = PathList()
    names.buffer, names.offsets = index['buffer'], index['ends']
    tar_of = index['tar'].tolist()
    split_folders = found.whole and any(name.count('/') == 2 for name in names)
    by_class: dict[str, list[tuple[str, int]]] = {}
    first: dict[tuple[int, int], str] = {}  # a folder's tars: see check_tar_layouts
    stems = [tar.stem for tar in found.tars]
    for position, (name, number) in enumerate(zip(names, tar_of)):
        sample = member_sample(name, split, found, found.tars[number], split_folders)
        if sample is not None and not sample[0].startswith('.'):
            by_class.setdefault(sample[0], []).append((sample[1], position))
            if found.folder and ((flat := '/' not in name) or sample[0] != stems[number]):
                first.setdefault((number, not flat), name)
    where = f'{data_dir}:{split}' if found.whole else str(found.index.parent if found.folder else found.tars[0])
    on_disk = len(index['size'])  # the entry appended to the index's arrays for the class folders' images
    if found.folder:
        check_tar_layouts(found, first)
        add_class_folders(found, by_class, on_disk)
    if not by_class:
        raise DataError(f'{where} holds no images of the split {split} (extensions {", ".join(IMG_EXTENSIONS)})')
    for name, files in by_class.items():
        files.sort()
        twice = next((file for (file, _), (other, _) in zip(files, files[1:]) if file == other), None)
        if twice is not None:
            raise DataError(f'{where}: the image {split}/{name}/{twice} is in the tars more than once')
    classes, labelled = label_samples(split, where, sorted(by_class),
                                      lambda c: [file for file, _ in by_class.get(c, [])], classes, classes_from)
    positions = [position for c in classes for _, position in by_class.get(c, [])]
    members = TarMembers([str(t) for t in found.tars], np.append(index['tar'], ON_DISK),
                         np.append(index['offset'], 0), np.append(index['size'], 0))
    return classes, labelled, members.take(positions)


class TarReader:
    """A tar listing's images: one pread from its tar (`TarMembers`), or the file of a class folder beside them."""

    def __init__(self, data_dir: Path, members: TarMembers) -> None:
        self.data_dir, self.members = data_dir, members

    def open(self, index: int, name: str) -> Path | MemberFile:
        return self.data_dir / name if self.members.tar[index] == ON_DISK else self.members.file(index, name)

    def take(self, positions: Sequence[int] | np.ndarray) -> TarReader:
        return TarReader(self.data_dir, self.members.take(positions))


@register_source
class Tars(ImageSource):
    name = 'tars'
    precedence = 20

    def list_split(self, data_dir: Path, split: str, classes: Sequence[str] | None,
                   classes_from: str) -> Listing | None:
        found = split_tars(data_dir, split)
        if found is None:
            return None
        found_classes, samples, members = tar_listing(data_dir, split, found, classes, classes_from)
        read_from = None if found.whole else data_dir / split if found.folder else found.tars[0]
        return Listing(found_classes, samples, TarReader(data_dir, members), read_from)
