"""timm's and the Hub's webdataset shards (KEY.EXT with KEY.cls and/or KEY.json, _info.json beside them) read as
published: the same classes, labels and bytes as the folder they were made from, whichever way the split is found;
every inconsistency a one-line error naming the shard and the key; a run from shards the same as a run from folders,
resumed exactly after a SIGTERM, with token labels keyed by shard and key."""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import timm
import torch
import yaml

import classification.sources.tars as image_tars
from backbones.common.distributed import DistInfo
from backbones.common.errors import DataError
from backbones.common.images import file_bytes, scan_split
from classification.sources.class_folders import ClassFolders
from classification.sources.source import open_split, sources
from classification.sources.tars import Tars
from classification.sources.wds import WebDatasetShards
from classification.token_labeling.annotate import generate_token_labels
from classification.token_labeling.label_store import TokenLabelStore
from helpers.cls_data import CLASSES, make_image_folder, tar_files, wds_shards, write_tar
from helpers.commands import run_tool, succeeded
from helpers.models import TINY_DEIT
from helpers.training_runs import assert_same_run, resume_after_stops


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp('wds') / 'folder', per_class={'train': 5, 'val': 2})


def as_split_folders(shards):
    """The shards moved into split folders named as the Hub's, D/train/ and D/validation/, without the info file."""
    (shards / '_info.json').unlink()
    for name in ('train', 'validation'):
        (shards / name).mkdir()
        for shard in shards.glob(f'imagenet-{name}-*.tar'):
            shard.rename(shards / name / shard.name)
    return shards


def as_yaml(shards):
    info = shards / '_info.json'
    (shards / '_info.yaml').write_text(yaml.safe_dump(json.loads(info.read_text())))
    info.unlink()
    return shards


LAYOUTS = {
    'info.json, .cls': lambda folder, out: wds_shards(folder, out),
    'info.yaml, .cls': lambda folder, out: as_yaml(wds_shards(folder, out)),
    'info.json, .json alone': lambda folder, out: wds_shards(folder, out, with_json=True, with_cls=False),
    'no info, .cls and .json': lambda folder, out: wds_shards(folder, out, with_json=True, info=False),
    'no info, numbered classes': lambda folder, out: wds_shards(folder, out, info=False),
    'split folders': lambda folder, out: as_split_folders(wds_shards(folder, out, shards=3)),
}


@pytest.mark.parametrize('layout', LAYOUTS)
def test_shards_list_and_read_as_the_folder_they_were_made_from(folder, tmp_path, layout):
    """The labels are the shards' class indices, the order the folder's, each image's bytes its file's; images are
    named by shard and member. The split folder's flat shards were per-class tars (a class per shard)."""
    data = LAYOUTS[layout](folder, tmp_path / 'shards')
    numbered = layout in ('no info, numbered classes', 'split folders')  # no class names anywhere
    for split in ('train', 'val'):
        classes, samples = scan_split(folder, split)
        listing = open_split(data, split, None if split == 'train' else classes)
        assert listing.classes == (['0', '1', '2'] if numbered and split == 'train' else classes)
        assert [label for _, label in listing.samples] == [label for _, label in samples]
        assert [name.rsplit('/', 1)[1] for name, _ in listing.samples] == \
               [path.rsplit('/', 1)[1] for path, _ in samples]
        prefix = f'{"validation" if split == "val" else split}/' if layout == 'split folders' else ''
        assert all(name.startswith(f'{prefix}imagenet-') and '.tar/' in name for name, _ in listing.samples)
        assert [file_bytes(listing.reader.open(i, name)) for i, (name, _) in enumerate(listing.samples)] == \
               [(folder / path).read_bytes() for path, _ in samples]
        shard, member = listing.samples[0][0].split('.tar/')
        assert file_bytes(listing.reader.open(0, listing.samples[0][0])) == tar_files(data / f'{shard}.tar')[member]


def test_the_index_is_kept_beside_the_shards(folder, tmp_path, monkeypatch):
    data = wds_shards(folder, tmp_path / 'shards')
    builds = []
    build = image_tars.build_index
    monkeypatch.setattr(image_tars, 'build_index', lambda tars, shards: builds.append(shards) or build(tars, shards))
    first = open_split(data, 'train')
    assert open_split(data, 'train').samples == first.samples and builds == [True]
    assert (data / 'wds-train.index.npz').is_file()


def shard_of(data, split='train', number=0):
    return data / f'imagenet-{"validation" if split == "val" else split}-{number:04d}.tar'


def rewrite(shard, change):
    """The shard written again with its members changed by `change` (members -> members)."""
    write_tar(shard, change(tar_files(shard)))


def first_key(shard) -> str:
    return next(name for name in tar_files(shard) if name.endswith('.cls'))[:-len('.cls')]


def edit_info(data, change):
    info = json.loads((data / '_info.json').read_text())
    change(info)
    (data / '_info.json').write_text(json.dumps(info))


def without(members, name):
    return {k: v for k, v in members.items() if k != name}


REFUSALS = {
    # name: (change the shards, what the error says: {key} the first key of the first training shard)
    'an image without a label': (
        lambda data, key: rewrite(shard_of(data), lambda m: without(m, f'{key}.cls')),
        'key {key}: the image has no label (no KEY.cls, no "label" in a KEY.json)'),
    'a .cls that is no integer': (
        lambda data, key: rewrite(shard_of(data), lambda m: {**m, f'{key}.cls': b'n001'}),
        "{key}.cls: 'n001' is not a class index (not an integer)"),
    'a JSON label that is text': (  # "1" may be the class named 1 as well as index 1: it was read as the index
        lambda data, key: rewrite(shard_of(data), lambda m: {
            **without(m, f'{key}.cls'), f'{key}.json': json.dumps({'label': m[f'{key}.cls'].decode()}).encode()}),
        "{key}.json: '{label}' is not a class index (a JSON text, not a number)"),
    'a label outside the classes': (
        lambda data, key: rewrite(shard_of(data), lambda m: {**m, f'{key}.cls': b'3\n'}),
        'key {key}: class index 3 is outside the 3 classes of {data}/_info.json ("classes")'),
    'a negative label': (
        lambda data, key: rewrite(shard_of(data), lambda m: {**m, f'{key}.cls': b'-1'}),
        'key {key}: class index -1 is outside the 3 classes'),
    'the .cls and the .json disagree': (
        lambda data, key: rewrite(shard_of(data), lambda m: {
            **m, f'{key}.json': json.dumps({'label': (int(m[f'{key}.cls']) + 1) % 3}).encode()}),
        'key {key}: the .cls says class {label}, the .json class {other}'),
    'a class name that is not the list\'s': (
        lambda data, key: rewrite(shard_of(data), lambda m: {
            **m, f'{key}.json': json.dumps({'label': int(m[f'{key}.cls']), 'class_name': 'fox'}).encode()}),
        "key {key}: class {label} is named 'fox', the class list says"),
    'a member neither image nor label': (
        lambda data, key: rewrite(shard_of(data), lambda m: {**m, f'{key}.txt': b'a caption'}),
        'member {key}.txt is neither an image'),
    'a label without an image': (
        lambda data, key: rewrite(shard_of(data), lambda m: {**m, 'stray.cls': b'0'}),
        'key stray: the label stray.cls has no image'),
    'two images under one key': (
        lambda data, key: rewrite(shard_of(data), lambda m: {**m, f'{key}.webp': b'RIFF'}),
        'key {key}: two images'),
    'a shard length the shard does not have': (
        lambda data, key: edit_info(data, lambda info: info['splits']['train']['shard_lengths'].__setitem__(0, 99)),
        ' samples, where {data}/_info.json says 99'),
    'a sample count the shards do not have': (
        lambda data, key: edit_info(data, lambda info: info['splits']['train'].__setitem__('num_samples', 14)),
        'the split train holds 15 samples in its shards, the file says 14'),
    'a shard the info file names twice': (
        lambda data, key: edit_info(data, lambda info: info['splits']['train']['filenames'].append(
            info['splits']['train']['filenames'][0])),
        '{data}/_info.json: the split train names the shard imagenet-train-0000.tar twice'),
    'shard lengths that are no list': (
        lambda data, key: edit_info(data, lambda info: info['splits']['train'].__setitem__('shard_lengths', 15)),
        '{data}/_info.json: the split train\'s "shard_lengths" is \'15\', not a list of integers'),
    'a sample count that is text': (
        lambda data, key: edit_info(data, lambda info: info['splits']['train'].__setitem__('num_samples', '15')),
        '{data}/_info.json: the split train\'s "num_samples" is \'15\', not an integer'),
    'a shard name in the info file that is no file name': (
        lambda data, key: edit_info(data, lambda info: info['splits']['train']['filenames'].__setitem__(0, None)),
        '{data}/_info.json: the split train names no shards (a list "filenames" of file names)'),
    'classes in the info file as one string, not a list': (  # read letter by letter, the classes were renamed
        lambda data, key: edit_info(data, lambda info: info.__setitem__('classes', 'abc')),
        '{data}/_info.json: "classes" is \'abc\', not a list of class names'),
    'a shard the info file names missing': (
        lambda data, key: shard_of(data, number=1).unlink(),
        'the shard {data}/imagenet-train-0001.tar of the split train is not there'),
}


@pytest.mark.parametrize('case', REFUSALS)
def test_every_inconsistency_of_the_shards_is_one_line_naming_the_shard_and_the_key(folder, tmp_path, case):
    data = wds_shards(folder, tmp_path / 'shards')
    key = first_key(shard_of(data))
    label = int(tar_files(shard_of(data))[f'{key}.cls'])
    change, says = REFUSALS[case]
    change(data, key)
    with pytest.raises(DataError) as error:
        open_split(data, 'train')
    message = str(error.value)
    assert says.format(key=key, label=label, other=(label + 1) % 3, data=data) in message, message
    assert '\n' not in message
    if 'info' not in case and 'count' not in case and 'length' not in case:
        assert message.startswith(f'{shard_of(data)}:'), message


@pytest.mark.parametrize('layout', ['no info, numbered classes', 'split folders'])
def test_a_shard_missing_from_the_numbering_is_named(folder, tmp_path, layout):
    """Without an info file nothing gives the count: a number skipped (a shard an interrupted download left out)
    read the split without its images, with exit code 0."""
    data = LAYOUTS[layout](folder, tmp_path / 'shards') if layout == 'split folders' else \
        wds_shards(folder, tmp_path / 'shards', shards=3, info=False)
    where = data / 'train' if layout == 'split folders' else data
    (where / 'imagenet-train-0001.tar').unlink()
    with pytest.raises(DataError, match=re.escape(f'{where}: the shards skip number 1 after imagenet-train-0000.tar '
                                                  f'(1 number(s) skipped of 0..2)')):
        open_split(data, 'train')


def test_a_validation_label_outside_the_training_classes_is_refused(folder, tmp_path):
    """Without an info file the training split's classes bound the validation split's labels."""
    data = wds_shards(folder, tmp_path / 'shards', info=False)
    key = first_key(shard_of(data, 'val'))
    rewrite(shard_of(data, 'val'), lambda m: {**m, f'{key}.cls': b'5'})
    train = open_split(data, 'train')
    with pytest.raises(DataError, match=rf'key {key}: class index 5 is outside the 3 classes of the training split'):
        open_split(data, 'val', train.classes, 'the training split')


TRAIN = [*TINY_DEIT, '--img-size', '32', '--batch-size', '4', '--epochs', '2', '--warmup-epochs', '1', '--device',
         'cpu', '--ema-decay', '0', '--lr-base', '1e-3', '--lr-base-batch', '4']


@pytest.mark.slow  # tools run end to end
def test_a_run_from_shards_is_the_run_from_the_folder(folder, tmp_path):
    """The same seed, the same images in the same order with the same labels: the same losses, validation and
    weights, bit for bit."""
    shards = wds_shards(folder, tmp_path / 'shards', with_json=True)
    args = [*TRAIN, '--no-token-labeling', '--workers', '0', '--seed', '3']
    succeeded(run_tool('train_cls.py', [*args, '--data-dir', folder, '--output', tmp_path / 'folder_run']))
    result = succeeded(run_tool('train_cls.py', [*args, '--data-dir', shards, '--output', tmp_path / 'shard_run']))
    assert f'{shards / "train"}: listed 15 images' in result.stdout
    assert_same_run(tmp_path / 'folder_run', tmp_path / 'shard_run', epochs=2, images=6)
    checkpoint = torch.load(tmp_path / 'shard_run' / 'last.pth', weights_only=True)
    assert checkpoint['args']['classes'] == list(CLASSES)


@pytest.mark.slow  # tools run end to end
def test_token_labels_of_shard_images_and_a_sigterm_mid_epoch_resumes_exactly(folder, tmp_path):
    """Token labels made from the shards are keyed by shard and key and equal those made from the folder, image by
    image; a run on them stopped by SIGTERM mid-epoch and resumed ends as the run never stopped."""
    shards = wds_shards(folder, tmp_path / 'shards')
    torch.manual_seed(0)
    torch.save(timm.create_model('resnet10t', num_classes=3).state_dict(), tmp_path / 'annotator.pth')
    for data, out in ((shards, 'shard_labels'), (folder, 'folder_labels')):
        generate_token_labels(data, 'resnet10t', tmp_path / out, DistInfo(), checkpoint=str(tmp_path / 'annotator.pth'),
                              img_size=64, topk=2, workers=0)
    by_shards, by_folder = TokenLabelStore(tmp_path / 'shard_labels'), TokenLabelStore(tmp_path / 'folder_labels')
    listed = [name for name, _ in open_split(shards, 'train').samples]
    assert list(by_shards.paths) == listed and all('.tar/' in name for name in listed)
    for name, (path, _) in zip(listed, scan_split(folder, 'train')[1]):
        assert name.rsplit('/', 1)[1] == path.rsplit('/', 1)[1]
        for a, b in zip(by_shards.read(by_shards.row_of(name)), by_folder.read(by_folder.row_of(path))):
            assert np.array_equal(a, b), name

    args = [*TRAIN, '--data-dir', shards, '--token-label-dir', tmp_path / 'shard_labels', '--token-labeling',
            '--workers', '2', '--batch-size', '2', '--augment', 'batched']
    succeeded(run_tool('train_cls.py', [*args, '--output', tmp_path / 'straight']))
    points = resume_after_stops('train_cls.py', [*args, '--output', tmp_path / 'cut'], tmp_path / 'cut', stops=1)
    assert all(batch > 0 for _, batch in points)
    assert_same_run(tmp_path / 'straight', tmp_path / 'cut', epochs=2)


def test_shards_beside_a_split_folder_of_class_folders_are_read_by_the_info_file_and_the_folder_named(
        folder, tmp_path, caplog):
    """The info file names the split: the shards are read, the class folder left unread is named."""
    data = wds_shards(folder, tmp_path / 'shards')
    shutil.copytree(folder / 'train', data / 'train')
    with caplog.at_level('WARNING'):
        listing = open_split(data, 'train')
    assert listing.read_from == data / '_info.json' and all('.tar/' in name for name, _ in listing.samples)
    assert f'{data / "train"} is not read: the split train is read from {data / "_info.json"}' in caplog.text


def test_shards_named_for_a_split_stored_in_class_folders_are_named_unread(folder, tmp_path, caplog):
    """The class folders are read, as the layouts' order says; the shards beside them, read by nothing, are named."""
    data = wds_shards(folder, tmp_path / 'shards', info=False)
    shutil.copytree(folder / 'train', data / 'train')
    with caplog.at_level('WARNING'):
        listing = open_split(data, 'train')
    assert listing.read_from == data / 'train' and not any('.tar/' in name for name, _ in listing.samples)
    assert (f'2 webdataset shard(s) named for the split, {data / "imagenet-train-0000.tar"} ..., are not read: the '
            f'split train is read from {data / "train"}') in caplog.text


def test_a_shard_the_info_file_does_not_list_is_named_unread(folder, tmp_path, caplog):
    """A shard in the split's naming added after _info.json was written: neither read nor named before."""
    data = wds_shards(folder, tmp_path / 'shards')
    listed = open_split(data, 'train').samples
    shutil.copy(shard_of(data, 'val'), data / 'imagenet-train-0002.tar')
    with caplog.at_level('WARNING'):
        assert open_split(data, 'train').samples == listed
    assert (f'warning: {data / "imagenet-train-0002.tar"} (1 tar(s) named as shards of the split train) is not read: '
            f'{data / "_info.json"} does not list it') in caplog.text
    assert 'imagenet-validation' not in caplog.text  # the other split's shards are listed under their own split


@pytest.mark.parametrize('info', [False, True])
def test_a_key_in_two_shards_is_refused_naming_both(folder, tmp_path, info):
    """A stray copy of a shard (`train-extra.tar`, unnumbered: no numbering to check) read its images twice."""
    data = wds_shards(folder, tmp_path / 'shards', info=info)
    copy = data / 'imagenet-train-extra.tar'
    shutil.copy(shard_of(data), copy)
    if info:
        edit_info(data, lambda i: i['splits']['train']['filenames'].append(copy.name))
    key = first_key(shard_of(data))
    with pytest.raises(DataError, match=re.escape(f'key {key} is also in {shard_of(data)}: a sample in two shards')):
        open_split(data, 'train')


def test_a_shard_among_per_class_tars_is_no_class(folder, tmp_path):
    """A split folder's first tar a per-class tar, a later one a webdataset shard: the shard's flat images were a
    class named after the shard."""
    shards = wds_shards(folder, tmp_path / 'shards', info=False)
    train = tmp_path / 'data' / 'train'
    write_tar(train / 'n001.tar', {f.name: f.read_bytes() for f in sorted((folder / 'train' / 'n001').iterdir())})
    shutil.copy(shard_of(shards), train / 'shard-0000.tar')
    with pytest.raises(DataError, match=rf'^{train / "shard-0000.tar"}: member \S+\.cls is a webdataset label beside '
                                        r'flat images'):
        open_split(tmp_path / 'data', 'train')


def test_the_shards_are_asked_before_the_tars_and_an_unreadable_info_file_is_named(folder, tmp_path):
    kinds = [type(source) for source in sources()]
    assert kinds.index(WebDatasetShards) < kinds.index(Tars) < kinds.index(ClassFolders)
    data = wds_shards(folder, tmp_path / 'shards')
    (data / '_info.json').write_text('{"splits": {"train": ')
    with pytest.raises(DataError, match=rf'^{data / "_info.json"} is not readable \(Expecting value') as error:
        open_split(data, 'train')
    assert '\n' not in str(error.value)
    (data / '_info.json').unlink()
    (data / '_info.yaml').write_text('splits: [train\n  validation: x\n')
    with pytest.raises(DataError, match=rf'^{data / "_info.yaml"} is not readable \(') as error:
        open_split(data, 'train')
    assert '\n' not in str(error.value)


def test_an_alt_label_of_the_info_file_gives_the_labels_and_leaves_out_its_minus_ones(folder, tmp_path, caplog):
    """timm's `alt_label` in a split's record: each sample's label is its KEY.json's field of that name (the .cls
    ignored, as timm ignores it), and a sample labelled -1 there is left out and counted, as timm skips it."""
    import tarfile
    data = wds_shards(folder, tmp_path / 'shards', with_json=True)
    expected, left_out = {}, None
    for shard in sorted(data.glob('imagenet-train-*.tar')):
        with tarfile.open(shard) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        for name in [n for n in members if n.endswith('.json')]:
            record = json.loads(members[name])
            record['alt'] = -1 if left_out is None else (record['label'] + 1) % len(CLASSES)
            left_out = left_out or f'{shard.name}/{record["filename"]}'
            if record['alt'] != -1:
                expected[f'{shard.name}/{record["filename"]}'] = record['alt']
            members[name] = json.dumps(record).encode()
        write_tar(shard, members)
    info = json.loads((data / '_info.json').read_text())
    info['splits']['train']['alt_label'] = 'alt'
    (data / '_info.json').write_text(json.dumps(info))
    with caplog.at_level('INFO', logger='vit_dense'):
        listing = open_split(data, 'train')
    assert dict(listing.samples) == expected and left_out not in dict(listing.samples)
    assert f"labels are KEY.json's 'alt' (alt_label); 1 of {len(expected) + 1} samples labelled -1" in caplog.text
    info['splits']['train']['alt_label'] = 'absent'
    (data / '_info.json').write_text(json.dumps(info))
    with pytest.raises(DataError, match=r"key \S+: no 'absent' in a KEY.json \(the info file's alt_label\)$"):
        open_split(data, 'train')
