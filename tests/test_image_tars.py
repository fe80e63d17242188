"""ImageNet-layout splits read in place from tars: the same listing, bytes and items as the folder; the index kept
and rebuilt; damaged tars named."""
from __future__ import annotations

import gzip
import os
import shutil
import tarfile
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torchvision import transforms

import classification.sources.tars as image_tars
from backbones.common.errors import DataError
from backbones.common.images import ImageReadError, file_bytes, scan_split
from classification.data.folders import ImageFolderDataset
from classification.sources.class_folders import FilesIn
from classification.sources.source import open_split
from helpers.cls_data import CLASSES, make_image_folder, split_tars, tar_files, write_tar
from helpers.commands import one_line_error, run_tool, succeeded
from helpers.models import TINY_DEIT


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp('tars') / 'folder', per_class={'train': 5, 'val': 2})


def tar_data(folder, root, layout: str):
    """--data-dir of the folder's images in `layout` (the validation split a tar of class folders beside)."""
    if layout == 'whole':
        files = {f.relative_to(folder).as_posix(): f.read_bytes() for f in sorted(folder.rglob('*')) if f.is_file()}
        return write_tar(root / 'imagenet.tar', files)
    split_tars(folder / 'train', root / ('train.tar' if layout in ('ilsvrc', 'class-folders') else 'train'), layout)
    split_tars(folder / 'val', root / 'val.tar', 'class-folders')
    return root


@pytest.mark.parametrize('layout', ['ilsvrc', 'per-class', 'shards', 'class-folders', 'whole'])
def test_tars_list_and_read_as_the_folder(folder, tmp_path, layout):
    data = tar_data(folder, tmp_path, layout)
    for split in ('train', 'val'):
        classes, samples = scan_split(folder, split)
        listing = open_split(data, split, classes)
        found, listed = listing.classes, listing.samples
        assert (found, listed) == (classes, samples)  # same paths (the store's keys), order and labels
        assert [file_bytes(listing.reader.open(i, path)) for i, (path, _) in enumerate(listed)] == \
               [(folder / path).read_bytes() for path, _ in samples]
    assert isinstance(open_split(folder, 'train').reader, FilesIn)  # folders read as before


class Seeded:
    """A random crop drawn from the worker's streams (seeded per image by the dataset)."""

    def __init__(self) -> None:
        self.crop = transforms.Compose([transforms.RandomResizedCrop(12), transforms.PILToTensor()])

    def __call__(self, image):
        return self.crop(image)


def test_the_dataset_reads_tars_like_the_folder_through_forked_workers(folder, tmp_path):
    data = tar_data(folder, tmp_path, 'ilsvrc')
    batches = []
    for root in (folder, data):
        dataset = ImageFolderDataset(root, 'train', Seeded(), max_images=12)
        dataset.set_epoch(3, 1)
        loader = DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2, multiprocessing_context='fork',
                            generator=torch.Generator().manual_seed(0))
        batches.append([(b['index'].tolist(), b['label'].tolist(), b['image']) for b in loader])
    for (index, label, image), (tar_index, tar_label, tar_image) in zip(*batches, strict=True):
        assert (index, label) == (tar_index, tar_label) and torch.equal(image, tar_image)


def test_the_index_is_kept_and_rebuilt_when_a_tar_changes(folder, tmp_path, monkeypatch):
    data = tar_data(folder, tmp_path, 'per-class')
    builds = []
    build = image_tars.build_index
    monkeypatch.setattr(image_tars, 'build_index', lambda tars, shards: builds.append(len(tars)) or build(tars, shards))
    first = open_split(data, 'train')
    assert (data / 'train' / 'tars.index.npz').is_file() and builds == [3]
    assert open_split(data, 'train').samples == first.samples and builds == [3]  # read from beside the tars
    shutil.copy(folder / 'train' / 'n002' / 'n002_1.JPEG', tmp_path / 'n001_9.JPEG')
    write_tar(data / 'train' / 'n001.tar', {'n001_9.JPEG': (tmp_path / 'n001_9.JPEG').read_bytes()})
    listing = open_split(data, 'train')
    samples, members = listing.samples, listing.reader.members
    assert builds == [3, 3] and [p for p, _ in samples if p.startswith('train/n001/')] == ['train/n001/n001_9.JPEG']
    assert file_bytes(members.file(0, samples[0][0])) == (tmp_path / 'n001_9.JPEG').read_bytes()

    # a data folder that cannot be written: the index goes to the user's cache, and is read from there
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
    (data / 'train' / 'tars.index.npz').unlink()
    write = image_tars.write_atomic

    def read_only(path, writer):
        if tmp_path / 'cache' not in path.parents:
            raise PermissionError(13, 'Permission denied', str(path))
        write(path, writer)

    monkeypatch.setattr(image_tars, 'write_atomic', read_only)
    assert open_split(data, 'train').samples == samples and builds == [3, 3, 3]
    assert open_split(data, 'train').samples == samples and builds == [3, 3, 3]
    assert len(list((tmp_path / 'cache' / 'backbones' / 'tar-index').glob('tars.*.npz'))) == 1


def cut(path, size: int):
    with open(path, 'r+b') as f:
        f.truncate(size)


def test_damaged_tars_are_named_in_one_line(folder, tmp_path):
    data = tar_data(folder, tmp_path, 'ilsvrc')
    intact = (data / 'train.tar').read_bytes()
    first_image = 512 + 512 + 512  # the outer header, the inner header: the first image's bytes
    with tarfile.open(data / 'train.tar') as tar:
        second = tar.getmembers()[1].offset  # its header: a cut there leaves a complete first member, then nothing
    damaged = {
        'a member cut': (first_image + 100, 'runs past the end of the file'),
        'cut between members': (second, f'truncated or damaged at byte {second}'),
        'a header overwritten': (None, f'truncated or damaged at byte {second}'),
    }
    for size, says in damaged.values():
        overwritten = intact[:second] + b'x' * 512 + intact[second + 512:]
        (data / 'train.tar').write_bytes(intact[:size] if size else overwritten)
        with pytest.raises(DataError, match=says) as error:
            open_split(data, 'train')
        assert str(data / 'train.tar') in str(error.value) and '\n' not in str(error.value)
    # the validation images as released: one flat tar, no class folders
    write_tar(data / 'val.tar', {'ILSVRC2012_val_00000001.JPEG': intact[first_image:first_image + 10]})
    with pytest.raises(DataError, match='ILSVRC2012_val_00000001.JPEG is not in a class folder') as error:
        open_split(data, 'val')
    assert str(data / 'val.tar') in str(error.value)

    # a tar cut after it was indexed (under the same size and time): the image read names the tar and the image
    (data / 'train.tar').write_bytes(intact)
    listing = open_split(data, 'train')
    samples, members = listing.samples, listing.reader.members
    stat = os.stat(data / 'train.tar')
    cut(data / 'train.tar', int(members.offset[-1]) + 1)
    with pytest.raises(ImageReadError, match=f'{data / "train.tar"}:{samples[-1][0]}: 1 of its'):
        members.file(len(samples) - 1, samples[-1][0])
    os.utime(data / 'train.tar', ns=(stat.st_atime_ns, stat.st_mtime_ns))

    # and a tool says it in one line
    cut(data / 'train.tar', first_image + 100)
    message = one_line_error(run_tool('train_cls.py', ['deit_tiny_patch16_224', '--data-dir', data, '--epochs', '1',
                                                       '--device', 'cpu', '--output', tmp_path / 'run']))
    assert str(data / 'train.tar') in message and 'runs past the end' in message, message
    assert np.array_equal(members.size > 0, np.ones(len(samples), bool))


def test_flat_images_in_a_split_folder_a_damaged_index_and_gzip_are_named_or_mended(folder, tmp_path):
    """In a whole data set's tar, an image directly in the training split's folder is in no class folder (it was
    listed as a class named after its folder); a flat other split (Kaggle's test) is left alone. A damaged index is
    built again; a gzip-compressed tar is named as such."""
    files = {f.relative_to(folder).as_posix(): f.read_bytes() for f in sorted(folder.rglob('*')) if f.is_file()}
    image = next(iter(files.values()))
    write_tar(tmp_path / 'flat_test.tar', {**files, 'test/x_1.JPEG': image})
    assert open_split(tmp_path / 'flat_test.tar', 'train').classes == open_split(folder, 'train').classes
    write_tar(tmp_path / 'flat_train.tar', {**files, 'train/x_1.JPEG': image})
    with pytest.raises(DataError, match='image train/x_1.JPEG is directly in the split folder train'):
        open_split(tmp_path / 'flat_train.tar', 'train')
    data = tar_data(folder, tmp_path / 'idx', 'per-class')
    listed = open_split(data, 'train').samples
    index = data / 'train' / 'tars.index.npz'
    index.write_bytes(index.read_bytes()[:300])  # a zip cut short
    assert open_split(data, 'train').samples == listed
    (tmp_path / 'gz').mkdir()
    with gzip.open(tmp_path / 'gz' / 'train.tar', 'wb') as f:
        f.write((tmp_path / 'flat_test.tar').read_bytes())
    with pytest.raises(DataError, match='train.tar is gzip-compressed'):
        open_split(tmp_path / 'gz', 'train')


# ------------------------------------------------------------------------------ every entry and member accounted for

def gzipped(path, out):
    out.write_bytes(gzip.compress(path.read_bytes()))
    return out


def with_class_tars(folder, root, as_tars):
    """root/{train,val}: the folder's class folders, those named in `as_tars` as per-class tars (flat images)."""
    for split in ('train', 'val'):
        shutil.copytree(folder / split, root / split)
        for name in as_tars:
            images = {f.name: f.read_bytes() for f in sorted((root / split / name).iterdir())}
            write_tar(root / split / f'{name}.tar', images)
            shutil.rmtree(root / split / name)
    return root


def assert_lists_as_the_folder(folder, data):
    for split in ('train', 'val'):
        classes, samples = scan_split(folder, split)
        listing = open_split(data, split, None if split == 'train' else classes)
        found, listed = listing.classes, listing.samples
        assert (found, listed) == (classes, samples)
        assert [file_bytes(listing.reader.open(i, path)) for i, (path, _) in enumerate(listed)] == \
               [(folder / path).read_bytes() for path, _ in samples]


def test_per_class_tars_beside_class_folders_are_read_with_them(folder, tmp_path):
    """A per-class tar beside class folders was left out (2 classes where there were 3, and val's n003 folder called
    a class the training split lacks); an empty lost+found made a split of per-class tars a folder split."""
    mixed = with_class_tars(folder, tmp_path / 'mixed', ['n003'])
    (mixed / 'train' / '.DS_Store').write_bytes(b'\0')  # hidden, lost+found, empty folders and the index: ignored
    (mixed / 'train' / 'lost+found').mkdir()
    (mixed / 'train' / 'n000_empty').mkdir()
    assert_lists_as_the_folder(folder, mixed)
    assert (mixed / 'train' / 'tars.index.npz').is_file()
    assert_lists_as_the_folder(folder, mixed)  # again, beside its index
    with pytest.raises(DataError, match=r'train holds tars \(n003.tar\), which this command does not read'):
        scan_split(mixed, 'train')  # the class folders' reader alone (benchmark_loop's) does not drop them either

    tars = with_class_tars(folder, tmp_path / 'tars', CLASSES)
    (tars / 'train' / 'lost+found').mkdir()
    assert_lists_as_the_folder(folder, tars)

    shutil.copytree(folder / 'train' / 'n003', mixed / 'train' / 'n003')  # extracted, the tar kept
    with pytest.raises(DataError, match=r'train: the class n003 is both a folder \(n003/\) and a tar \(n003.tar\)'):
        open_split(mixed, 'train')


@pytest.mark.parametrize('layout', ['class folders', 'per-class tars'])
@pytest.mark.parametrize('entry, says', [
    ('n004.TAR', 'a tar not named .tar: rename it n004.tar'),
    ('n004.tar.gz', 'a compressed tar: gunzip it'),
    ('n004.tgz', 'a compressed tar: gunzip it'),
    ('notes.txt', 'neither a class folder nor a .tar file'),
    ('n004.tar', 'a link to nothing'),
    ('x_1.JPEG', 'image x_1.JPEG is directly in the split folder, in no class folder'),
    ('n004', r'n004 holds no image the suite reads \(its files: images/;'),
])
def test_a_split_folders_entry_neither_read_nor_ignored_is_named(folder, tmp_path, layout, entry, says):
    """Each was skipped silently (a class lost): only class folders and exactly-.tar files were looked at."""
    data = with_class_tars(folder, tmp_path / 'data', CLASSES if layout == 'per-class tars' else [])
    train = data / 'train'
    image = folder / 'train' / 'n001' / 'n001_1.JPEG'
    a_tar = write_tar(tmp_path / 'n004.tar', {'n004_1.JPEG': image.read_bytes()})
    if entry == 'n004.tar':
        os.symlink(tmp_path / 'absent.tar', train / entry)
    elif entry == 'n004':
        (train / entry / 'images').mkdir(parents=True)
        shutil.copy(image, train / entry / 'images')
    elif entry.endswith(('gz', 'tgz')):
        gzipped(a_tar, train / entry)
    else:
        shutil.copy(image if entry.endswith('JPEG') else a_tar, train / entry)
    with pytest.raises(DataError, match=says) as error:
        open_split(data, 'train')
    assert f'{train}/{entry}' in str(error.value) or f'{train}: image {entry}' in str(error.value)
    assert '\n' not in str(error.value)


def test_a_split_tar_the_reader_does_not_take_is_named_with_the_layouts(folder, tmp_path):
    """`train.tar.gz` was reported as "no image folder at D/train", naming neither the file nor the tar layouts."""
    data = tmp_path / 'data'
    shutil.copytree(folder / 'val', data / 'val')
    split_tars(folder / 'train', tmp_path / 'train.tar', 'class-folders')
    found = {'train.tar.gz': 'a compressed tar: gunzip it (the reader reads uncompressed tars in place)',
             'train.TAR': 'a tar not named .tar: rename it train.tar', 'train': 'neither a folder nor a .tar file'}
    for name, says in found.items():
        if name.endswith('gz'):
            gzipped(tmp_path / 'train.tar', data / name)
        else:
            shutil.copy(tmp_path / 'train.tar', data / name)
        with pytest.raises(DataError) as error:
            open_split(data, 'train')
        assert str(error.value) == (f'{data / name}: {says}; the split train is read from the folder {data / "train"} '
                                    f'(class folders or tars) or the tar {data / "train.tar"} (docs/imagenet.md)')
        (data / name).unlink()
    (data / 'train.tar.index.npz').write_bytes(b'')  # the index of a tar since removed: no split either
    with pytest.raises(DataError, match=f'no image folder at {data / "train"}'):
        open_split(data, 'train')


def test_each_tar_holds_one_layout_and_every_image_in_it_is_read(folder, tmp_path):
    """A flat image in a shard made a class named after the shard; a per-class tar of images/ a class `images`."""
    image = (folder / 'train' / 'n001' / 'n001_1.JPEG').read_bytes()
    shards = tmp_path / 'shards'
    split_tars(folder / 'train', shards / 'train', 'shards')
    split_tars(folder / 'val', shards / 'val.tar', 'class-folders')
    first = shards / 'train' / 'shard-000000.tar'
    members = tar_files(first)
    write_tar(first, {**members, '.ipynb_checkpoints/n001_1.JPEG': image})  # a hidden folder: no class, as on disk
    assert_lists_as_the_folder(folder, shards)
    write_tar(first, {**members, 'stray.JPEG': image})
    with pytest.raises(DataError, match=rf'^{first}: flat images \(stray.JPEG\) beside images in class folders \(n00'):
        open_split(shards, 'train')
    write_tar(first, {**members, 'n001/sub/n001_9.JPEG': image})
    with pytest.raises(DataError, match=rf'^{first}: image n001/sub/n001_9.JPEG is in a folder inside a class'):
        open_split(shards, 'train')

    per_class = with_class_tars(folder, tmp_path / 'per-class', CLASSES)
    fox = {f.name: f.read_bytes() for f in sorted((folder / 'train' / 'n003').iterdir())}
    write_tar(per_class / 'train' / 'n003.tar', {f'images/{name}': data for name, data in fox.items()})
    with pytest.raises(DataError, match=r'train: n001.tar is a per-class tar \(flat images: n001_0.png\), n003.tar a '
                                        r'shard \(images in class folders: images/n003_0.png\)'):
        open_split(per_class, 'train')
    mixed = with_class_tars(folder, tmp_path / 'mixed', ['n003'])
    for tars in (per_class, mixed):  # made with `tar cf n003.tar n003/`: its images in a folder named as the tar
        write_tar(tars / 'train' / 'n003.tar', {f'n003/{name}': data for name, data in fox.items()})
        assert_lists_as_the_folder(folder, tars)
    write_tar(mixed / 'train' / 'n003.tar', {f'images/{name}': data for name, data in fox.items()})
    with pytest.raises(DataError, match=r'n003.tar holds class folders \(images/n003_0.png\) beside the class folder '
                                        r'n001/: beside class folders a tar is one class of flat images'):
        open_split(mixed, 'train')

    # inside the ILSVRC2012 training tar: a compressed per-class tar, one of GIFs alone
    ilsvrc = tmp_path / 'ilsvrc'
    split_tars(folder / 'train', ilsvrc / 'train.tar', 'ilsvrc')
    inner = tar_files(ilsvrc / 'train.tar')
    write_tar(tmp_path / 'n003.tar', {'n003_0.gif': b'GIF89a'})
    for name, says in (('n003.tar.gz', 'member n003.tar.gz is a compressed tar: gunzip it'),
                       ('n003.tar', r':n003.tar holds no image the suite reads \(its files: .gif;')):
        content = gzipped(tmp_path / 'n003.tar', tmp_path / 'gz').read_bytes() if name.endswith('gz') else \
            (tmp_path / 'n003.tar').read_bytes()
        write_tar(ilsvrc / 'train.tar', {'n001.tar': inner['n001.tar'], 'n002.tar': inner['n002.tar'], name: content})
        with pytest.raises(DataError, match=rf'^{ilsvrc / "train.tar"}:? ?{says}'):
            open_split(ilsvrc, 'train')


def replace_keeping_size_and_time(path, members: dict[str, bytes], in_place: bool) -> None:
    """`path` rewritten with `members` (the same size), its times set back: `cp -p` or rsync (a new file renamed
    over it) or `touch -r` after an overwrite (the same inode)."""
    before = os.stat(path)
    time.sleep(0.05)  # past the file system's clock tick: the status-change time moves on
    written = write_tar(path if in_place else path.with_name('.new.tar'), members)
    os.utime(written, ns=(before.st_atime_ns, before.st_mtime_ns))
    if not in_place:
        os.replace(written, path)
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert (after.st_ino, after.st_ctime_ns) != (before.st_ino, before.st_ctime_ns)


@pytest.mark.parametrize('in_place', [False, True], ids=['cp -p', 'touch -r'])
def test_a_tar_replaced_under_the_same_size_and_time_is_indexed_again(folder, tmp_path, in_place):
    """It was read through the old index: every image's bytes from another's place."""
    data = tar_data(folder, tmp_path, 'per-class')
    open_split(data, 'train')
    swapped = dict(reversed(tar_files(data / 'train' / 'n002.tar').items()))  # the same members, another order
    replace_keeping_size_and_time(data / 'train' / 'n002.tar', swapped, in_place)
    listing = open_split(data, 'train')
    samples = listing.samples
    read = {path.rsplit('/', 1)[1]: file_bytes(listing.reader.open(i, path))
            for i, (path, _) in enumerate(samples) if path.startswith('train/n002/')}
    assert read == swapped


def test_train_cls_trains_on_a_per_class_tar_beside_class_folders_and_refuses_a_stray_image_in_a_shard(
        folder, tmp_path):
    """The tar's class was dropped (a 2-way head, exit 0); the stray image was a class of its own (a 4-way head)."""
    data = with_class_tars(folder, tmp_path / 'mixed', ['n003'])
    args = [*TINY_DEIT, '--no-token-labeling', '--img-size', '32', '--batch-size', '4', '--epochs', '1',
            '--warmup-epochs', '0', '--workers', '0', '--device', 'cpu', '--ema-decay', '0']
    result = succeeded(run_tool('train_cls.py', [*args, '--data-dir', data, '--output', tmp_path / 'run']))
    assert f'{data / "train"}: listed 15 images' in result.stdout
    checkpoint = torch.load(tmp_path / 'run' / 'last.pth', weights_only=True)
    assert checkpoint['args']['classes'] == list(CLASSES) and checkpoint['state_dict']['head.weight'].shape[0] == 3

    shards = tmp_path / 'shards'
    split_tars(folder / 'train', shards / 'train', 'shards')
    split_tars(folder / 'val', shards / 'val.tar', 'class-folders')
    first = shards / 'train' / 'shard-000000.tar'
    write_tar(first, {**tar_files(first), 'stray.JPEG': b'\xff\xd8'})
    message = one_line_error(run_tool('train_cls.py', [*args, '--data-dir', shards, '--output', tmp_path / 'run2']))
    assert f'{first}: flat images (stray.JPEG) beside images in class folders' in message, message


def test_a_hidden_file_in_a_class_folder_or_a_tar_is_no_image(tmp_path):
    """macOS leaves `._NAME.JPEG` resource files beside a copy's images: read as images, they failed to decode."""
    data = make_image_folder(tmp_path / 'data')
    first = sorted((data / 'train').iterdir())[0]
    (first / '._resource.JPEG').write_bytes(b'\x00\x05\x16\x07 not an image')
    classes, samples = scan_split(data, 'train')
    assert not any('._' in path for path, _ in samples) and len(samples) == 24
    shards = tmp_path / 'shards' / 'train'
    shards.mkdir(parents=True)
    with tarfile.open(shards / 'shard-0000.tar', 'w') as tar:
        for folder in sorted((data / 'train').iterdir()):
            tar.add(folder, arcname=folder.name)
    listed = open_split(tmp_path / 'shards', 'train')
    assert listed.classes == classes and len(listed.samples) == 24
