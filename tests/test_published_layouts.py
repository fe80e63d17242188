"""Cityscapes, Pascal Context-59 and COCO-Stuff-164k in their published layouts (backbones/dense/semantic/
layouts.py): small trees in the exact file formats read through the configs' data sets, every refusal one line
naming the file and the layout, and the embedded pages written in each layout read back as the pages' class maps."""
from __future__ import annotations

import re
from pathlib import Path

import cv2
import numpy as np
import pytest
from mmengine.config import Config
from mmengine.registry import init_default_scope

import backbones.dense  # noqa: F401  (first: it lets mmseg import on mmcv-lite; registers the suite's modules)

# isort: split
from mmseg.datasets import CityscapesDataset
from mmseg.registry import DATASETS

from backbones.common.errors import DataError
from backbones.common.files import ready_mark
from backbones.dense.data_check import check_dataset
from backbones.dense.layouts import SmallDenseData, layout_of
from backbones.dense.run_data import check_same_embedded_data, trained_data_record
from backbones.dense.semantic.layouts import SMALL_CITY, CityscapesLayout
from backbones.dense.tasks import TASKS
from helpers.commands import ROOT, run_tool, succeeded
from helpers.seg_data import CONFIGS, tiny_model_overrides

SEMANTIC = TASKS['semantic']
SIZE = (24, 16)  # width, height of the fixtures' images
RNG = np.random.default_rng(0)
# cityscapesscripts' labels.py: each of the 19 evaluated classes' name and label id (the `id` column); every other
# label id (0..33) is not evaluated
CITYSCAPES_LABEL_ID_OF = {
    'road': 7, 'sidewalk': 8, 'building': 11, 'wall': 12, 'fence': 13, 'pole': 17, 'traffic light': 19,
    'traffic sign': 20, 'vegetation': 21, 'terrain': 22, 'sky': 23, 'person': 24, 'rider': 25, 'car': 26,
    'truck': 27, 'bus': 28, 'train': 31, 'motorcycle': 32, 'bicycle': 33,
}


@pytest.fixture(autouse=True, scope='module')
def mmseg_scope():
    init_default_scope('mmseg')


def write_image(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), RNG.integers(0, 256, (SIZE[1], SIZE[0], 3), dtype=np.uint8))


def write_mask(path: Path, values: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), values.astype(np.uint8))


def mask_of(ids: list[int]) -> np.ndarray:
    """A mask holding each of `ids` (in order, repeated to fill the image)."""
    return np.resize(np.array(ids, np.uint8), SIZE[1] * SIZE[0]).reshape(SIZE[1], SIZE[0])


def dataset_cfg(config: str, root: Path) -> dict:
    """A real config's training data set at `root`."""
    dataset = Config.fromfile(CONFIGS / config).train_dataloader.dataset.to_dict()
    return {**dataset, 'data_root': str(root)}


def loaded_maps(dataset: dict) -> list[np.ndarray]:
    """Each entry's class map as the data set's reader loads it (mmseg's LoadAnnotations)."""
    built = DATASETS.build({**dataset, 'pipeline': [dict(type='LoadAnnotations')]})
    return [built[i]['gt_seg_map'] for i in range(len(built))]


def refusal(dataset: dict) -> str:
    """The one-line error of the suite's data check of `dataset`."""
    with pytest.raises(DataError) as error:
        check_dataset(dataset, SEMANTIC)
    message = str(error.value)
    assert '\n' not in message
    return message


CITY = 'aachen'
CITY_IMAGES = [f'{CITY}_000000_0000{i}9' for i in range(2)]


@pytest.fixture
def cityscapes(tmp_path) -> Path:
    """A Cityscapes training split as published: PNG images, *_gtFine_labelIds.png holding all 34 label ids."""
    for stem in CITY_IMAGES:
        write_image(tmp_path / 'leftImg8bit' / 'train' / CITY / f'{stem}_leftImg8bit.png')
        write_mask(tmp_path / 'gtFine' / 'train' / CITY / f'{stem}_gtFine_labelIds.png', mask_of(list(range(34))))
    return tmp_path


def label_ids(root: Path, stem: str, kind: str = 'labelIds') -> Path:
    return root / 'gtFine' / 'train' / CITY / f'{stem}_gtFine_{kind}.png'


def test_cityscapes_label_ids_load_as_the_official_train_ids(cityscapes):
    dataset = dataset_cfg('upernet_lvvit_s_cityscapes.py', cityscapes)
    assert check_dataset(dataset, SEMANTIC) == ([0, 1], [])
    # the official label id of each class at its train id (mmseg's class order); all others ignored
    train_id_of = {label_id: CityscapesDataset.METAINFO['classes'].index(name)
                   for name, label_id in CITYSCAPES_LABEL_ID_OF.items()}
    expected = np.vectorize(lambda i: train_id_of.get(i, 255))(mask_of(list(range(34))))
    for loaded in loaded_maps(dataset):
        assert np.array_equal(loaded, expected)
    assert sorted(set(np.unique(expected))) == [*range(19), 255]


def test_mmseg_own_cityscapes_class_without_train_ids_names_the_converter_and_the_suites_class(cityscapes):
    dataset = {**dataset_cfg('upernet_lvvit_s_cityscapes.py', cityscapes), 'type': 'CityscapesDataset'}
    message = refusal(dataset)
    assert message.startswith(f'{label_ids(cityscapes, CITY_IMAGES[0], "labelTrainIds")}: no such file: mmseg\'s '
                              'CityscapesDataset reads only')
    assert "tools/dataset_converters/cityscapes.py writes; type='CityscapesIdsDataset'" in message


def test_cityscapes_train_ids_are_read_where_the_converter_wrote_them(cityscapes):
    train_ids = mask_of([0, 5, 18, 255])
    for stem in CITY_IMAGES:
        write_mask(label_ids(cityscapes, stem, 'labelTrainIds'), train_ids)
    for kind in ('CityscapesIdsDataset', 'CityscapesDataset'):  # the suite's class, and mmseg's as it reads them
        dataset = {**dataset_cfg('upernet_lvvit_s_cityscapes.py', cityscapes), 'type': kind}
        assert check_dataset(dataset, SEMANTIC) == ([0, 1], [])
        assert all(np.array_equal(loaded, train_ids) for loaded in loaded_maps(dataset))


def test_cityscapes_refusals_name_the_file_and_layout(cityscapes):
    dataset = dataset_cfg('upernet_lvvit_s_cityscapes.py', cityscapes)
    write_mask(label_ids(cityscapes, CITY_IMAGES[0], 'labelTrainIds'), mask_of([0]))
    message = refusal(dataset)  # train ids for one image of two: a converter's run cut short
    assert f'1 of 2 images have *_gtFine_labelTrainIds.png, {cityscapes}/leftImg8bit/train/{CITY}/' in message
    assert 'tools/dataset_converters/cityscapes.py' in message and "Cityscapes' layout" in message
    label_ids(cityscapes, CITY_IMAGES[0], 'labelTrainIds').unlink()
    write_mask(label_ids(cityscapes, CITY_IMAGES[1]), mask_of([7, 34, 255]))  # 34: no Cityscapes label id
    message = refusal(dataset)
    assert f'annotation {label_ids(cityscapes, CITY_IMAGES[1])} has label values 34 outside the ids' in message
    assert '(valid: 0..33; 255 ignored)' in message
    label_ids(cityscapes, CITY_IMAGES[1]).unlink()
    message = refusal(dataset)
    assert f'1 of 2 images have no annotation, e.g. {cityscapes}/leftImg8bit/train/{CITY}/' in message
    assert f'(no {label_ids(cityscapes, CITY_IMAGES[1], "labelTrainIds")} or {label_ids(cityscapes, CITY_IMAGES[1])};' \
        in message
    assert "Cityscapes' layout: leftImg8bit/{train,val}/CITY/*_leftImg8bit.png" in message
    for path in (cityscapes / 'gtFine').rglob('*.png'):
        path.unlink()
    (cityscapes / 'gtFine' / 'train' / CITY).rmdir()
    (cityscapes / 'gtFine' / 'train').rmdir()
    assert refusal(dataset).startswith(f'{cityscapes}/gtFine/train: no such folder (Cityscapes\' layout')


CONTEXT_NAMES = ['2008_000002', '2008_000003']


@pytest.fixture
def context(tmp_path) -> Path:
    """A Pascal Context training split as mmseg's converter writes it: masks of 0 (background) and 1..59."""
    for name in CONTEXT_NAMES:
        write_image(tmp_path / 'JPEGImages' / f'{name}.jpg')
        write_mask(tmp_path / 'SegmentationClassContext' / f'{name}.png', mask_of(list(range(60))))
    write_image(tmp_path / 'JPEGImages' / '2008_000004.jpg')  # in no split file: not read
    split = tmp_path / 'ImageSets' / 'SegmentationContext' / 'train.txt'
    split.parent.mkdir(parents=True)
    split.write_text(''.join(f'{name}\n' for name in CONTEXT_NAMES))
    return tmp_path


def test_pascal_context_masks_load_as_59_classes_background_ignored(context):
    dataset = dataset_cfg('upernet_lvvit_s_pascal_context59.py', context)
    assert check_dataset(dataset, SEMANTIC) == ([0, 1], [])
    expected = np.where(mask_of(list(range(60))) == 0, 255, mask_of(list(range(60))).astype(int) - 1)
    maps = loaded_maps(dataset)
    assert len(maps) == 2 and all(np.array_equal(loaded, expected) for loaded in maps)


def test_pascal_context_refusals_name_the_file_and_converter(context):
    dataset = dataset_cfg('upernet_lvvit_s_pascal_context59.py', context)
    mask = context / 'SegmentationClassContext' / f'{CONTEXT_NAMES[1]}.png'
    write_mask(mask, mask_of([0, 59, 60]))  # 60: beyond the 59 classes
    assert f'annotation {mask} has label values 60 beyond the 59 classes (valid: 0..59' in refusal(dataset)
    mask.unlink()
    message = refusal(dataset)
    assert f'1 of 2 images have no annotation, e.g. {context}/JPEGImages/{CONTEXT_NAMES[1]}.jpg' in message
    assert 'tools/dataset_converters/pascal_context.py' in message
    (context / 'JPEGImages' / f'{CONTEXT_NAMES[0]}.jpg').unlink()
    assert refusal(dataset).startswith(f'{context}/ImageSets/SegmentationContext/train.txt lists 1 image(s) not in '
                                       f'{context}/JPEGImages, e.g. {CONTEXT_NAMES[0]}.jpg (Pascal Context\'s layout')
    (context / 'ImageSets' / 'SegmentationContext' / 'train.txt').unlink()
    message = refusal(dataset)
    assert message.startswith(f'{context}/ImageSets/SegmentationContext/train.txt: no such split file (Pascal '
                              'Context\'s layout')
    assert 'pascal_context.py' in message


@pytest.mark.parametrize('lines, says', [
    (f'{CONTEXT_NAMES[0]}\n\n{CONTEXT_NAMES[1]}\n', 'line 2 is blank'),
    (f'{CONTEXT_NAMES[0]}\n{CONTEXT_NAMES[1]}\n{CONTEXT_NAMES[0]}\n',
     f'line 3 lists {CONTEXT_NAMES[0]} again (first on line 1)')])
def test_a_split_file_with_a_blank_or_repeated_line_is_refused_naming_the_line(context, lines, says):
    """mmseg reads a blank line as an image named '' (read as JPEGImages/.jpg) and a repeated name as that image
    twice: trained on twice, or counted twice in a validation split's scores."""
    split_file = context / 'ImageSets' / 'SegmentationContext' / 'train.txt'
    split_file.write_text(lines)
    assert refusal(dataset_cfg('upernet_lvvit_s_pascal_context59.py', context)).startswith(
        f'{split_file}, {says}: one image name a line, each once (Pascal Context\'s layout')


COCO_NAMES = ['000000000009', '000000000025']


@pytest.fixture
def coco_stuff(tmp_path) -> Path:
    """A COCO-Stuff-164k training split as mmseg's converter writes it: train ids 0..170, 255 ignored."""
    for name in COCO_NAMES:
        write_image(tmp_path / 'images' / 'train2017' / f'{name}.jpg')
        write_mask(tmp_path / 'annotations' / 'train2017' / f'{name}_labelTrainIds.png',
                   mask_of([*range(171), 255]))
    return tmp_path


def test_coco_stuff_train_ids_load_as_171_classes(coco_stuff):
    dataset = dataset_cfg('upernet_lvvit_s_coco_stuff164k.py', coco_stuff)
    assert check_dataset(dataset, SEMANTIC) == ([0, 1], [])
    assert all(np.array_equal(loaded, mask_of([*range(171), 255])) for loaded in loaded_maps(dataset))


def test_coco_stuff_refusals_name_the_file_and_converter(coco_stuff):
    dataset = dataset_cfg('upernet_lvvit_s_coco_stuff164k.py', coco_stuff)
    mask = coco_stuff / 'annotations' / 'train2017' / f'{COCO_NAMES[0]}_labelTrainIds.png'
    write_mask(mask, mask_of([3, 171, 254]))  # stuffthingmaps' raw ids, not the converter's train ids
    assert f'annotation {mask} has label values 171, 254 beyond the 171 classes (valid: 0..170' in refusal(dataset)
    mask.unlink()
    assert 'coco_stuff164k.py' in refusal(dataset)
    for path in (coco_stuff / 'annotations' / 'train2017').iterdir():
        path.unlink()
    (coco_stuff / 'annotations' / 'train2017').rmdir()
    message = refusal(dataset)
    assert message.startswith(f'{coco_stuff}/annotations/train2017: no such folder (COCO-Stuff-164k\'s layout')
    assert 'coco_stuff164k.py writes the *_labelTrainIds.png' in message


@pytest.mark.parametrize('config', ['upernet_lvvit_s_cityscapes.py', 'upernet_lvvit_s_coco_stuff164k.py'])
def test_an_annotation_without_its_image_is_refused_naming_it(request, config):
    """An image folder unpacked or copied in part would train (and score) on the images there alone, exit code 0.
    Cityscapes' other annotation files (*_gtFine_color.png ...) and COCO-Stuff's raw maps are not the layout's."""
    if 'cityscapes' in config:
        root = request.getfixturevalue('cityscapes')
        write_mask(root / 'gtFine' / 'train' / CITY / f'{CITY_IMAGES[0]}_gtFine_color.png', mask_of([0]))
        image = root / 'leftImg8bit' / 'train' / CITY / f'{CITY_IMAGES[1]}_leftImg8bit.png'
        unpaired = label_ids(root, CITY_IMAGES[1])
    else:
        root = request.getfixturevalue('coco_stuff')
        write_mask(root / 'annotations' / 'train2017' / f'{COCO_NAMES[0]}.png', mask_of([0]))
        image = root / 'images' / 'train2017' / f'{COCO_NAMES[1]}.jpg'
        unpaired = root / 'annotations' / 'train2017' / f'{COCO_NAMES[1]}_labelTrainIds.png'
    dataset = dataset_cfg(config, root)
    assert check_dataset(dataset, SEMANTIC) == ([0, 1], [])
    image.unlink()
    annotations = root / ('gtFine/train' if 'cityscapes' in config else 'annotations/train2017')
    assert refusal(dataset).startswith(f'1 annotation(s) in {annotations} have no image in '
                                       f'{image.parent.parent if "cityscapes" in config else image.parent}, e.g. '
                                       f'{unpaired}: the images were unpacked or copied in part')


PAGE_CLASSES = ('background', 'one', 'two')


@pytest.fixture(scope='module')
def pages(tmp_path_factory) -> SmallDenseData:
    """A small data set in the tasks' shared layout (the embedded pages'): class c stored as c + 1, 0 ignored."""
    root = tmp_path_factory.mktemp('pages') / 'pages'
    for split, count in (('training', 3), ('validation', 2)):
        for i in range(count):
            write_image(root / 'images' / split / f'page_{split}_{i}.jpg')
            write_mask(root / 'annotations' / split / f'page_{split}_{i}.png', RNG.integers(0, 4, SIZE[::-1]))
    (root / 'READY').write_text('pages v1\n')
    palette = ((0, 0, 0), (255, 0, 0), (0, 255, 0))
    return SmallDenseData(root, PAGE_CLASSES, palette, SIZE, 0.5, (1.0, 1.0), (1.0,), 1000, mirrored=False)


@pytest.mark.parametrize('config', ['upernet_lvvit_s_cityscapes.py', 'fcn_lvvit_s_pascal_context59.py',
                                    'upernet_lvvit_s_coco_stuff164k.py'])
def test_the_pages_written_in_each_layout_read_back_as_the_pages(pages, config):
    cfg = Config.fromfile(CONFIGS / config)
    layout = layout_of(cfg.train_dataloader.dataset)
    SEMANTIC.use_small_data(cfg, pages)
    assert cfg.model.decode_head.num_classes == cfg.model.auxiliary_head.num_classes == len(PAGE_CLASSES)
    for loader, split in (('train_dataloader', 'training'), ('val_dataloader', 'validation')):
        dataset = cfg[loader].dataset.to_dict()
        assert layout_of(dataset) is layout and dataset['data_root'] == str(layout.small_root(pages))
        assert check_dataset(dataset, SEMANTIC)[1] == []
        names = sorted((pages.root / 'annotations' / split).glob('*.png'))
        stored = [cv2.imread(str(path), cv2.IMREAD_UNCHANGED).astype(int) for path in names]
        maps = loaded_maps(dataset)
        assert len(maps) == len(stored)
        for loaded, page in zip(maps, stored):
            assert np.array_equal(loaded, np.where(page == 0, 255, page - 1))
        built = DATASETS.build(dataset)  # the config's own pipeline, its sizes fitted to the pages
        assert built.metainfo['classes'] == PAGE_CLASSES
        if split == 'validation':  # the test's resizing keeps a page at its size (Context's 520x520 would not)
            assert tuple(built[0]['inputs'].shape[1:]) == SIZE[::-1]


@pytest.mark.parametrize('config', ['upernet_lvvit_s_cityscapes.py', 'fcn_lvvit_s_pascal_context59.py',
                                    'upernet_lvvit_s_coco_stuff164k.py'])
def test_a_pictures_ground_truth_is_the_class_map_the_data_set_loads(pages, config):
    """visualize.py segmentation's ground truth (read_annotation of a test entry) is what the model is scored
    against: Cityscapes' label ids drew as classes 7, 8, 11, ... (the pages' digits 6, 7 and none)."""
    from backbones.dense.semantic.pictures import read_annotation

    cfg = Config.fromfile(CONFIGS / config)
    SEMANTIC.use_small_data(cfg, pages)
    dataset = cfg.test_dataloader.dataset.to_dict()
    built = DATASETS.build({**dataset, 'pipeline': []})
    for i, loaded in enumerate(loaded_maps(dataset)):
        entry = built.get_data_info(i)
        truth = read_annotation(entry['seg_map_path'], entry.get('reduce_zero_label', False), entry.get('label_map'))
        assert np.array_equal(truth, loaded), entry['seg_map_path']


@pytest.mark.parametrize('config', ['upernet_lvvit_s_cityscapes.py', 'fcn_lvvit_s_pascal_context59.py',
                                    'upernet_lvvit_s_coco_stuff164k.py'])
def test_predicted_label_maps_are_written_in_the_layouts_own_values(pages, config, tmp_path):
    """test_seg --pred-dir (the IoU metric's output_dir) and predict_seg write a prediction as the data set's masks
    store it: a prediction equal to the ground truth is written as the stored mask on every labelled pixel
    (Cityscapes' label ids: train ids were written, 0..10 where the files hold 7, 8, 11, ...)."""
    import torch

    from backbones.dense.layouts import annotation_values
    from backbones.dense.semantic.metric import IoUReport

    cfg = Config.fromfile(CONFIGS / config)
    SEMANTIC.use_small_data(cfg, pages)
    dataset = cfg.test_dataloader.dataset.to_dict()
    built = DATASETS.build({**dataset, 'pipeline': []})
    metric = IoUReport(output_dir=str(tmp_path))
    metric.dataset_meta = built.metainfo
    for i, loaded in enumerate(loaded_maps(dataset)):
        entry = built.get_data_info(i)
        truth = torch.from_numpy(loaded.astype(np.int64))[None]
        metric.process({}, [{'img_path': entry['img_path'], 'pred_sem_seg': {'data': truth % 255},  # ignored: class 0
                             'gt_sem_seg': {'data': truth}}])
        written = cv2.imread(str(tmp_path / f'{Path(entry["img_path"]).stem}.png'), cv2.IMREAD_UNCHANGED)
        stored = cv2.imread(entry['seg_map_path'], cv2.IMREAD_UNCHANGED)
        labelled = loaded != 255
        assert labelled.any() and np.array_equal(written[labelled], stored[labelled]), entry['seg_map_path']
        assert np.array_equal(annotation_values(loaded[labelled], built.metainfo), stored[labelled])
    # a test set without ground truth (format_only, as mmseg's configs write a test split's maps): the maps alone
    only_maps = IoUReport(output_dir=str(tmp_path / 'maps'), format_only=True)
    only_maps.dataset_meta = built.metainfo
    only_maps.process({}, [{'img_path': entry['img_path'], 'pred_sem_seg': {'data': truth % 255}}])
    assert only_maps.compute_metrics(only_maps.results) == {}
    assert np.array_equal(cv2.imread(str(tmp_path / 'maps' / f'{Path(entry["img_path"]).stem}.png'),
                                     cv2.IMREAD_UNCHANGED), written)


def test_cityscapes_classes_are_written_as_their_official_label_ids(cityscapes):
    from backbones.dense.layouts import annotation_values

    built = DATASETS.build({**dataset_cfg('upernet_lvvit_s_cityscapes.py', cityscapes), 'pipeline': []})
    classes = built.metainfo['classes']
    assert annotation_values(np.arange(len(classes)), built.metainfo).tolist() == [
        CITYSCAPES_LABEL_ID_OF[name] for name in classes]


def test_small_data_of_more_classes_than_a_layout_holds_is_refused(pages, tmp_path):
    many = SmallDenseData(pages.root, tuple(map(str, range(20))), ((0, 0, 0),) * 20, SIZE, 1, (1, 1), (1,), 1, False)
    with pytest.raises(DataError, match='20 classes do not fit the 19 ids of the Cityscapes layout'):
        CityscapesLayout().write_small(many, tmp_path / 'cityscapes')


def test_cityscapes_pages_are_label_ids_pngs_in_a_city_folder(pages):
    cfg = Config.fromfile(CONFIGS / 'upernet_lvvit_s_cityscapes.py')
    SEMANTIC.use_small_data(cfg, pages)
    root = Path(cfg.train_dataloader.dataset.data_root)
    masks = sorted((root / 'gtFine' / 'train').rglob('*'))
    assert {path.parent.name for path in masks if path.is_file()} == {SMALL_CITY}
    assert all(path.name.endswith('_gtFine_labelIds.png') for path in masks if path.is_file())
    values = set().union(*(np.unique(cv2.imread(str(p), cv2.IMREAD_UNCHANGED)).tolist() for p in masks
                           if p.is_file()))
    assert values <= {0, 7, 8, 11}  # unlabeled, then the label ids of train ids 0, 1, 2
    assert all(path.suffix == '.png' for path in (root / 'leftImg8bit').rglob('*.*'))


@pytest.mark.slow  # a tool run
def test_train_seg_refuses_a_cityscapes_folder_without_annotations_in_one_line(cityscapes, tmp_path):
    for path in (cityscapes / 'gtFine').rglob('*.png'):
        path.unlink()
    result = run_tool('train_seg.py', [CONFIGS / 'upernet_lvvit_s_cityscapes.py', '--data-root', cityscapes,
                                       '--work-dir', tmp_path / 'work', '--iters', '1', '--cfg-options',
                                       'model.backbone.pretrained=None'])
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and '2 of 2 images have no annotation' in lines[0], result.stderr[-2000:]


@pytest.mark.slow  # a tool run: the pages written, two iterations, the validation pages scored
@pytest.mark.skipif((ROOT / CityscapesLayout.root).is_dir(), reason='Cityscapes is on disk: no fallback to test')
def test_a_layout_config_trains_on_the_pages_in_its_layout_where_its_data_is_absent(tmp_path):
    """tools/train_seg.py on the Cityscapes config with no data/cityscapes: the embedded pages, written in
    Cityscapes' layout (labelIds PNGs), train a tiny model and are scored."""
    config = tmp_path / 'tiny_upernet_lvvit_s_cityscapes.py'
    model = tiny_model_overrides('upernet_lvvit_s.py')
    config.write_text(f'_base_ = [{str(CONFIGS / "upernet_lvvit_s_cityscapes.py")!r}]\nmodel = {model!r}\n'
                      'train_dataloader = dict(num_workers=0, persistent_workers=False)\n'
                      'val_dataloader = dict(num_workers=0, persistent_workers=False)\n'
                      'test_dataloader = val_dataloader\n')
    pages = tmp_path / 'digits_seg'
    result = succeeded(run_tool('train_seg.py', [config, '--work-dir', tmp_path / 'work', '--iters', '2',
                                                 '--digits-seg-dir', pages, '--digits-dir', tmp_path / 'digits']))
    log = result.stdout + result.stderr
    assert 'Cityscapes not found at data/cityscapes' in log
    written = CityscapesLayout().small_root(SmallDenseData(pages, (), (), SIZE, 1, (1, 1), (1,), 1, False))
    assert f'data: the embedded digits pages in {pages}, written in the layout of Cityscapes in {written}' in log
    assert len(list((written / 'gtFine' / 'val' / SMALL_CITY).glob('*_gtFine_labelIds.png'))) == 160
    assert re.search(r'mIoU: \d+\.\d+', log), log[-3000:]


def small_layout_config(config: str, pages: SmallDenseData) -> Config:
    cfg = Config.fromfile(CONFIGS / config)
    SEMANTIC.use_small_data(cfg, pages)
    return cfg


def test_a_checkpoint_of_the_embedded_pages_is_tested_on_them_as_trained_same_layout_same_version(pages):
    """What a run on the embedded pages records (layout, version) is what a test of its checkpoint must find: another
    layout's config, or the pages of another version, is one line naming both, never a score against other ground
    truth; a checkpoint from before the record is not checked."""
    cityscapes = small_layout_config('upernet_lvvit_s_cityscapes.py', pages)
    context = small_layout_config('fcn_lvvit_s_pascal_context59.py', pages)
    record = trained_data_record(cityscapes, embedded=True)
    assert record['layout'] == 'Cityscapes'
    assert record['data_version'] == ready_mark(cityscapes.test_dataloader.dataset.data_root) != ''
    check_same_embedded_data(cityscapes, record, 'c.pth')  # as trained: nothing said
    with pytest.raises(DataError, match=r'^c.pth was trained on the embedded pages in the Cityscapes layout; this '
                                        r'config reads them in the Pascal Context-59 layout: give the config'):
        check_same_embedded_data(context, record, 'c.pth')
    with pytest.raises(DataError, match=r"^c.pth was trained on another version of the embedded data \('old'; "
                                        r'here: .*train it again$'):
        check_same_embedded_data(cityscapes, {**record, 'data_version': 'old\n'}, 'c.pth')
    check_same_embedded_data(context, {'data_root': '/x', 'embedded': True}, 'c.pth')  # before the record
