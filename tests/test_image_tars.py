"""ImageNet-layout splits read in place from tars: the same listing, bytes and items as the folder; the index kept
and rebuilt; damaged tars named."""
from __future__ import annotations

import gzip
import os
import shutil
import tarfile

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torchvision import transforms

import backbones.common.image_tars as image_tars
from backbones.common.errors import DataError
from backbones.common.image_tars import file_bytes, image_file, list_split
from backbones.common.images import ImageReadError, scan_split
from classification.data.folders import ImageFolderDataset
from helpers.cls_data import make_image_folder, split_tars, write_tar
from helpers.commands import one_line_error, run_tool


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
        found, listed, members = list_split(data, split, classes)
        assert (found, listed) == (classes, samples)  # same paths (the store's keys), order and labels
        assert [file_bytes(image_file(data, path, members, i)) for i, (path, _) in enumerate(listed)] == \
               [(folder / path).read_bytes() for path, _ in samples]
    assert list_split(folder, 'train')[2] is None  # folders read as before


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
    monkeypatch.setattr(image_tars, 'build_index', lambda tars: builds.append(len(tars)) or build(tars))
    first = list_split(data, 'train')
    assert (data / 'train' / 'tars.index.npz').is_file() and builds == [3]
    assert list_split(data, 'train')[1] == first[1] and builds == [3]  # read from beside the tars
    shutil.copy(folder / 'train' / 'n002' / 'n002_1.JPEG', tmp_path / 'n001_9.JPEG')
    write_tar(data / 'train' / 'n001.tar', {'n001_9.JPEG': (tmp_path / 'n001_9.JPEG').read_bytes()})
    classes, samples, members = list_split(data, 'train')
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
    assert list_split(data, 'train')[1] == samples and builds == [3, 3, 3]
    assert list_split(data, 'train')[1] == samples and builds == [3, 3, 3]
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
            list_split(data, 'train')
        assert str(data / 'train.tar') in str(error.value) and '\n' not in str(error.value)
    # the validation images as released: one flat tar, no class folders
    write_tar(data / 'val.tar', {'ILSVRC2012_val_00000001.JPEG': intact[first_image:first_image + 10]})
    with pytest.raises(DataError, match='ILSVRC2012_val_00000001.JPEG is not in a class folder') as error:
        list_split(data, 'val')
    assert str(data / 'val.tar') in str(error.value)

    # a tar cut after it was indexed (under the same size and time): the image read names the tar and the image
    (data / 'train.tar').write_bytes(intact)
    _, samples, members = list_split(data, 'train')
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
    assert list_split(tmp_path / 'flat_test.tar', 'train')[0] == list_split(folder, 'train')[0]
    write_tar(tmp_path / 'flat_train.tar', {**files, 'train/x_1.JPEG': image})
    with pytest.raises(DataError, match='image train/x_1.JPEG is directly in the split folder train'):
        list_split(tmp_path / 'flat_train.tar', 'train')
    data = tar_data(folder, tmp_path / 'idx', 'per-class')
    listed = list_split(data, 'train')[1]
    index = data / 'train' / 'tars.index.npz'
    index.write_bytes(index.read_bytes()[:300])  # a zip cut short
    assert list_split(data, 'train')[1] == listed
    (tmp_path / 'gz').mkdir()
    with gzip.open(tmp_path / 'gz' / 'train.tar', 'wb') as f:
        f.write((tmp_path / 'flat_test.tar').read_bytes())
    with pytest.raises(DataError, match='train.tar is gzip-compressed'):
        list_split(tmp_path / 'gz', 'train')
