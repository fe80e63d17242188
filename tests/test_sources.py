"""The classification data sources' seam: a split is listed and read through one interface, the sources asked in
order with the class folders last; a source of a test's own, registered from one module, makes token labels,
trains with them, and resumes exactly after a stop."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import timm
import torch

import helpers.list_source  # noqa: F401  (registers the list-file source in this process)
from backbones.common.distributed import DistInfo
from classification.data.folders import ImageFolderDataset
from classification.sources.class_folders import ClassFolders
from classification.sources.source import open_split, sources
from classification.sources.tars import Tars
from classification.token_labeling.annotate import generate_token_labels
from classification.token_labeling.label_store import TokenLabelStore
from helpers.cls_data import make_image_folder
from helpers.commands import ROOT, run_tool, succeeded
from helpers.models import TINY_DEIT
from helpers.training_runs import assert_same_run, resume_after_stops

LIST_SOURCE = ROOT / 'tests' / 'helpers' / 'list_source.py'  # train_cls with the source registered


def listed_copy(data: Path, out: Path) -> dict[str, Path]:
    """The folder's images in one flat folder, out/pool, each split listed in out/SPLIT.list (`PATH CLASS`, in no
    particular order); returns where each listed name came from."""
    (out / 'pool').mkdir(parents=True)
    origin = {}
    for split in ('train', 'val'):
        lines = []
        for image in sorted(p for p in (data / split).rglob('*') if p.is_file()):
            name = f'pool/{split}_{image.name}'
            shutil.copy(image, out / name)
            lines.append(f'{name} {image.parent.name}')
            origin[name] = image
        (out / f'{split}.list').write_text('\n'.join(reversed(lines)) + '\n')
    return origin


def test_sources_are_asked_in_registration_order_the_class_folders_last():
    kinds = [type(source) for source in sources()]
    assert kinds[-1] is ClassFolders and kinds.index(Tars) < kinds.index(ClassFolders)
    assert kinds.count(ClassFolders) == 1


def test_a_split_lists_and_reads_the_same_through_any_source(tmp_path):
    """The same images listed from class folders and from a list file: the same classes and labels, each image's
    bytes read through its source's reader."""
    folders, listed = make_image_folder(tmp_path / 'folders'), tmp_path / 'listed'
    origin = listed_copy(folders, listed)
    by_folder, by_list = open_split(folders, 'train'), open_split(listed, 'train')
    assert by_list.classes == by_folder.classes and all(name.startswith('pool/') for name, _ in by_list.samples)
    assert dict(by_list.samples) == {f'pool/train_{Path(name).name}': label for name, label in by_folder.samples}
    for index, (name, _) in enumerate(by_list.samples):
        assert Path(by_list.reader.open(index, name)).read_bytes() == origin[name].read_bytes()
    dataset = ImageFolderDataset(listed, 'val', transform=lambda image: image.size, classes=by_list.classes)
    assert len(dataset) == 12 and dataset[0]['label'] == dict(open_split(listed, 'val').samples)[dataset.paths[0]]


def test_an_entry_meant_for_the_split_that_is_not_read_is_named(tmp_path, caplog):
    """A tar of the split beside its class folders (the folder is read, as the documented order says) and a list file
    beside a folder: each entry left unread is named in a warning; the one read is not."""
    import tarfile
    data = make_image_folder(tmp_path / 'data')
    with tarfile.open(data / 'train.tar', 'w') as tar:
        tar.add(data / 'train', arcname='.')
    (data / 'train.list').write_text('')
    with caplog.at_level('WARNING'):
        listing = open_split(data, 'train')
    assert listing.read_from in (data / 'train', data / 'train.list')
    unread = sorted({data / 'train', data / 'train.tar', data / 'train.list'} - {listing.read_from})
    for entry in unread:
        assert f'{entry} is not read: the split train is read from {listing.read_from}' in caplog.text
    assert f'{listing.read_from} is not read' not in caplog.text


@pytest.mark.slow  # tools run end to end
def test_a_source_registered_in_one_module_trains_with_token_labels_and_resumes_exactly(tmp_path):
    data = tmp_path / 'listed'
    listed_copy(make_image_folder(tmp_path / 'folders'), data)
    torch.manual_seed(0)
    torch.save(timm.create_model('resnet10t', num_classes=3).state_dict(), tmp_path / 'annotator.pth')
    generate_token_labels(data, 'resnet10t', tmp_path / 'labels', DistInfo(),
                          checkpoint=str(tmp_path / 'annotator.pth'), img_size=64, topk=2, workers=0)
    store = TokenLabelStore(tmp_path / 'labels')
    assert len(store.paths) == 24 and all(path.startswith('pool/train_') for path in store.paths)

    args = [*TINY_DEIT, '--data-dir', data, '--token-label-dir', tmp_path / 'labels', '--token-labeling', '--epochs',
            '2', '--workers', '2', '--img-size', '32', '--batch-size', '2', '--lr-base', '1e-3', '--lr-base-batch', '4',
            '--warmup-epochs', '1', '--device', 'cpu', '--augment', 'batched']
    succeeded(run_tool(LIST_SOURCE, [*args, '--output', tmp_path / 'straight']))
    points = resume_after_stops(LIST_SOURCE, [*args, '--output', tmp_path / 'cut'], tmp_path / 'cut', stops=1)
    assert all(batch > 0 for _, batch in points)
    assert_same_run(tmp_path / 'straight', tmp_path / 'cut', epochs=2)
