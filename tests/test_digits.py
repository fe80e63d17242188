"""The embedded default data: scikit-learn's digits written as a real ImageNet-layout folder."""
import numpy as np
from PIL import Image
from sklearn.datasets import load_digits

from classification.data import scan_split
from classification.digits import IMAGE_SIZE, VAL_EVERY, write_digits_folder


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
        img = np.asarray(Image.open(root / path).convert('L').resize((8, 8), Image.BOX), dtype=np.float64)
        assert img.shape == (8, 8) and Image.open(root / path).size == (IMAGE_SIZE, IMAGE_SIZE)
        assert np.corrcoef(img.ravel(), digits.images[n].ravel())[0, 1] > 0.9
