"""Splits saved by Hugging Face `datasets` (save_to_disk, the Hub's parquet files), written here by `datasets` itself:
the same classes, labels, bytes and pixels as the class folders they were made from, read map-style (forked loader
workers, token labels keyed by split and row, a run equal to the folder's and resumed exactly), and every refusal in
one line."""
from __future__ import annotations

import pickle
import re
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from backbones.common.distributed import DistInfo
from backbones.common.errors import DataError, UsageError
from backbones.common.images import ImageReadError, file_bytes, read_image, scan_split
from classification.data.folders import ImageFolderDataset
from classification.sources.hf_datasets import ArrowRows, HuggingFaceDatasets
from classification.sources.source import open_split, sources
from classification.sources.tars import Tars
from helpers.cls_data import CLASSES, make_image_folder
from helpers.commands import one_line_error, run_tool, succeeded
from helpers.models import TINY_DEIT
from helpers.training_runs import assert_same_run, resume_after_stops

datasets = pytest.importorskip('datasets')
datasets.disable_progress_bars()


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp('hf') / 'folder')


@pytest.fixture(autouse=True)
def hf_cache(tmp_path, monkeypatch):
    """`datasets`' cache (parquet files converted to arrow) in the test's folder, not the user's."""
    monkeypatch.setattr(datasets.config, 'HF_DATASETS_CACHE', tmp_path / 'hf-cache')


def split_dataset(folder, split: str, features: dict | None = None, names=None):
    """The folder's split as a `datasets.Dataset` in its listing's order: columns image (the files' bytes) and
    label (a ClassLabel of the folder's classes, or `features` where given)."""
    classes, samples = scan_split(folder, split)
    features = features or {'image': datasets.Image(), 'label': datasets.ClassLabel(names=names or classes)}
    columns = list(features)
    return datasets.Dataset.from_dict(
        {columns[0]: [{'bytes': (folder / path).read_bytes(), 'path': None} for path, _ in samples],
         columns[1]: [label for _, label in samples]}, features=datasets.Features(features))


def saved(folder, root, layout: str):
    """--data-dir of the folder's splits as `datasets` writes them in `layout`: a DatasetDict with the Hub's
    `validation`, one Dataset per split folder, parquet files at the top or in data/ (the Hub's layout)."""
    train, val = split_dataset(folder, 'train'), split_dataset(folder, 'val')
    if layout == 'dataset-dict':
        datasets.DatasetDict({'train': train, 'validation': val}).save_to_disk(str(root))
    elif layout == 'split-folders':
        train.save_to_disk(str(root / 'train'))
        val.save_to_disk(str(root / 'val'))
    else:
        where = root / 'data' if layout == 'hub-parquet' else root
        where.mkdir(parents=True)
        train.select(range(12)).to_parquet(str(where / 'train-00000-of-00002.parquet'))
        train.select(range(12, len(train))).to_parquet(str(where / 'train-00001-of-00002.parquet'))
        val.to_parquet(str(where / 'validation-00000-of-00001.parquet'))
    return root


def test_the_source_is_asked_before_the_class_folders():
    kinds = [type(source) for source in sources()]
    assert kinds.index(Tars) < kinds.index(HuggingFaceDatasets) < len(kinds) - 1


@pytest.mark.parametrize('layout', ['dataset-dict', 'split-folders', 'parquet', 'hub-parquet'])
def test_a_saved_split_lists_and_reads_as_the_folder(folder, tmp_path, layout):
    """Classes, labels, bytes and decoded pixels of every row equal the folder's; images named SPLIT/ROW (the split
    as saved: the Hub's `validation` for val)."""
    data = saved(folder, tmp_path / 'hf', layout)
    for split in ('train', 'val'):
        classes, samples = scan_split(folder, split)
        listing = open_split(data, split, classes)
        saved_as = 'validation' if split == 'val' and layout != 'split-folders' else split
        assert listing.classes == list(CLASSES) == classes
        assert listing.samples == [(f'{saved_as}/{row}', label) for row, (_, label) in enumerate(samples)]
        for index, (path, _) in enumerate(samples):
            read = listing.reader.open(index, listing.samples[index][0])
            assert file_bytes(read) == (folder / path).read_bytes()
            assert np.array_equal(np.asarray(read_image(read)), np.asarray(read_image(folder / path)))


def test_class_names_and_numbers_are_the_class_labels_and_the_given_classes_match_by_name(folder, tmp_path):
    """A ClassLabel's order is kept (the Hub's ImageNet indices), not sorted; the validation split read with the
    training split's classes in another order is relabelled by name; plain ints are classes named by number."""
    shuffled = ['n003', 'n001', 'n002']  # names in the ClassLabel's order: label 0 is n003
    train = split_dataset(folder, 'train', names=shuffled)
    datasets.DatasetDict({'train': train, 'val': split_dataset(folder, 'val')}).save_to_disk(str(tmp_path / 'hf'))
    listing = open_split(tmp_path / 'hf', 'train')
    _, samples = scan_split(folder, 'train')
    assert listing.classes == shuffled and [label for _, label in listing.samples] == [label for _, label in samples]
    val = open_split(tmp_path / 'hf', 'val', shuffled)  # saved with the sorted names
    _, val_samples = scan_split(folder, 'val')
    assert [shuffled[label] for _, label in val.samples] == [CLASSES[label] for _, label in val_samples]
    with pytest.raises(DataError, match="has 1 class\\(es\\) that the training split does not: n003"):
        open_split(tmp_path / 'hf', 'val', ['n001', 'n002'])


def test_labels_of_plain_ints_are_named_by_number_with_a_warning(folder, tmp_path, caplog):
    features = {'image': datasets.Image(), 'label': datasets.Value('int64')}
    split_dataset(folder, 'train', features).save_to_disk(str(tmp_path / 'hf' / 'train'))
    with caplog.at_level('WARNING'):
        listing = open_split(tmp_path / 'hf', 'train')
    assert listing.classes == ['0', '1', '2']
    assert [label for _, label in listing.samples] == [label for _, label in scan_split(folder, 'train')[1]]
    assert "the label column 'label' is Value('int64'), ints without class names" in caplog.text
    assert 'its ints are the classes, named 0 .. 2' in caplog.text


def test_columns_of_other_names_are_read_by_their_feature_where_one_is(folder, tmp_path):
    features = {'img': datasets.Image(), 'fine_label': datasets.ClassLabel(names=list(CLASSES))}
    split_dataset(folder, 'train', features).save_to_disk(str(tmp_path / 'hf' / 'train'))
    listing = open_split(tmp_path / 'hf', 'train')
    assert listing.classes == list(CLASSES) and len(listing.samples) == 24
    assert file_bytes(listing.reader.open(0, 'train/0')) == (folder / scan_split(folder, 'train')[1][0][0]).read_bytes()
    # CIFAR-100's layout: two ClassLabel columns, neither 'label': which one is meant is not guessed
    two = split_dataset(folder, 'train', features).add_column('coarse_label', [0] * 24, feature=datasets.ClassLabel(
        names=['all']))
    two.save_to_disk(str(tmp_path / 'two' / 'train'))
    with pytest.raises(DataError) as error:
        open_split(tmp_path / 'two', 'train')
    assert str(error.value).startswith(f"{tmp_path / 'two' / 'train'} has no column 'label' of the labels, and 2 "
                                       f"ClassLabel columns: its columns are img (Image), fine_label (ClassLabel), "
                                       f"coarse_label (ClassLabel) (name the one to read 'label'")


def test_class_folders_beside_parquet_files_of_other_splits_are_read_as_before(folder, tmp_path):
    """Parquet files of no split asked for (a `test-*.parquet`, a `metadata.parquet`) beside a split's class folders
    leave the folders to the class folders' reader."""
    import shutil
    data = tmp_path / 'data'
    shutil.copytree(folder, data)
    (data / 'data').mkdir()
    split_dataset(folder, 'val').to_parquet(str(data / 'data' / 'test-00000-of-00001.parquet'))
    (data / 'metadata.parquet').write_bytes(b'')
    assert open_split(data, 'train').samples == scan_split(folder, 'train')[1]


@pytest.mark.parametrize('layout', ['dataset-dict', 'split-folders'])
def test_parquet_files_of_the_split_beside_its_saved_folder_are_named_unread(folder, tmp_path, layout, caplog):
    """The saved folder is read; the split's parquet files beside it (a Hub download next to a save_to_disk copy)
    were left unread without a word."""
    data = saved(folder, tmp_path / 'hf', layout)
    (data / 'data').mkdir()
    split_dataset(folder, 'train').to_parquet(str(data / 'data' / 'train-00000-of-00001.parquet'))
    with caplog.at_level('WARNING'):
        listing = open_split(data, 'train')
    assert listing.read_from == data / 'train'
    assert (f'warning: {data / "data" / "train-00000-of-00001.parquet"} (1 parquet file(s) of the split) is not '
            f'read: the split train is read from {data / "train"}, saved with save_to_disk') in caplog.text


def refusal(data, split='train') -> str:
    with pytest.raises(DataError) as error:
        open_split(data, split)
    message = str(error.value)
    assert '\n' not in message
    return message


def test_every_refusal_is_one_line_naming_what_is_wrong(folder, tmp_path):
    train = split_dataset(folder, 'train')
    one = tmp_path / 'one'
    train.save_to_disk(str(one))  # a Dataset as the data folder itself: which split?
    assert refusal(one).startswith(f'{one} is one Dataset saved with save_to_disk, not its splits')

    both = tmp_path / 'dict'
    datasets.DatasetDict({'train': train, 'test': train}).save_to_disk(str(both))
    assert refusal(both, 'val') == f'{both / "dataset_dict.json"}: a DatasetDict of the splits train, test, none of ' \
                                   f'them val or validation'
    (both / 'train' / 'state.json').unlink()
    assert refusal(both) == f'{both / "train"} holds arrow files or dataset_info.json but no state.json: not a data ' \
                            f'set saved with save_to_disk (save it again, or read it with Dataset.from_file and ' \
                            f'save_to_disk)'

    hub = tmp_path / 'hub' / 'data'
    hub.mkdir(parents=True)
    train.to_parquet(str(hub / 'train-00000-of-00001.parquet'))
    assert refusal(hub.parent, 'val') == f'{hub} holds parquet files of the splits train (SPLIT-*.parquet), none of ' \
                                         f'val or validation'

    columns = {'picture': (datasets.Value('binary'), datasets.ClassLabel(names=list(CLASSES))),
               'label': (datasets.Image(), datasets.Value('string'))}
    for name, (first, second) in columns.items():
        data = tmp_path / name
        features = {name: first, 'label': second} if name == 'picture' else {'image': first, 'label': second}
        rows = {'picture': [b'x'] * 2, 'label': [0, 1]} if name == 'picture' else None
        table = (datasets.Dataset.from_dict(rows, features=datasets.Features(features)) if rows else
                 datasets.Dataset.from_dict({'image': [None, None], 'label': ['a', 'b']},
                                            features=datasets.Features(features)))
        table.save_to_disk(str(data / 'train'))
        says = refusal(data)
        if name == 'picture':
            assert says == (f"{data / 'train'} has no column 'image' of the images, and no Image column: its columns "
                            f"are picture (Value), label (ClassLabel) (name the one to read 'image': "
                            f"dataset.rename_column(NAME, 'image'), and save it again)")
        else:
            assert says == (f"{data / 'train'}: the label column 'label' is Value('string'), not a ClassLabel: cast it "
                            f"(dataset.class_encode_column('label') for class names) and save it again")

    arrow = both / 'train' / 'data-00000-of-00001.arrow'  # the DatasetDict's train split, state.json put back
    train.save_to_disk(str(tmp_path / 'again'))
    (both / 'train' / 'state.json').write_bytes((tmp_path / 'again' / 'state.json').read_bytes())
    arrow.write_bytes(arrow.read_bytes()[:arrow.stat().st_size // 2])
    assert refusal(both).startswith(f'{both / "train"}: cannot read the split train (OSError: ')
    (hub / 'train-00000-of-00001.parquet').write_bytes(b'PAR1 cut short')
    assert refusal(hub.parent).startswith(f'{hub / "train-00000-of-00001.parquet"} is not a readable parquet file')

    unlabelled = tmp_path / 'test-split'  # the Hub's ImageNet test split: every label -1
    datasets.Dataset.from_dict({'image': [None] * 3, 'label': [0, -1, -1]}, features=train.features).save_to_disk(
        str(unlabelled / 'train'))
    assert refusal(unlabelled) == (f'{unlabelled / "train"}: row 1 has the label -1, outside the 3 classes (2 such '
                                   f'rows; a split without labels, as a test split, is not read)')


@pytest.mark.parametrize('change, says', [
    (lambda data: (data / 'train-00001-of-00002.parquet').unlink(), '2 parquet files (train-00000-of-00002.parquet '
                                                                    '...), 1 there: 1 missing, e.g. number 1'),
    (lambda data: (data / 'train-00002-of-00002.parquet').write_bytes(
        (data / 'train-00000-of-00002.parquet').read_bytes()), '3 there: train-00002-of-00002.parquet is not one'),
    (lambda data: (data / 'train-extra.parquet').write_bytes(
        (data / 'train-00000-of-00002.parquet').read_bytes()), 'train-extra.parquet is not one of them')])
def test_the_hubs_numbered_parquet_files_are_all_there_once(folder, tmp_path, change, says):
    """An interrupted download (train-00000-of-00002 alone) read half the split, a file copied in beside the
    numbered ones its rows twice, both with exit code 0."""
    data = saved(folder, tmp_path / 'hf', 'parquet')
    change(data)
    with pytest.raises(DataError, match=re.escape(f'{data}: the split train is in ')) as error:
        open_split(data, 'train')
    assert says in str(error.value)


def test_an_undecodable_image_is_named_by_split_and_row(folder, tmp_path):
    train = split_dataset(folder, 'train')
    rows = train.cast_column('image', datasets.Image(decode=False)).to_dict()
    rows['image'][3] = {'bytes': b'\xff\xd8 not a JPEG', 'path': None}
    rows['image'][5] = None
    datasets.Dataset.from_dict(rows, features=train.features).save_to_disk(str(tmp_path / 'hf' / 'train'))
    dataset = ImageFolderDataset(tmp_path / 'hf', 'train', transform=np.asarray)
    assert np.array_equal(dataset[2]['image'], np.asarray(read_image(folder / scan_split(folder, 'train')[1][2][0])))
    with pytest.raises(ImageReadError, match=f'cannot read image {tmp_path / "hf"}: split train, row 3: '
                                             'UnidentifiedImageError'):
        dataset[3]
    with pytest.raises(ImageReadError, match=f'cannot read image {tmp_path / "hf"}: split train, row 5: the row '
                                             'holds no image'):
        dataset[5]
    skipping = ImageFolderDataset(tmp_path / 'hf', 'train', transform=np.asarray, skip_unreadable=True)
    assert skipping[3] is None and skipping[5] is None and skipping[4] is not None


def test_without_datasets_installed_the_extra_is_named(folder, tmp_path, monkeypatch):
    data = saved(folder, tmp_path / 'hf', 'dataset-dict')
    monkeypatch.setitem(sys.modules, 'datasets', None)  # import datasets raises ImportError
    with pytest.raises(UsageError) as error:
        open_split(data, 'train')
    assert str(error.value).startswith(f'reading {data / "train"} (a Hugging Face data set) needs datasets, which '
                                       f'does not import here')
    assert str(error.value).endswith("pip install '.[hf]'")
    assert open_split(folder, 'train').classes == list(CLASSES)  # class folders need no datasets


def test_forked_loader_workers_read_the_rows_as_the_folder(folder, tmp_path):
    """The same batches (indices, labels, pixels) through two forked workers; `take` keeps each image's row."""
    data = saved(folder, tmp_path / 'hf', 'dataset-dict')
    batches = []
    for root in (folder, data):
        dataset = ImageFolderDataset(root, 'train', transform=lambda image: torch.from_numpy(
            np.asarray(image.resize((16, 16))).copy()), max_images=12)
        loader = DataLoader(dataset, batch_size=4, shuffle=True, num_workers=2, multiprocessing_context='fork',
                            generator=torch.Generator().manual_seed(0))
        batches.append([(b['index'].tolist(), b['label'].tolist(), b['image']) for b in loader])
    for (index, label, image), (hf_index, hf_label, hf_image) in zip(*batches, strict=True):
        assert (index, label) == (hf_index, hf_label) and torch.equal(image, hf_image)
    reader = open_split(data, 'train').reader  # as torchrun's main process sends it to the others: pickled
    assert isinstance(reader, ArrowRows) and reader.take([7, 2]).rows.tolist() == [7, 2]
    sent = pickle.loads(pickle.dumps(reader.take([7, 2])))
    assert file_bytes(sent.open(1, 'train/2')) == file_bytes(reader.open(2, 'train/2'))


def test_token_labels_are_keyed_by_split_and_row(tmp_path, labeled_images):
    """A store generated from the saved split keys its rows `train/ROW`, and the same annotator gives each row the
    maps it gives the folder's image (the shared fixture's store)."""
    from classification.token_labeling.annotate import generate_token_labels
    from classification.token_labeling.label_store import TokenLabelStore
    labelled, labels = labeled_images
    data = saved(labelled, tmp_path / 'hf', 'dataset-dict')
    annotator = labelled.parent / 'annotator.pth'
    generate_token_labels(data, 'resnet10t', tmp_path / 'labels', DistInfo(), checkpoint=str(annotator), img_size=64,
                          topk=2, workers=0)
    store, folder_store = TokenLabelStore(tmp_path / 'labels'), TokenLabelStore(labels)
    assert list(store.paths) == [f'train/{row}' for row in range(24)] and store.classes == list(CLASSES)
    for row, (path, _) in enumerate(scan_split(labelled, 'train')[1]):
        scores, classes = store.read(row)
        expected_scores, expected_classes = folder_store.read(folder_store.rows_of([path])[0])
        assert np.array_equal(classes, expected_classes) and np.allclose(scores, expected_scores, atol=1e-3)


@pytest.mark.slow  # tools run end to end
def test_a_run_from_a_saved_dataset_equals_the_folders_and_resumes_exactly_after_a_sigterm(folder, tmp_path):
    data = saved(folder, tmp_path / 'hf', 'dataset-dict')
    args = [*TINY_DEIT, '--no-token-labeling', '--epochs', '2', '--workers', '2', '--img-size', '32', '--batch-size',
            '4', '--lr-base', '1e-3', '--lr-base-batch', '4', '--warmup-epochs', '1', '--device', 'cpu']
    succeeded(run_tool('train_cls.py', [*args, '--data-dir', folder, '--output', tmp_path / 'folder']))
    run = succeeded(run_tool('train_cls.py', [*args, '--data-dir', data, '--output', tmp_path / 'hf-run']))
    assert f'{data / "train"}: listed 24 images' in run.stdout
    assert_same_run(tmp_path / 'folder', tmp_path / 'hf-run', epochs=2)
    points = resume_after_stops('train_cls.py', [*args, '--data-dir', data, '--output', tmp_path / 'cut'],
                                tmp_path / 'cut', stops=1)
    assert all(batch > 0 for _, batch in points)
    assert_same_run(tmp_path / 'hf-run', tmp_path / 'cut', epochs=2)
    message = one_line_error(run_tool('train_cls.py', [*args, '--data-dir', tmp_path / 'hf' / 'train', '--output',
                                                       tmp_path / 'refused']))
    assert f'{tmp_path / "hf" / "train"} is one Dataset saved with save_to_disk, not its splits' in message
