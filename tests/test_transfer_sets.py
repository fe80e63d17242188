"""The fine-grained transfer sets (tools/transfer.py --dataset flowers102|cars|pets|inat2018|inat2019): each published
layout read from files in its exact format (MATLAB files written with scipy, the text and JSON files) into the exact
listing, its faults refused in one line naming the file, the embedded digits written in each layout read back with
their true labels, one tiny transfer run per layout, and `--pretrained` as timm's weights from the local cache."""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import timm
import torch
from scipy.io import savemat

from backbones.common.errors import CheckpointError, DataError, UsageError
from backbones.weights import fetch_pretrained
from classification.digits.transfer_sets import EmbeddedTransferSet, write_layout
from classification.models import start_weights
from classification.sources.source import open_split
from classification.sources.transfer_sets import LAYOUTS, TransferLayout, load_mat
from classification.train import build_parser as train_parser
from classification.train import main as train_cls
from classification.transfer import main
from helpers.models import TINY_DEIT
from helpers.training_runs import last_weights

LAYOUT_KEYS = list(LAYOUTS)


def listing(root, split='train'):
    listed = open_split(root, split)
    return listed.classes, listed.samples


def touch(root, *names):
    """Empty files standing for the images a layout's annotation files list (the listing checks they are there)."""
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).touch()
    return root


def cars_annotations(rows):
    fields = [(name, 'O') for name in ('bbox_x1', 'bbox_y1', 'bbox_x2', 'bbox_y2', 'class', 'fname')]
    return {'annotations': np.array([[(10, 20, 30, 40, label, fname) for fname, label in rows]], dtype=fields)}


def test_flowers_lists_trnid_and_valid_for_training_and_tstid_for_test(tmp_path):
    touch(tmp_path, *(f'jpg/image_{n:05d}.jpg' for n in range(1, 7)))
    savemat(tmp_path / 'imagelabels.mat', {'labels': np.array([[3, 1, 2, 3, 1, 2]], np.uint8)})
    savemat(tmp_path / 'setid.mat', {'trnid': np.array([[1, 4]], np.uint16), 'valid': np.array([[2]], np.uint16),
                                     'tstid': np.array([[3, 5, 6]], np.uint16)})
    assert listing(tmp_path) == (['001', '002', '003'], [('jpg/image_00001.jpg', 2), ('jpg/image_00004.jpg', 2),
                                                         ('jpg/image_00002.jpg', 0)])
    assert listing(tmp_path, 'val')[1] == [('jpg/image_00003.jpg', 1), ('jpg/image_00005.jpg', 0),
                                           ('jpg/image_00006.jpg', 1)]
    savemat(tmp_path / 'setid.mat', {'trnid': np.array([[1, 7]], np.uint16), 'valid': np.array([[2]], np.uint16),
                                     'tstid': np.array([[3]], np.uint16)})
    says = f'{tmp_path / "setid.mat"}: image numbers (trnid) must be 1..6; entry 2 is 7 (1 such)'
    with pytest.raises(DataError, match=re.escape(says)):
        listing(tmp_path)


def flowers_files(root, labels, trnid, valid, tstid):
    touch(root, *(f'jpg/image_{n:05d}.jpg' for n in range(1, len(labels) + 1)))
    savemat(root / 'imagelabels.mat', {'labels': np.array([labels])})
    savemat(root / 'setid.mat', {'trnid': np.array([trnid]), 'valid': np.array([valid]), 'tstid': np.array([tstid])})


@pytest.mark.parametrize('case, says', [
    ('fractional labels', 'imagelabels.mat: labels are not whole numbers (found [1.0, 2.7, 3.0] ...)'),
    ('fractional image numbers', 'setid.mat: image numbers (trnid) are not whole numbers (found [1.5, 2.0] ...)'),
    ('text labels', "imagelabels.mat: labels are not whole numbers (found ['a', 'b'] ...)"),
    ('a truncated setid.mat', 'setid.mat: not a readable MATLAB file (index out of range): copy it again'),
    ('a text file as setid.mat', 'setid.mat: not a readable MATLAB file (Mat file appears to be truncated)')])
def test_a_damaged_mat_file_or_numbers_that_are_not_whole_are_one_line_naming_the_file(tmp_path, case, says):
    """Never a label or an image number cut to an integer (2.7 read as class 2), nor scipy's traceback."""
    flowers_files(tmp_path, [1.0, 2.7, 3.0, 1.0] if case == 'fractional labels' else [1, 2, 3, 1],
                  [1.5, 2] if case == 'fractional image numbers' else [1, 2], [3], [4])
    if case == 'text labels':
        savemat(tmp_path / 'imagelabels.mat', {'labels': np.array(['a', 'b'])})
    elif case == 'a truncated setid.mat':
        (tmp_path / 'setid.mat').write_bytes((tmp_path / 'setid.mat').read_bytes()[:100])
    elif case == 'a text file as setid.mat':
        (tmp_path / 'setid.mat').write_text('hello')
    with pytest.raises(DataError, match=f'^{re.escape(str(tmp_path / says))}'):
        listing(tmp_path)


@pytest.mark.parametrize('trnid, valid, tstid, says', [
    ([1, 2], [3], [3, 4], 'the image jpg/image_00003.jpg is listed in the training and the test split'),
    ([1, 2], [1], [4], 'the image jpg/image_00001.jpg is listed twice in the training split')])
def test_an_image_in_two_splits_or_twice_in_one_is_refused(tmp_path, trnid, valid, tstid, says):
    """A test image trained on (setid.mat's tstid overlapping trnid or valid) would inflate the reported top-1."""
    flowers_files(tmp_path, [1, 2, 3, 1], trnid, valid, tstid)
    with pytest.raises(DataError, match=f'^{re.escape(f"{tmp_path} (Oxford Flowers-102): {says}")}'):
        listing(tmp_path, 'val')


def test_cars_reads_the_devkit_with_the_test_labels_beside_it_or_in_it(tmp_path):
    for folder in ('cars_train', 'cars_test', 'devkit'):
        (tmp_path / folder).mkdir()
    touch(tmp_path, 'cars_train/00001.jpg', 'cars_train/00002.jpg', 'cars_test/00001.jpg')
    names = ['AM General Hummer SUV 2000', 'Acura RL Sedan 2012', 'BMW M3 Coupe 2012']
    savemat(tmp_path / 'devkit' / 'cars_meta.mat', {'class_names': np.array([names], dtype=object)})
    savemat(tmp_path / 'devkit' / 'cars_train_annos.mat', cars_annotations([('00001.jpg', 2), ('00002.jpg', 3)]))
    savemat(tmp_path / 'cars_test_annos_withlabels.mat', cars_annotations([('00001.jpg', 1)]))
    expected = names, [('cars_train/00001.jpg', 1), ('cars_train/00002.jpg', 2)]
    assert listing(tmp_path) == expected
    assert listing(tmp_path, 'val') == (names, [('cars_test/00001.jpg', 0)])
    (tmp_path / 'cars_test_annos_withlabels.mat').rename(tmp_path / 'devkit' / 'cars_test_annos_withlabels.mat')
    assert listing(tmp_path) == expected and listing(tmp_path, 'val') == (names, [('cars_test/00001.jpg', 0)])
    savemat(tmp_path / 'devkit' / 'cars_train_annos.mat', cars_annotations([('00001.jpg', 4)]))
    with pytest.raises(DataError, match=re.escape('cars_train_annos.mat: class must be 1..3; entry 1 is 4 (1 such)')):
        listing(tmp_path)


def test_pets_names_each_class_by_its_images_and_refuses_a_mixed_class(tmp_path):
    touch(tmp_path, *(f'images/{name}.jpg' for name in ('Abyssinian_100', 'basset_hound_12', 'Abyssinian_2',
                                                        'american_bulldog_7', 'american_pit_bull_terrier_3')))
    (tmp_path / 'annotations').mkdir()
    (tmp_path / 'annotations' / 'trainval.txt').write_text(
        'Abyssinian_100 1 1 1\nbasset_hound_12 4 2 3\nAbyssinian_2 1 1 1\n')
    (tmp_path / 'annotations' / 'test.txt').write_text('american_bulldog_7 2 2 1\namerican_pit_bull_terrier_3 3 2 2\n')
    classes = ['Abyssinian', 'american_bulldog', 'american_pit_bull_terrier', 'basset_hound']
    assert listing(tmp_path) == (classes, [('images/Abyssinian_100.jpg', 0), ('images/basset_hound_12.jpg', 3),
                                           ('images/Abyssinian_2.jpg', 0)])
    assert listing(tmp_path, 'val') == (classes, [('images/american_bulldog_7.jpg', 1),
                                                  ('images/american_pit_bull_terrier_3.jpg', 2)])
    (tmp_path / 'annotations' / 'test.txt').write_text('american_bulldog_7 2 2 1\nBengal_1 1 1 1\n')
    with pytest.raises(DataError, match=r'test.txt, line 2: Bengal_1 is in class 1, whose images are named '
                                        r'Abyssinian_N'):
        listing(tmp_path)


def test_inaturalist_orders_classes_by_category_id_and_refuses_an_unlabelled_image(tmp_path):
    categories = [{'id': 5, 'name': 'Pinus'}, {'id': 2, 'name': 'Aves'}, {'id': 9, 'name': 'Rosa'}]
    train = {'images': [{'id': 10, 'file_name': 'train_val2018/Plantae/5/a.jpg'},
                        {'id': 11, 'file_name': 'train_val2018/Aves/2/b.jpg'}],
             'annotations': [{'id': 1, 'image_id': 11, 'category_id': 2}, {'id': 2, 'image_id': 10, 'category_id': 5}],
             'categories': categories}
    val = {'images': [{'id': 20, 'file_name': 'train_val2018/Plantae/9/c.jpg'}],
           'annotations': [{'id': 3, 'image_id': 20, 'category_id': 9}], 'categories': categories}
    (tmp_path / 'train2018.json').write_text(json.dumps(train))
    (tmp_path / 'val2018.json').write_text(json.dumps(val))
    touch(tmp_path, *(image['file_name'] for image in train['images'] + val['images']))
    assert listing(tmp_path) == (['Aves', 'Pinus', 'Rosa'], [('train_val2018/Plantae/5/a.jpg', 1),
                                                            ('train_val2018/Aves/2/b.jpg', 0)])
    assert listing(tmp_path, 'val')[1] == [('train_val2018/Plantae/9/c.jpg', 2)]
    val['annotations'] = []
    (tmp_path / 'val2018.json').write_text(json.dumps(val))
    with pytest.raises(DataError, match=r'val2018.json: image 20 \(train_val2018/Plantae/9/c.jpg\) has no annotation'):
        listing(tmp_path)


INAT_TRAIN = {'images': [{'id': 10, 'file_name': 'a.jpg'}], 'annotations': [{'image_id': 10, 'category_id': 2}],
              'categories': [{'id': 2, 'name': 'Aves'}, {'id': 5, 'name': 'Pinus'}]}


@pytest.mark.parametrize('file, change, says', [
    ('train2018.json', lambda c: c['annotations'].append({'image_id': 10, 'category_id': 5}),
     'image 10 has two categories (2 and 5): one label per image'),
    ('train2018.json', lambda c: c['categories'].append({'id': 2, 'name': 'Rosa'}), 'the category id 2 is given twice'),
    ('train2018.json', lambda c: c['images'].append({'id': 10, 'file_name': 'b.jpg'}),
     'the image id 10 is given twice (a.jpg and b.jpg): each image needs an id of its own'),
    ('train2018.json', lambda c: c['annotations'].append({'id': 7, 'image_id': 11, 'category_id': 5}),
     'annotations[1] (id 7, category 5) names the image 11, which the file does not list'),
    ('train2018.json', lambda c: c['annotations'][0].__setitem__('image_id', '10'),
     "ids of two types (images[0].id = 10 and annotations[0].image_id = '10'): give every such id as a number, or "
     "every one as a text"),
    ('train2018.json', lambda c: (c['images'].append({'id': '10', 'file_name': 'b.jpg'}),
                                  c['annotations'].append({'image_id': '10', 'category_id': 5})),
     "ids of two types (images[0].id = 10 and images[1].id = '10')"),  # two keys here, one where ids are converted
    ('train2018.json', lambda c: c['annotations'][0].__setitem__('category_id', '2'),
     "ids of two types (categories[0].id = 2 and annotations[0].category_id = '2')"),
    ('train2018.json', lambda c: c['images'][0].__setitem__('id', [10]), "images[0]'s id is neither"),
    ('train2018.json', lambda c: c['annotations'][0].__setitem__('category_id', [2]),
     "annotations[0]'s category_id is neither"),
    ('val2018.json', lambda c: c.__setitem__('categories', [{'id': 2, 'name': 'Pinus'}, {'id': 5, 'name': 'Aves'}]),
     'its categories are not those of train2018.json'),
    ('train2018.json', lambda c: c['images'][0].pop('id'), "images[0] is not a record with id and file_name"),
    ('train2018.json', lambda c: c.__setitem__('categories', 5), 'categories is not a list of records')])
def test_inaturalist_files_that_would_relabel_or_do_not_parse_are_one_line_naming_the_file(tmp_path, file, change,
                                                                                           says):
    """A second category of an image, a category id given twice, or a test file naming the ids otherwise would
    each relabel images (the last annotation kept, ids matched without their names); records without their fields
    were KeyError tracebacks."""
    contents = {name: json.loads(json.dumps(INAT_TRAIN)) for name in ('train2018.json', 'val2018.json')}
    contents['val2018.json']['images'][0]['file_name'] = 'b.jpg'
    touch(tmp_path, 'a.jpg', 'b.jpg')
    assert listing(write_inat(tmp_path, contents)) == (['Aves', 'Pinus'], [('a.jpg', 0)])
    change(contents[file])
    write_inat(tmp_path, contents)
    with pytest.raises(DataError, match=f'^{re.escape(f"{tmp_path / file}: {says}")}'):
        listing(tmp_path, 'val')


def test_an_inaturalist_image_in_both_splits_is_refused_however_its_path_is_spelt(tmp_path):
    """`./a.jpg`, `sub//a.jpg` or an absolute path in the test file for the training file's image: the same file,
    which trained and was scored on."""
    touch(tmp_path, 'sub/a.jpg')
    for spelt in ('./sub/a.jpg', 'sub//a.jpg', str(tmp_path / 'sub' / 'a.jpg')):
        contents = {name: json.loads(json.dumps(INAT_TRAIN)) for name in ('train2018.json', 'val2018.json')}
        contents['train2018.json']['images'][0]['file_name'] = 'sub/a.jpg'
        contents['val2018.json']['images'][0]['file_name'] = spelt
        with pytest.raises(DataError, match=re.escape(f'the image {spelt} is listed in the training and the test '
                                                      f'split (as sub/a.jpg and {spelt})')):
            listing(write_inat(tmp_path, contents))


def write_inat(root, contents):
    for name, content in contents.items():
        (root / name).write_text(json.dumps(content))
    return root


def test_undecodable_pets_annotations_are_one_line_naming_the_file(tmp_path):
    (tmp_path / 'images').mkdir()
    (tmp_path / 'annotations').mkdir()
    (tmp_path / 'annotations' / 'trainval.txt').write_bytes(b'\xff\xfeAbyssinian_1 1 1 1\n')
    (tmp_path / 'annotations' / 'test.txt').write_text('Abyssinian_2 1 1 1\n')
    with pytest.raises(DataError, match=f'^{re.escape(str(tmp_path / "annotations/trainval.txt"))}: not a readable '
                                        f'text file'):
        listing(tmp_path)


def test_a_missing_file_is_one_line_naming_it_and_the_layout_before_any_work(tmp_path):
    savemat(tmp_path / 'imagelabels.mat', {'labels': np.array([[1, 2]], np.uint8)})
    with pytest.raises(DataError, match=re.escape(f'{tmp_path / "setid.mat"} is missing: the Oxford Flowers-102 '
                                                  f'layout is jpg/image_NNNNN.jpg, imagelabels.mat')):
        listing(tmp_path)  # a file of the layout there: the folder is the layout's, and what it lacks is named
    out = tmp_path / 'run'
    with pytest.raises(DataError, match=re.escape(f'{tmp_path / "annotations/trainval.txt"} is missing: the '
                                                  f'Oxford-IIIT Pets layout')):
        main([*TINY_DEIT, '--dataset', 'pets', '--data-dir', str(tmp_path), '--output', str(out)])
    assert not out.exists()
    (tmp_path / 'train2019.json').write_text('{"images": []')
    (tmp_path / 'val2019.json').write_text('{}')
    with pytest.raises(DataError, match='train2019.json: not a readable JSON file'):
        LAYOUTS['inat2019'].read(tmp_path)


def test_an_image_the_annotations_list_but_the_folder_lacks_is_named_before_any_work(tmp_path):
    """It was found when first read: after an epoch of training, for a test image."""
    flowers_files(tmp_path, [1, 2, 3, 1, 2, 3], [1, 2], [3], [4, 5, 6])
    (tmp_path / 'jpg' / 'image_00005.jpg').unlink()
    assert listing(tmp_path)[1] == [('jpg/image_00001.jpg', 0), ('jpg/image_00002.jpg', 1), ('jpg/image_00003.jpg', 2)]
    out = tmp_path / 'run'
    says = (f'{tmp_path / "jpg/image_00005.jpg"} is missing (1 of the 3 images the Oxford Flowers-102 annotation '
            f'files list in {tmp_path / "jpg"})')
    with pytest.raises(DataError, match=re.escape(says)):
        main([*TINY_DEIT, '--dataset', 'flowers102', '--data-dir', str(tmp_path), '--output', str(out),
              '--img-size', '32', '--batch-size', '2', '--epochs', '1', '--workers', '0', '--device', 'cpu'])
    assert not out.exists() or not any(out.iterdir())  # nothing trained, nothing written


def test_a_folder_holding_two_layouts_annotation_files_is_refused(tmp_path):
    """The first layout registered was read: --dataset pets trained and scored on Flowers' split, exit code 0."""
    flowers_files(tmp_path, [1, 2, 1], [1], [2], [3])
    touch(tmp_path, 'images/Abyssinian_1.jpg', 'images/Abyssinian_2.jpg')
    (tmp_path / 'annotations').mkdir()
    (tmp_path / 'annotations' / 'trainval.txt').write_text('Abyssinian_1 1 1 1\n')
    (tmp_path / 'annotations' / 'test.txt').write_text('Abyssinian_2 1 1 1\n')
    says = (f'{tmp_path} holds the annotation files of Oxford Flowers-102 ({tmp_path / "imagelabels.mat"}) and of '
            f'Oxford-IIIT Pets ({tmp_path / "annotations/trainval.txt"}): one data set a folder')
    with pytest.raises(DataError, match=re.escape(says)):
        listing(tmp_path)
    with pytest.raises(DataError, match=re.escape(says)):
        main(transfer_args('pets', tmp_path, tmp_path / 'run'))


def test_image_folders_alone_do_not_make_a_layout(tmp_path):
    """A class-folder set holding an `images/` or `jpg/` folder is still class folders: only a layout's annotation
    files say it is one."""
    for path in ('train/a/1.png', 'val/a/2.png'):
        (tmp_path / path).parent.mkdir(parents=True)
        (tmp_path / path).write_bytes(b'')
    (tmp_path / 'images').mkdir()
    (tmp_path / 'jpg').mkdir()
    assert listing(tmp_path) == (['a'], [('train/a/1.png', 0)])


@pytest.fixture(scope='module')
def layouts(tmp_path_factory):
    """The first 40 digit scans written in each layout (32 training, 8 test images)."""
    root = tmp_path_factory.mktemp('layouts')
    return {key: write_layout(key, root / key, 40) for key in LAYOUT_KEYS}


@pytest.mark.parametrize('key', LAYOUT_KEYS)
def test_the_digits_written_in_each_layout_read_back_with_their_labels(layouts, key):
    """Every fifth scan (numbered from 0) is a test image, and each image's label is its digit (sklearn's target),
    whatever path and numbering the layout gives it."""
    from sklearn.datasets import load_digits
    target = load_digits().target[:40]
    classes, train = listing(layouts[key])
    _, test = listing(layouts[key], 'val')
    assert len(classes) == 10 and len(train) == 32 and len(test) == 8
    digits = [re.findall(r'\d+', name)[-1] for name, _ in sorted(test)]  # each file name ends in its scan number
    numbers = sorted(int(n) for n in digits)
    assert [n - 1 for n in numbers] == list(range(0, 40, 5))  # the layouts number scans from 1
    for name, label in train + test:
        assert label == target[int(re.findall(r'\d+', name)[-1]) - 1], name


def transfer_args(key, root, out, *extra):
    return [*TINY_DEIT, '--dataset', key, '--data-dir', str(root), '--output', str(out), '--img-size', '32',
            '--batch-size', '8', '--epochs', '1', '--workers', '0', '--device', 'cpu', *extra]


@pytest.mark.parametrize('key', LAYOUT_KEYS)
def test_one_transfer_run_per_layout(layouts, key, tmp_path):
    """The preset trains on the layout's training split and reports top-1 on its test split; the run records the
    layout's classes in their order."""
    metrics = main(transfer_args(key, layouts[key], tmp_path / 'run'))
    assert metrics['train_images'] == 32 and metrics['epochs'] == 1 and 0 <= metrics['top1'] <= 100
    correct = metrics['top1'] * 8 / 100  # scored on the 8 test images (what it learns: the fallback run's)
    assert abs(correct - round(correct)) < 1e-6, metrics
    recorded = torch.load(tmp_path / 'run' / 'last.pth', weights_only=True)['args']
    assert recorded['classes'] == listing(layouts[key])[0]
    assert (recorded['opt'], recorded['mixup'], recorded['aug_repeats']) == ('adamw', 0.8, 3)  # DeiT's recipe


def test_a_missing_finetune_file_is_named_before_the_data_is_listed(layouts, tmp_path, monkeypatch):
    """The arguments alone decide it: no listing (ImageNet's, or a shard index, takes minutes) before it."""
    def listed(*args):
        raise AssertionError('the data was listed first')

    monkeypatch.setattr(TransferLayout, 'list_split', listed)
    with pytest.raises(CheckpointError, match=re.escape(f'{tmp_path / "absent.pth"}: PyTorch checkpoint not found')):
        main(transfer_args('pets', layouts['pets'], tmp_path / 'run', '--finetune', str(tmp_path / 'absent.pth')))


def test_a_run_refused_while_its_split_is_read_leaves_no_output_folder(layouts, tmp_path):
    """A Flowers label 0 or an image the split lists but the folder lacks, found once the run had made its folder:
    the one-line error came with an empty --output folder left behind."""
    flowers, pets = tmp_path / 'flowers', tmp_path / 'pets'
    shutil.copytree(layouts['flowers102'], flowers)
    labels, = load_mat(flowers / 'imagelabels.mat', 'labels')
    savemat(flowers / 'imagelabels.mat', {'labels': np.where(np.arange(len(labels)) == 3, 0, labels)})
    shutil.copytree(layouts['pets'], pets)
    next((pets / 'images').iterdir()).unlink()
    for key, data, says in (('flowers102', flowers, 'labels must be whole numbers from 1; entry 4 is 0 (1 such)'),
                            ('pets', pets, 'is missing')):
        with pytest.raises(DataError, match=re.escape(says)):
            main(transfer_args(key, data, tmp_path / 'runs' / key))
        assert not (tmp_path / 'runs').exists()


def test_a_transfer_set_run_relaunches_from_its_args_yaml(layouts, tmp_path):
    """--config gives the run's --dataset too: the relaunch takes the transfer set's way and recipe, to the same
    weights."""
    main(transfer_args('inat2019', layouts['inat2019'], tmp_path / 'run', '--lr-base', '1e-4'))
    main(['--config', str(tmp_path / 'run' / 'args.yaml'), '--output', str(tmp_path / 'again')])
    first, again = last_weights(tmp_path / 'run'), last_weights(tmp_path / 'again')
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert torch.load(tmp_path / 'again' / 'last.pth', weights_only=True)['args']['lr_base'] == 1e-4


def test_without_data_the_preset_runs_on_the_digits_in_that_layout(tmp_path):
    metrics = main([*TINY_DEIT, '--dataset', 'pets', '--digits-dir', str(tmp_path / 'digits'), '--output',
                    str(tmp_path / 'run'), '--img-size', '32', '--epochs', '1', '--train-images', '64',
                    '--workers', '0', '--device', 'cpu'], default_data=EmbeddedTransferSet)
    assert (tmp_path / 'digits' / 'pets' / 'annotations' / 'trainval.txt').is_file()
    assert metrics['train_images'] == 64
    recorded = torch.load(tmp_path / 'run' / 'last.pth', weights_only=True)['args']
    assert recorded['classes'] == ['zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine']
    # the digits' scale (the epochs typed), the preset's optimizer
    assert (recorded['epochs'], recorded['batch_size'], recorded['hflip'], recorded['mixup']) == (1, 32, 0.0, 0.0)
    assert (recorded['opt'], recorded['smoothing']) == ('adamw', 0.1)


HF_MODEL = 'vit_base_patch16_224.orig_in21k'  # timm's weights on the Hugging Face hub only (no URL)
TINY = dict(embed_dim=32, depth=2, num_heads=2)


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """The Hugging Face hub cache in a temporary folder, offline (as this machine is)."""
    from huggingface_hub import constants
    monkeypatch.setattr(constants, 'HF_HUB_CACHE', str(tmp_path / 'hf'))
    monkeypatch.setattr(constants, 'HF_HUB_OFFLINE', True)
    return tmp_path / 'hf'


def cache_weights(cache, model, repo):
    """`model`'s weights as the hub cache holds a download of `repo`'s model.safetensors."""
    from safetensors.torch import save_file
    snapshot = cache / f'models--{repo.replace("/", "--")}' / 'snapshots' / ('a' * 40)
    snapshot.mkdir(parents=True)
    (snapshot.parent.parent / 'refs').mkdir()
    (snapshot.parent.parent / 'refs' / 'main').write_text('a' * 40)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, snapshot / 'model.safetensors')
    return snapshot / 'model.safetensors'


def test_pretrained_starts_from_timms_weights_in_the_cache_as_finetune_from_that_file(hf_cache, layouts, tmp_path):
    kwargs = ['--model-kwargs', *(f'{k}={v}' for k, v in TINY.items())]
    absent = [HF_MODEL, *kwargs, '--dataset', 'flowers102', '--data-dir', str(layouts['flowers102']), '--pretrained',
              '--output', str(tmp_path / 'absent')]
    with pytest.raises(CheckpointError, match=re.escape(f'hf download timm/{HF_MODEL} model.safetensors (into the '
                                                        f'Hugging Face cache, {hf_cache}), or give the file with '
                                                        f'--finetune FILE')):
        main(absent)
    assert not (tmp_path / 'absent').exists()
    source = timm.create_model(HF_MODEL, **TINY)
    file = cache_weights(hf_cache, source, f'timm/{HF_MODEL}')
    common = [HF_MODEL, *kwargs, '--dataset', 'flowers102', '--data-dir', str(layouts['flowers102']), '--img-size',
              '32', '--batch-size', '8', '--epochs', '1', '--workers', '0', '--device', 'cpu']
    main([*common, '--pretrained', '--output', str(tmp_path / 'cache')])
    main([*common, '--finetune', str(file), '--output', str(tmp_path / 'file')])
    from_cache, from_file = last_weights(tmp_path / 'cache'), last_weights(tmp_path / 'file')
    assert from_cache.keys() == from_file.keys()
    assert all(torch.equal(from_cache[k], from_file[k]) for k in from_cache)
    main([*common, '--output', str(tmp_path / 'random')])  # the same run without them: other weights
    assert not torch.equal(last_weights(tmp_path / 'random')['blocks.0.attn.qkv.weight'],
                           from_file['blocks.0.attn.qkv.weight'])
    # train_cls: --pretrained is no longer refused; it is the same file as the start
    args = train_parser().parse_args([HF_MODEL, '--pretrained'])
    assert start_weights(args) == str(file)
    with pytest.raises(SystemExit):
        train_parser().parse_args([HF_MODEL, '--pretrained', '--finetune', str(file)])
    with pytest.raises(UsageError, match=f'--pretrained takes no file now .* with --finetune {re.escape(str(file))}'):
        train_cls([HF_MODEL, '--pretrained', str(file), '--output', str(tmp_path / 'never')])


def test_a_transfer_set_takes_no_train_cls_preset(layouts, tmp_path):
    with pytest.raises(UsageError, match='--preset standard is a train_cls recipe; the transfer recipe is --dataset '
                                         "cars's"):
        main(transfer_args('cars', layouts['cars'], tmp_path / 'run', '--preset', 'standard'))


def test_the_command_names_a_missing_layout_file_in_one_line(tmp_path):
    from helpers.commands import run_tool
    (tmp_path / 'devkit').mkdir()
    savemat(tmp_path / 'devkit' / 'cars_meta.mat', {'class_names': np.array([['a', 'b']], dtype=object)})
    result = run_tool('transfer.py', [*TINY_DEIT, '--dataset', 'cars', '--data-dir', tmp_path, '--output',
                                      tmp_path / 'run'])
    assert result.returncode != 0 and not (tmp_path / 'run').exists()
    assert result.stderr.strip() == (f'error: {tmp_path / "devkit/cars_train_annos.mat"} is missing: the Stanford Cars '
                                     f'layout is cars_train/, cars_test/, devkit/cars_meta.mat, '
                                     f'devkit/cars_train_annos.mat and cars_test_annos_withlabels.mat (in devkit/ or '
                                     f'the data folder)  (--debug shows the traceback)')


def test_timms_release_is_read_where_timm_caches_it_hub_copy_first_then_the_url_file(hf_cache, tmp_path, monkeypatch):
    """A model whose timm config names both a URL and a hub repo (DeiT-S): its hub copy, what
    `timm.create_model(..., pretrained=True)` caches, is read when there; else the URL's file in torch hub's cache;
    with neither (offline), the error names timm's first choice, the hub repo."""
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch'))  # not torch.hub.set_dir: it outlives the test
    torch_hub = tmp_path / 'torch' / 'hub'
    assert torch.hub.get_dir() == str(torch_hub)
    cfg = timm.models.get_pretrained_cfg('deit_small_patch16_224')
    assert cfg.url and cfg.hf_hub_id == 'timm/deit_small_patch16_224.fb_in1k'
    with pytest.raises(CheckpointError, match=re.escape(f'hf download {cfg.hf_hub_id} model.safetensors')):
        fetch_pretrained('timm', 'deit_small_patch16_224')
    url_file = torch_hub / 'checkpoints' / cfg.url.rsplit('/', 1)[1]
    url_file.parent.mkdir(parents=True)
    url_file.write_bytes(b'the URL file')
    assert fetch_pretrained('timm', 'deit_small_patch16_224') == str(url_file)
    hub_file = cache_weights(hf_cache, torch.nn.Linear(1, 1), cfg.hf_hub_id)
    assert fetch_pretrained('timm', 'deit_small_patch16_224') == str(hub_file)


def test_new_head_is_refused_for_a_transfer_set_whose_classifier_is_always_new(layouts, tmp_path):
    with pytest.raises(UsageError, match=r'^--new-head: a transfer set\'s run always puts a new classifier'):
        main(transfer_args('pets', layouts['pets'], tmp_path / 'run', '--new-head'))
    assert not (tmp_path / 'run').exists()
