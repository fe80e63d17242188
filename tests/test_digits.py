"""The embedded default data: scikit-learn's digits written as a real ImageNet-layout folder and as the segmentation
set, and another annotator's token labels for them (`make run`'s own path is the start of test_seg_chain.py)."""
import json

import cv2
import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_digits

from backbones.common.images import scan_split
from classification.digits.scans import IMAGE_SIZE, VAL_EVERY, write_digits_folder
from classification.token_labeling.label_store import TokenLabelStore
from helpers.commands import run_python, succeeded

pytestmark = pytest.mark.slow  # tools run end to end here: make test-fast leaves this file out


def test_digits_folder_holds_every_scan_under_its_label(tmp_path):
    root = write_digits_folder(tmp_path / 'digits')
    digits = load_digits()
    classes, train = scan_split(root, 'train')
    _, val = scan_split(root, 'val', classes)
    assert classes == [str(d) for d in range(10)]
    assert len(train) + len(val) == len(digits.target) and len(val) == len(range(0, len(digits.target), VAL_EVERY))
    for path, label in train[::97] + val[::31]:
        n = int(path.rsplit('/', 1)[1].split('.')[0])
        assert label == digits.target[n]
        image = Image.open(root / path)
        assert image.size == (IMAGE_SIZE, IMAGE_SIZE)
        scan = np.asarray(image.convert('L').resize((8, 8), Image.BOX), dtype=np.float64)
        assert np.corrcoef(scan.ravel(), digits.images[n].ravel())[0, 1] > 0.9


def test_an_older_folder_is_replaced(tmp_path):
    root = tmp_path / 'digits'
    (root / 'train' / '0').mkdir(parents=True)
    (root / 'train' / '0' / 'stale.png').write_bytes(b'')
    (root / 'READY').write_text('an older version\n')
    write_digits_folder(root)
    assert not (root / 'train' / '0' / 'stale.png').exists()


def test_segmentation_pages_label_every_digit_where_its_ink_is(tmp_path):
    from classification.digits.pages import GRID, SPLITS, scan_splits, write_digits_ade
    from classification.digits.pages import IMAGE_SIZE as PAGE
    root = write_digits_ade(tmp_path / 'seg')
    cell_w, cell_h = PAGE[0] // GRID[0], PAGE[1] // GRID[1]
    for split, count in SPLITS.items():
        images = sorted((root / 'images' / split).glob('*.jpg'))
        assert len(images) == count
        for path in images[::25]:
            grey = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE).astype(np.float32)
            label = cv2.imread(str(root / 'annotations' / split / (path.stem + '.png')), cv2.IMREAD_UNCHANGED)
            assert grey.shape == label.shape == (PAGE[1], PAGE[0])
            digit, ground = label >= 2, label == 1
            assert digit.any() and grey[digit].min() > 60 and np.median(grey[ground]) < 20
            for row in range(GRID[1]):  # one digit (class) per cell at most
                for col in range(GRID[0]):
                    cell = label[row * cell_h:(row + 1) * cell_h, col * cell_w:(col + 1) * cell_w]
                    assert len(set(np.unique(cell)) - {0, 1}) <= 1
    held_out = scan_splits(1797)
    assert set(held_out['validation']) == set(range(0, 1797, VAL_EVERY))
    assert not set(held_out['validation']) & set(held_out['training'])


@pytest.fixture(scope='module')
def resnet18_digits(tmp_path_factory):
    """--digits-annotator resnet18's data step (Figure 4 right), in process as the command runs it, at 32 px (2x2
    tokens, under half the default size's work) and for 3 of its recipe's 6 epochs (what is tested is which annotator
    trains and where its labels go; make run's test checks the recipe's own): the digits, that annotator trained on
    them and its token labels."""
    from dataclasses import replace

    from backbones.common.distributed import DistInfo
    from classification.digits import cls_data
    from classification.train import prepare_embedded_data
    digits = tmp_path_factory.mktemp('annotator') / 'digits'
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(cls_data.ANNOTATOR_RECIPE, 'epochs', 3)
        prepare_embedded_data(cls_data.EmbeddedScans(digits, 'resnet18'),
                              replace(cls_data.pretraining_recipe('lvvit_s', {}), img_size=32), DistInfo(), workers=0)
    return digits


def test_another_annotator_labels_the_digits_in_folders_of_its_own(resnet18_digits):
    """That model is trained and writes its own store; the default annotator's folders are not made."""
    annotator = json.loads((resnet18_digits / 'annotator_resnet18' / 'metrics.json').read_text())
    assert annotator['model'] == 'resnet18' and annotator['epochs'] == 3 and annotator['top1'] > 90  # 97.2% at 3
    store = TokenLabelStore(resnet18_digits / 'token_labels_resnet18')
    assert store.meta['annotator'] == 'resnet18' and store.grid == (2, 2)
    assert not (resnet18_digits / 'annotator').exists() and not (resnet18_digits / 'token_labels').exists()


def test_the_run_learns_from_the_annotator_it_names(resnet18_digits, tmp_path):
    """train_cls --digits-annotator resnet18 takes that annotator's store (kept from its data step), not the
    default one's, which it does not make."""
    out = tmp_path / 'run'
    result = succeeded(run_python(['tools/train_cls.py', 'lvvit_s', '--digits-dir', resnet18_digits,
                                   '--digits-annotator', 'resnet18', '--output', out, '--epochs', '1', '--workers',
                                   '0', '--img-size', '32', '--model-kwargs', 'depth=1', 'embed_dim=64',
                                   'num_heads=2'], timeout=900))
    assert 'digits: training the annotator' not in result.stdout  # kept from the data step
    assert json.loads((out / 'metrics.json').read_text())['token_labeling']
    assert not (resnet18_digits / 'annotator').exists() and not (resnet18_digits / 'token_labels').exists()


def test_the_data_step_writes_the_scans_and_leaves_the_annotation_to_train_cls(tmp_path):
    """`image_data` writes the scans and names where their token labels go; training the annotator and writing its
    labels are train_cls's stages (`prepare_embedded_data`), which `annotation` describes: nothing is trained here."""
    from backbones.common.distributed import DistInfo
    from classification.digits import cls_data
    from classification.recipes import recipe_for
    scans = cls_data.EmbeddedScans(tmp_path / 'digits')
    recipe = cls_data.pretraining_recipe('lvvit_s', {})
    data = scans.image_data(recipe, DistInfo())
    assert len(list((data.root / 'train').rglob('*.png'))) > 1000 and data.token_labels == scans.labels_dir()
    assert not scans.labels_dir().exists() and not scans.annotator_dir().exists()
    annotation = scans.annotation(recipe)
    assert (annotation.model, annotation.run_dir, annotation.labels_dir) == (
        'resnet10t', scans.annotator_dir(), scans.labels_dir())
    assert annotation.recipe.img_size == recipe.img_size and not annotation.recipe.uses_score_maps
    standard = recipe_for('lvvit_s', 'standard', cls_data.RECIPE)
    assert scans.annotation(standard) is None and scans.image_data(standard, DistInfo()).token_labels is None
