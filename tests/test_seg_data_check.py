"""Segmentation data is checked before a run: each damaged or mismatched file is named, nothing is used silently."""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from mmengine.registry import init_default_scope

import backbones.dense  # noqa: F401  (registers the suite's mmseg modules)
from backbones.common.errors import DataError
from backbones.dense.data_check import check_dataset
from backbones.dense.tasks import TASKS
from helpers.seg_data import ade20k_name, write_pair, write_tiny_ade

init_default_scope('mmseg')

SEMANTIC = TASKS['semantic']


def training_set(root: Path) -> dict:
    return dict(type='ADE20KDataset', data_root=str(root), pipeline=[],
                data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'))


@pytest.fixture
def ade(tmp_path) -> Path:
    return write_tiny_ade(tmp_path / 'ade', counts=(('training', 4),))


def first(root: Path, kind: str) -> Path:
    return sorted((root / kind / 'training').iterdir())[0]


def test_a_clean_set_passes_whole(ade):
    assert check_dataset(training_set(ade), SEMANTIC) == ([0, 1, 2, 3], [])


def test_a_truncated_image_is_named_or_left_out_when_asked(ade):
    image = first(ade, 'images')
    image.write_bytes(image.read_bytes()[:300])
    with pytest.raises(DataError, match=rf'1 of 4 images .*{image.name} cannot be decoded.*--skip-unreadable'):
        check_dataset(training_set(ade), SEMANTIC)
    keep, left_out = check_dataset(training_set(ade), SEMANTIC, skip_unreadable=True)
    assert keep == [1, 2, 3] and left_out == [str(image)]


@pytest.mark.parametrize('damage, message', [
    ('missing', 'has no annotation'),
    ('size', r'is \d+x\d+, its image'),
    ('rgb', r'is RGB \(3 channels\)'),
    ('range', r'label values 151, 200 beyond the 150 classes \(valid: 0..150, 255 ignored\)'),
])
def test_annotation_faults_are_named(ade, damage, message):
    annotation = first(ade, 'annotations')
    label = cv2.imread(str(annotation), cv2.IMREAD_UNCHANGED)
    if damage == 'missing':
        annotation.unlink()
    elif damage == 'size':
        cv2.imwrite(str(annotation), label[:-3])
    elif damage == 'rgb':
        cv2.imwrite(str(annotation), np.dstack([label] * 3))
    else:
        label[5, 5], label[6, 6], label[7, 7] = 151, 200, 255  # 255 is the ignore value: allowed
        cv2.imwrite(str(annotation), label)
    with pytest.raises(DataError, match=message) as info:
        check_dataset(training_set(ade), SEMANTIC, skip_unreadable=True)  # only undecodable images may be left out
    assert annotation.name in str(info.value) or damage == 'missing'


def test_images_mmseg_would_not_list_are_named(ade):
    image = first(ade, 'images')
    cv2.imwrite(str(image.with_suffix('.png')), cv2.imread(str(image)))
    image.unlink()
    with pytest.raises(DataError, match=rf'1 image file\(s\) .* are not .jpg .*{image.with_suffix(".png").name}'):
        check_dataset(training_set(ade), SEMANTIC)


@pytest.mark.parametrize('orientation', [3, 6])
def test_every_reader_takes_the_pixels_as_stored_ignoring_exif_orientation(tmp_path, orientation):
    """The suite's rule: images as stored, EXIF orientation ignored, as annotations are. A JPEG tagged to be turned
    (3: 180 degrees, 6: 90 degrees) keeps its stored pixels in every segmentation pipeline (so it still matches its
    PNG annotation) and in the classification / label-generation reader."""
    from mmseg.registry import TRANSFORMS
    from PIL import Image

    from backbones.common.images import read_image
    from backbones.dense.config import load_config
    from helpers.seg_data import CONFIGS
    y, x = np.mgrid[0:48, 0:80]
    stored = np.stack([x * 3, y * 5, (x + y) * 2], axis=-1).astype(np.uint8)  # no symmetry
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / 'turned.jpg'
    Image.fromarray(stored).save(path, quality=100, exif=exif.tobytes())
    decoded = np.asarray(Image.open(path).convert('RGB')).astype(np.float32)  # PIL: the stored pixels
    assert np.abs(decoded - stored).mean() < 2
    cfg = load_config(CONFIGS / 'upernet_lvvit_s.py')
    for pipeline in (cfg.train_pipeline, cfg.test_pipeline, cfg.tta_pipeline):
        loaded = TRANSFORMS.build(pipeline[0])({'img_path': str(path)})['img'][..., ::-1]  # BGR -> RGB
        assert loaded.shape == stored.shape
        assert np.abs(loaded.astype(np.float32) - decoded).mean() < 2
    np.testing.assert_array_equal(np.asarray(read_image(path)), decoded.astype(np.uint8))


def tag_orientation(image: Path, orientation: int) -> None:
    """Give a JPEG the EXIF orientation tag (its pixels stay as they are)."""
    from PIL import Image
    exif = Image.Exif()
    exif[0x0112] = orientation
    with Image.open(image) as opened:
        pixels = opened.copy()
    pixels.save(image, quality=95, exif=exif.tobytes())


@pytest.mark.parametrize('shape', ['square', 'turned mask'])
def test_an_image_with_an_exif_orientation_is_named_with_what_to_do(tmp_path, shape):
    """A photo stored on its side and tagged to be shown upright (orientation 6), its mask drawn on the upright
    picture in an EXIF-aware tool: square, the mask fits the stored image's size but not its pixels (trained turned by
    90 degrees, silently); otherwise the sizes differ, and the message says why."""
    root = tmp_path / 'ade'
    side = 48 if shape == 'square' else 40
    rng = np.random.default_rng(0)
    label = rng.integers(1, 5, (48, side)).astype(np.uint8)
    write_pair(root, 'annotations', 'training', ade20k_name('training', 0), np.rot90(label[..., None] * 40, -1)
               .repeat(3, axis=-1), label)  # stored turned: shown upright, the mask's way
    image = root / 'images' / 'training' / f'{ade20k_name("training", 0)}.jpg'
    tag_orientation(image, 6)
    sizes = '' if shape == 'square' else r' \(its annotation .*\.png is 40x48, the stored image 48x40\)'
    with pytest.raises(DataError, match=rf'{image.name} has EXIF orientation 6 \(viewers show it turned 90 degrees\)'
                                        rf'{sizes}: images and masks are read as stored.*ImageOps\.exif_transpose'):
        check_dataset(training_set(root), SEMANTIC)
    tag_orientation(image, 1)  # "as stored": nothing to say
    if shape == 'square':
        assert check_dataset(training_set(root), SEMANTIC) == ([0], [])
