"""The embedded default data: scikit-learn's digits written as a real ImageNet-layout folder."""
import cv2
import numpy as np
from PIL import Image
from sklearn.datasets import load_digits

from classification.data import scan_split
from classification.digits import DIGIT_SIZE, IMAGE_SIZE, VAL_EVERY, write_digits_folder


def best_placement(page: np.ndarray, scan: np.ndarray):
    """(correlation, size, (left, top)) of the scan's best match on the page over every size and place."""
    best = (-1.0, 0, (0, 0))
    for size in range(DIGIT_SIZE[0], DIGIT_SIZE[1] + 1):
        template = cv2.resize(scan.astype(np.float32) / 16, (size, size), interpolation=cv2.INTER_LINEAR)
        _, score, _, place = cv2.minMaxLoc(cv2.matchTemplate(page, template, cv2.TM_CCORR_NORMED))
        best = max(best, (float(score), size, place))
    return best


def test_digits_folder_holds_every_scan_under_its_label_on_a_black_page(tmp_path):
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
        page = np.asarray(image.convert('L'), dtype=np.float32) / 255
        score, size, (left, top) = best_placement(page, digits.images[n])
        assert score > 0.99, (path, score)
        page[top:top + size, left:left + size] = 0
        assert page.max() == 0, f'{path}: ink outside the scan'  # the rest of the page is black


def test_an_older_folder_is_replaced(tmp_path):
    root = tmp_path / 'digits'
    (root / 'train' / '0').mkdir(parents=True)
    (root / 'train' / '0' / 'stale.png').write_bytes(b'')
    (root / 'READY').write_text('an older version\n')
    write_digits_folder(root)
    assert not (root / 'train' / '0' / 'stale.png').exists()
