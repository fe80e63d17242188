"""The job's size: loader workers share the dataset index instead of copying it, one process per node verifies the
token-label store (and a restart need not), one process lists the data folder, and the rehearsal tool's figures."""
from __future__ import annotations

import json
import os
import shutil
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from torch.utils.data import DataLoader, Dataset

from classification.data.folders import ImageFolderDataset
from classification.engine.memory import ChildMemory
from classification.sources.path_list import PathList
from classification.studies.results_file import check_envelope
from classification.token_labeling.label_store import PATHS, VERIFIED, TokenLabelError, TokenLabelStore
from helpers.commands import ENV, ROOT, free_port, run_python, succeeded

ENTRIES = 300_000  # index entries of the memory test: a quarter of ImageNet's, no image files
GROWTH_BOUND = 10 * 1024 ** 2  # USS a worker may gain over one epoch of the index


def test_path_list_round_trips_and_finds_paths():
    names = ['train/a/x.JPEG', 'train/b/\udce9t\u00e9.jpg', 'train/a/x.JPEG', '', 'val/c/y\u2028z.png']
    paths = PathList(names)
    assert list(paths) == names and [paths[i] for i in range(-5, 5)] == names + names
    assert paths[1:4] == names[1:4] and isinstance(paths[1:4], PathList)
    assert paths.position('train/a/x.JPEG') == 0 and paths.position('val/c/y\u2028z.png') == 4
    assert paths.find(['', 'nope', names[1]]).tolist() == [3, -1, 1]
    assert paths.find(paths).tolist() == [0, 1, 2, 3, 4]
    assert 'nope' not in paths and names[1] in paths
    with pytest.raises(IndexError):
        paths[5]


class ReadsIndex(Dataset):
    """Each item reads one entry of an index (as ImageFolderDataset.__getitem__ does before it opens the file)."""

    def __init__(self, read, size: int) -> None:
        self.read, self.size = read, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> int:
        path, label = self.read(i)
        return len(path) + label


def worker_growth(read) -> list[int]:
    """USS each of two loader workers gains over one shuffled pass over the index, from its second batch to its last.
    (Batches come from the workers in turn: at the first batch the second worker may still be making its first,
    copying the interpreter's pages it touches, 12 MB on a slow machine; at the fourth both have made two.)"""
    loader = DataLoader(ReadsIndex(read, ENTRIES), batch_size=256, shuffle=True, num_workers=2, collate_fn=sum)
    memory = ChildMemory()
    for n, _ in enumerate(loader, 1):
        if n in (4, len(loader)):
            memory.sample()
    assert len(memory.first) == 2
    return list(memory.growth().values())


def test_loader_workers_share_the_dataset_index():
    classes = [f'n{c:08d}' for c in range(1000)]
    samples = [(f'train/{classes[i % 1000]}/{classes[i % 1000]}_{i}.JPEG', i % 1000) for i in range(ENTRIES)]
    # the index as it was: a list of (path, label) tuples, read through each entry's Python objects
    copied = worker_growth(samples.__getitem__)
    index = SimpleNamespace(paths=PathList(path for path, _ in samples),
                            labels=np.array([label for _, label in samples], dtype=np.int16))
    del samples
    shared = worker_growth(partial(ImageFolderDataset.sample, index))
    assert max(copied) > GROWTH_BOUND, f'the baseline did not grow ({copied}): the test cannot tell'
    assert max(shared) < GROWTH_BOUND, f'loader workers copied the index: USS growth {shared} bytes'


def aged_copy(store: Path, target: Path) -> Path:
    """A copy of a store whose files were last changed a minute ago (a store made just now is not recorded as
    verified: its time stamps could still hide a change)."""
    shutil.copytree(store, target, ignore=shutil.ignore_patterns(VERIFIED))  # a copy, unverified yet
    old = time.time() - 60
    for path in [target, *target.rglob('*')]:
        os.utime(path, (old, old))
    return target


def test_a_verified_store_is_not_read_again_until_a_file_changes(labeled_images, tmp_path):
    _, labels = labeled_images
    store = aged_copy(labels, tmp_path / 'store')
    assert TokenLabelStore(store).verified_now and (store / VERIFIED).exists()
    assert not TokenLabelStore(store).verified_now  # the record stands for the files as they are
    assert TokenLabelStore(store, verify=False).paths == TokenLabelStore(labels, verify=False).paths
    with open(store / 'scores.npy', 'r+b') as f:  # the same size, another row
        f.seek(-2, os.SEEK_END)
        f.write(b'\x00\x7c')
    with pytest.raises(TokenLabelError, match='do not match what was written'):
        TokenLabelStore(store)
    copy = tmp_path / 'copy'
    shutil.copytree(labels, copy, ignore=shutil.ignore_patterns(VERIFIED))  # a store just made has no record
    changed = time.time() + 60  # not yet RACY_SECONDS old however loaded the machine (copytree keeps the times)
    for path in copy.rglob('*'):
        os.utime(path, (changed, changed))
    assert TokenLabelStore(copy).verified_now and not (copy / VERIFIED).exists()


def run_two_processes(script: str, *args, folder: Path) -> list[dict]:
    """`torchrun --nproc-per-node 2` of a script whose processes each call `report(info, **values)`; those values by
    rank. (Each writes a file of its own: two processes printing long lines to one pipe interleave them.)"""
    folder.mkdir(exist_ok=True)
    for old in folder.glob('rank*.json'):  # a run's reports, never an earlier run's
        old.unlink()
    (folder / 'script.py').write_text(REPORT + script)
    succeeded(run_python(['-m', 'torch.distributed.run', '--nproc-per-node', '2', '--master-port', free_port(),
                          folder / 'script.py', folder, *args]))
    return [{'rank': rank, **json.loads((folder / f'rank{rank}.json').read_text())} for rank in (0, 1)]


REPORT = '''
import json, sys
from pathlib import Path
def report(info, **values):
    Path(sys.argv[1], f'rank{info.rank}.json').write_text(json.dumps(values))
'''


OPEN_STORE = '''
from backbones.common.distributed import run_distributed
from classification.token_labeling.label_store import open_store
run_distributed(lambda info: report(info, verified=open_store(sys.argv[2], True, info).verified_now,
                                    rows=len(open_store(sys.argv[2], False, info))), 'cpu')
'''


@pytest.mark.slow
def test_one_process_per_node_verifies_the_store(labeled_images, tmp_path):
    _, labels = labeled_images
    store = aged_copy(labels, tmp_path / 'store')
    rows = len(TokenLabelStore(labels, verify=False))
    first = run_two_processes(OPEN_STORE, store, folder=tmp_path)
    assert [(p['verified'], p['rows']) for p in first] == [(True, rows), (False, rows)]
    again = run_two_processes(OPEN_STORE, store, folder=tmp_path)
    assert [p['verified'] for p in again] == [False, False]  # recorded


LIST_SPLIT = '''
import classification.data.folders as data
from backbones.common.distributed import run_distributed
from backbones.common.errors import DataError
scans = []
listed = data.open_split
data.open_split = lambda *args: scans.append(args) or listed(*args)

def run(info):
    try:
        dataset = data.ImageFolderDataset(sys.argv[2], sys.argv[3], None, info=info)
        report(info, scans=len(scans), paths=list(dataset.paths), labels=dataset.labels.tolist(),
               classes=dataset.classes)
    except DataError as e:
        report(info, scans=len(scans), error=str(e))

run_distributed(run, 'cpu')
'''


@pytest.mark.slow
def test_the_main_process_lists_the_split_for_all(labeled_images, tmp_path):
    data, _ = labeled_images
    alone = ImageFolderDataset(data, 'train', None)
    ranks = run_two_processes(LIST_SPLIT, data, 'train', folder=tmp_path)
    assert [rank['scans'] for rank in ranks] == [1, 0]
    for rank in ranks:
        assert (rank['paths'], rank['labels'], rank['classes']) == (list(alone.paths), alone.labels.tolist(),
                                                                    alone.classes)
    # no such split: every process says so
    failed = run_two_processes(LIST_SPLIT, data, 'test', folder=tmp_path / 'missing')
    assert failed[0]['error'] == failed[1]['error'] and str(data / 'test') in failed[0]['error']


@pytest.mark.slow
def test_the_rehearsal_measures_every_stage_at_a_small_scale(tmp_path):
    out = tmp_path / 'figures.json'
    succeeded(run_python([ROOT / 'tools' / 'rehearse_scale.py', '--root', tmp_path / 'rehearsal', '--scale', '0.001',
                          '--stages', 'build', 'listing', 'import', 'store', 'dataset', 'pass', 'val-listing',
                          'tar-build', 'tar-listing', 'tar-pass', 'tar-vs-folders', '--batch-size', '64',
                          '--json', out], env=ENV))
    document = check_envelope(json.loads(out.read_text()), str(out))
    assert document['study'] == 'scale_rehearsal' and document['source'].startswith('python tools/rehearse_scale.py ')
    figures = document['figures']
    train = round(1_281_167 * 0.001)  # 1,281 images over 1,000 classes: 281 classes hold two
    assert figures['listing']['files listed'] == figures['import']['files imported'] == train
    assert figures['val-listing']['files listed'] == 1000  # at least one per class
    assert figures['import']['rows equal to the directly written store'] is True
    assert figures['pass']['images read (shuffled order)'] == train // 64 * 64
    growth = [value for key, value in figures['pass'].items() if key.endswith('growth over the pass')]
    assert len(growth) == 2 and max(growth) < GROWTH_BOUND
    # the same images from 1,000 per-class tars (and their index), read by both readers in turn
    assert figures['tar-listing']['images listed'] == train
    assert figures['tar-listing']['files of the training split on disk (tars and index)'] == 1001
    assert figures['tar-pass']['images read (shuffled order)'] == train // 64 * 64
    compared = figures['tar-vs-folders']
    assert compared['folders: images'] == compared['tars: images'] == 4 * 19 * 64  # 4 rounds of 19 timed batches
    lines = (tmp_path / 'rehearsal' / 'store' / PATHS).read_text().splitlines()
    assert len(lines) == train and lines[0] == 'train/n00000000/n00000000_0.JPEG'
