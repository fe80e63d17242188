"""The data layouts' seam: every data set a config reads is a registered `DataLayout` (ADE20K, COCO, NYU-v2 and own
data too, each from its task's folder), whose folders are the ones the embedded data stands in for, and a layout of a
test's own, registered from one module, trains, tests and predicts through the unchanged tools and takes the
embedded pages in its own files."""
from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from mmengine.config import Config
from mmengine.registry import init_default_scope

import backbones.dense  # noqa: F401  (first: it lets mmseg import on mmcv-lite; registers the suite's modules)

# isort: split
from mmseg.registry import DATASETS

from backbones.common.errors import DataError
from backbones.dense.config import datasets
from backbones.dense.data_check import check_dataset
from backbones.dense.layouts import LAYOUTS, SmallDenseData, layout_of, layout_roots
from backbones.dense.run_data import missing_data, trained_data_record
from backbones.dense.tasks import TASKS
from helpers.commands import ENV, ROOT, one_line_error, run_tool, succeeded
from helpers.seg_data import CONFIGS, write_tiny_config

SEMANTIC = TASKS['semantic']
TOY_CLASSES = ('ground', 'square', 'bar')
SIZE = (64, 48)  # width, height of the toy set's images
STAND_INS = {'data/ade/ADEChallengeData2016': 'ADE20K', 'data/coco': 'COCO', 'data/nyu': 'NYU-v2',
             'data/own_seg': 'a data set of your own', 'data/own_coco': 'a COCO-format set of your own'}


@pytest.fixture(autouse=True, scope='module')
def mmseg_scope():
    init_default_scope('mmseg')


def test_every_configs_data_set_is_a_registered_layout_declared_in_its_tasks_folder():
    configs = sorted(path for path in CONFIGS.glob('*.py'))
    for path in configs:
        for dataset in datasets(Config.fromfile(path)):
            assert layout_of(dataset) is not None, f'{path.name}: {dataset["type"]}'
    assert layout_roots().items() >= STAND_INS.items()  # the folders the embedded data stands in for, as before
    where = {layout.title: type(layout).__module__ for layout in LAYOUTS.values() if layout.title in STAND_INS.values()}
    semantic, depth, instances = (f'backbones.dense.{module}' for module in ('semantic.task', 'depth.task',
                                                                             'instances.coco'))
    assert where == {'ADE20K': semantic, 'a data set of your own': semantic, 'NYU-v2': depth, 'COCO': instances,
                     'a COCO-format set of your own': instances}


def write_toy_set(root: Path, counts=(('train', 6), ('val', 3)), seed: int = 0) -> Path:
    """The toy layout (tests/helpers/toy_dense_layout.py: SPLIT/pictures, SPLIT/labels): on ground (class 0), a
    square (1) and a bar (2), each drawn in its own grey; a few pixels ignored (255)."""
    rng = np.random.default_rng(seed)
    width, height = SIZE
    for split, count in counts:
        for folder in ('pictures', 'labels'):
            (root / split / folder).mkdir(parents=True)
        for i in range(count):
            label = np.zeros((height, width), np.uint8)
            y, x = rng.integers(0, height - 20), rng.integers(0, width - 20)
            label[y:y + 20, x:x + 20] = 1
            label[:, int(rng.integers(0, width - 8)):][:, :8] = 2
            image = np.stack([label * 90 + 30] * 3, -1).astype(np.uint8)
            label[-2:, :4] = 255
            cv2.imwrite(str(root / split / 'pictures' / f'{split}_{i}.jpg'), image)
            cv2.imwrite(str(root / split / 'labels' / f'{split}_{i}.png'), label)
    return root


def write_toy_config(folder: Path, data_root: Path | str) -> Path:
    """A tiny UperNet config reading the toy layout at `data_root`, which names the layout's module in its
    custom_imports."""
    base = write_tiny_config(folder / 'tiny_base.py', 'upernet_lvvit_s.py', Path('unused'))
    palette = [[0, 0, 0], [255, 0, 0], [0, 0, 255]]
    loaders = {loader: dict(dataset=dict(type='ToySegDataset', data_root=str(data_root),
                                         data_prefix=dict(img_path=f'{split}/pictures', seg_map_path=f'{split}/labels'),
                                         metainfo=dict(classes=TOY_CLASSES, palette=palette)))
               for loader, split in (('train_dataloader', 'train'), ('val_dataloader', 'val'),
                                     ('test_dataloader', 'val'))}
    heads = dict(decode_head=dict(num_classes=len(TOY_CLASSES)), auxiliary_head=dict(num_classes=len(TOY_CLASSES)))
    config = folder / 'toy.py'
    config.write_text(f'_base_ = [{str(base)!r}]\n' + ''.join(f'{key} = {value!r}\n' for key, value in loaders.items())
                      + f'model = {heads!r}\n'
                      "custom_imports = dict(imports=['backbones.dense', 'toy_dense_layout'], "
                      "allow_failed_imports=False)\n")
    return config


TOOL_ENV = {**ENV, 'PYTHONPATH': str(ROOT / 'tests' / 'helpers')}  # where the tools find the layout's module


@pytest.fixture(scope='module')
def toy(tmp_path_factory) -> tuple[Path, Path, Path]:
    """The toy set, its config, and a checkpoint train_seg trained on it for two iterations."""
    root = tmp_path_factory.mktemp('toy')
    data = write_toy_set(root / 'toy_set')
    config = write_toy_config(root, data)
    succeeded(run_tool('train_seg.py', [config, '--work-dir', root / 'work', '--iters', '2', '--pictures', '0'],
                       env=TOOL_ENV))
    return data, config, root / 'work' / 'iter_2.pth'


@pytest.mark.slow  # tools run end to end
def test_a_layout_registered_in_one_module_trains_tests_and_predicts_through_the_unchanged_tools(toy, tmp_path):
    data, config, checkpoint = toy
    succeeded(run_tool('test_seg.py', [config, checkpoint, '--out', tmp_path / 'scores.json', '--work-dir',
                                       tmp_path / 'work'], env=TOOL_ENV))
    report = json.loads((tmp_path / 'scores.json').read_text())
    assert 0 <= report['mIoU'] <= 100 and list(report['per_class']) == list(TOY_CLASSES)

    image = sorted((data / 'val' / 'pictures').glob('*.jpg'))[0]
    succeeded(run_tool('predict_seg.py', [config, checkpoint, image, '--out', tmp_path / 'masks'], env=TOOL_ENV))
    written = cv2.imread(str(tmp_path / 'masks' / f'{image.stem}.png'), cv2.IMREAD_UNCHANGED)
    assert written.shape == SIZE[::-1] and set(np.unique(written)) <= {0, 1, 2}  # the toy's values: the class

    label = data / 'val' / 'labels' / f'{image.stem}.png'
    label.rename(tmp_path / 'away.png')  # the layout's own check refuses, in one line
    try:
        refused = one_line_error(run_tool('test_seg.py', [config, checkpoint], env=TOOL_ENV))
    finally:
        (tmp_path / 'away.png').rename(label)
    assert refused.startswith(f'error: {image} has no label {label} (the toy layout: SPLIT/pictures/NAME.jpg, '
                              'SPLIT/labels/NAME.png)')


@pytest.fixture(scope='module')
def pages(tmp_path_factory) -> SmallDenseData:
    """A small data set in the tasks' shared layout (the embedded pages'): class c stored as c + 1, 0 ignored."""
    root = tmp_path_factory.mktemp('pages') / 'pages'
    rng = np.random.default_rng(0)
    for split, count in (('training', 3), ('validation', 2)):
        for folder in ('images', 'annotations'):
            (root / folder / split).mkdir(parents=True)
        for i in range(count):
            cv2.imwrite(str(root / 'images' / split / f'page_{i}.jpg'), rng.integers(0, 256, (48, 64, 3), np.uint8))
            cv2.imwrite(str(root / 'annotations' / split / f'page_{i}.png'), rng.integers(0, 4, (48, 64), np.uint8))
    (root / 'READY').write_text('pages v1\n')
    return SmallDenseData(root, ('background', 'a', 'b'), ((0, 0, 0), (255, 0, 0), (0, 255, 0)), SIZE, 0.5,
                          (1.0, 1.0), (1.0,), 1000, mirrored=False)


def test_a_layout_of_ones_own_takes_the_embedded_pages_in_its_files_where_its_folder_is_absent(pages, tmp_path):
    """Its folder is one the embedded data stands in for; the pages are written in its layout and read back as the
    pages' class maps through its data class; the run records the layout they were written in."""
    from helpers.toy_dense_layout import ToyLayout

    assert missing_data({ToyLayout.root}, fallback=pages) == ToyLayout.root
    cfg = Config.fromfile(write_toy_config(tmp_path, ToyLayout.root), import_custom_modules=False)  # imported above
    SEMANTIC.use_small_data(cfg, pages)
    assert trained_data_record(cfg, embedded=True)['layout'] == 'the toy layout'
    for loader, split in (('train_dataloader', 'training'), ('val_dataloader', 'validation')):
        dataset = cfg[loader].dataset.to_dict()
        assert dataset['data_root'] == str(ToyLayout().small_root(pages)) and check_dataset(dataset, SEMANTIC)[1] == []
        built = DATASETS.build({**dataset, 'pipeline': [dict(type='LoadAnnotations')]})
        for i in range(len(built)):
            stored = cv2.imread(str(pages.root / 'annotations' / split / f'page_{i}.png'), cv2.IMREAD_UNCHANGED)
            assert np.array_equal(built[i]['gt_seg_map'], np.where(stored == 0, 255, stored - 1))
    (ToyLayout().small_root(pages) / 'train' / 'labels' / 'page_0.png').unlink()
    with pytest.raises(DataError, match=r'page_0\.jpg has no label .*labels/page_0\.png \(the toy layout'):
        check_dataset(cfg.train_dataloader.dataset.to_dict(), SEMANTIC)
