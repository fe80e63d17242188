"""The embedded default data: scikit-learn's digits inked into small scenes, written as an ImageNet-layout folder."""
import numpy as np
from PIL import Image
from sklearn.datasets import load_digits

from classification.data import scan_split
from classification.digits import (DIGIT_SIZE, IMAGE_SIZE, VAL_EVERY, digit_scene, load_photos,
                                   write_digits_folder)


def test_digits_folder_holds_every_scan_under_its_label(tmp_path):
    root = tmp_path / 'digits'
    assert write_digits_folder(root) and not write_digits_folder(root)  # written once, then found on disk
    digits = load_digits()
    photos = load_photos()
    classes, train = scan_split(root, 'train')
    _, val = scan_split(root, 'val', classes)
    assert classes == [str(d) for d in range(10)]
    assert len(train) + len(val) == len(digits.target) and len(val) == len(range(0, len(digits.target), VAL_EVERY))
    assert all(int(path.rsplit('/', 1)[1].split('.')[0]) % VAL_EVERY == 0 for path, _ in val)
    for path, label in train[::97] + val[::31]:
        n = int(path.rsplit('/', 1)[1].split('.')[0])
        assert label == digits.target[n]
        stored = np.asarray(Image.open(root / path))
        scene, (top, left, size) = digit_scene(n, digits.images[n], photos)
        assert stored.shape == (IMAGE_SIZE, IMAGE_SIZE, 3) and np.array_equal(stored, scene)
        assert DIGIT_SIZE[0] <= size <= DIGIT_SIZE[1] and top + size <= IMAGE_SIZE and left + size <= IMAGE_SIZE
        # the scan is where the scene says: its square, brought back to 8x8, looks like the scan
        square = Image.fromarray(stored[top:top + size, left:left + size]).convert('L').resize((8, 8), Image.BOX)
        assert np.corrcoef(np.asarray(square, np.float64).ravel(), digits.images[n].ravel())[0, 1] > 0.8


def test_an_older_folder_is_replaced(tmp_path):
    root = tmp_path / 'digits'
    (root / 'train' / '0').mkdir(parents=True)
    (root / 'train' / '0' / 'stale.png').write_bytes(b'old')
    (root / 'READY').write_text('sklearn.datasets.load_digits\n')  # the first version's marker
    assert write_digits_folder(root)
    assert not (root / 'train' / '0' / 'stale.png').exists()
