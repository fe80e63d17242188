"""Instance segmentation, detection and depth: COCO's AP through the suite's metric against known answers and
pycocotools, COCO-format sets of one's own (any category ids, polygons, RLE, crowd regions, images without objects),
their errors, a training step of every backbone family for both tasks, and the tools end to end."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from mmengine.config import Config
from pycocotools import mask as mask_utils
from pycocotools.cocoeval import COCOeval

import backbones.dense  # noqa: F401  (registration)
from backbones.common.errors import DataError, UsageError
from backbones.dense.depth.metric import DepthReport
from backbones.dense.instances.coco import categories, load_coco
from backbones.dense.instances.metric import CocoAP
from backbones.dense.instances.transforms import LargeScaleJitter, decode_mask
from backbones.dense.tasks import task_of
from helpers.commands import ROOT, one_line_error, run_tool, succeeded
from helpers.dense_data import (
    CATEGORIES,
    config_model,
    linked_coco,
    write_tiny_coco,
    write_tiny_dense_config,
    write_tiny_nyu,
)
from helpers.seg_data import CONFIGS


@pytest.fixture(scope='module')
def coco_set(tmp_path_factory) -> Path:
    return write_tiny_coco(tmp_path_factory.mktemp('coco'))


def metric_on(ann_file: Path, predictions: dict[int, dict]) -> dict:
    """CocoAP's scores of per-image predictions (bboxes x1, y1, x2, y2; labels from 0; scores; boolean masks)."""
    names, ids = categories(load_coco(ann_file))
    metric = CocoAP()
    metric.dataset_meta = dict(classes=names, cat_ids=ids, ann_file=str(ann_file))
    metric.process({}, [dict(img_id=image_id, pred_instances=p) for image_id, p in predictions.items()])
    return metric.compute_metrics(metric.results)


def ground_truth_predictions(ann_file: Path, shift: int = 0) -> dict[int, dict]:
    """Every non-crowd instance of a file predicted as it is, or moved `shift` pixels to the right."""
    coco = load_coco(ann_file)
    ids = categories(coco)[1]
    predictions = {}
    for image_id, image in coco.imgs.items():
        found = [a for a in coco.imgToAnns.get(image_id, []) if not a['iscrowd']]
        boxes = torch.tensor([[x + shift, y, x + w + shift, y + h] for x, y, w, h in (a['bbox'] for a in found)],
                             dtype=torch.float64).reshape(-1, 4)
        masks = [np.roll(decode_mask(a['segmentation'], image['height'], image['width']), shift, axis=1)
                 for a in found]
        for mask in masks:
            mask[:, :shift] = 0
        predictions[image_id] = dict(
            bboxes=boxes, labels=torch.tensor([ids.index(a['category_id']) for a in found], dtype=torch.long),
            scores=torch.linspace(1.0, 0.5, len(found)),
            masks=torch.from_numpy(np.stack(masks).astype(bool)) if masks else torch.zeros(0, image['height'],
                                                                                             image['width']))
    return predictions


def test_perfect_predictions_score_an_ap_of_100_under_any_category_ids(coco_set):
    scores = metric_on(coco_set / 'annotations' / 'instances_val.json',
                       ground_truth_predictions(coco_set / 'annotations' / 'instances_val.json'))
    assert scores['box_AP'] == pytest.approx(100) and scores['mask_AP'] == pytest.approx(100)


def test_shifted_predictions_score_what_pycocotools_gives_them(coco_set):
    """Boxes and masks moved 3 px: the metric's AP equals pycocotools' on the same detections written by hand."""
    ann_file = coco_set / 'annotations' / 'instances_val.json'
    scores = metric_on(ann_file, ground_truth_predictions(ann_file, shift=3))
    gt = load_coco(ann_file)
    for kind, key in (('bbox', 'box_AP'), ('segm', 'mask_AP')):
        results = []
        for image_id, p in ground_truth_predictions(ann_file, shift=3).items():
            for box, label, score, mask in zip(p['bboxes'].tolist(), p['labels'], p['scores'], p['masks']):
                rle = mask_utils.encode(np.asfortranarray(mask.numpy().astype(np.uint8)))
                results.append(dict(image_id=image_id, category_id=sorted(CATEGORIES)[label], score=float(score),
                                    bbox=[box[0], box[1], box[2] - box[0], box[3] - box[1]], segmentation=rle))
        evaluation = COCOeval(gt, gt.loadRes(results), kind)
        evaluation.evaluate(), evaluation.accumulate(), evaluation.summarize()
        assert 0 < scores[key] < 100
        assert scores[key] == pytest.approx(100 * evaluation.stats[0], abs=1e-9), kind


def test_a_run_that_detects_nothing_scores_what_pycocotools_gives_one_that_finds_nothing(coco_set, tmp_path):
    """No detection at all (which pycocotools cannot load): 0 where there is ground truth to find, NaN (null in the
    report) where an area range or a category has none, as pycocotools scores a lone detection that matches nothing;
    the tiny set's objects are small, so its large-object APs are undefined, not 0."""
    ann_file = coco_set / 'annotations' / 'instances_val.json'
    coco = load_coco(ann_file)
    names, ids = categories(coco)

    def predicted(image, boxes):
        return dict(bboxes=torch.tensor(boxes, dtype=torch.float64).reshape(-1, 4),
                    labels=torch.zeros(len(boxes), dtype=torch.long), scores=torch.full((len(boxes),), 0.01),
                    masks=torch.zeros(len(boxes), image['height'], image['width'], dtype=torch.bool).index_fill_(
                        1, torch.tensor([0]), True) if boxes else torch.zeros(0, image['height'], image['width']))

    nothing = {image_id: predicted(image, []) for image_id, image in coco.imgs.items()}
    first = min(coco.imgs)
    one_miss = {**nothing, first: predicted(coco.imgs[first], [[0, 0, 1, 1]])}  # far too small to match anything
    metric = CocoAP(json_file=str(tmp_path / 'scores.json'))
    metric.dataset_meta = dict(classes=names, cat_ids=ids, ann_file=str(ann_file))
    metric.process({}, [dict(img_id=image_id, pred_instances=p) for image_id, p in nothing.items()])
    scores, reference = metric.compute_metrics(metric.results), metric_on(ann_file, one_miss)
    assert scores.keys() == reference.keys()
    for key, value in reference.items():
        assert (math.isnan(value) and math.isnan(scores[key])) or value == scores[key] == 0, key
    assert math.isnan(scores['box_APl']) and scores['box_AP'] == 0  # the tiny set has no large object
    report = json.loads((tmp_path / 'scores.json').read_text())
    assert report['box_APl'] is None and report['box_AP'] == 0.0


def test_one_detection_at_iou_0_62_scores_3_of_the_10_thresholds(tmp_path):
    """COCO's AP averages over IoU thresholds 0.50, 0.55, ..., 0.95: a lone match at IoU 0.62 passes three."""
    ann_file = tmp_path / 'one.json'
    ann_file.write_text(json.dumps(dict(
        images=[dict(id=1, file_name='a.jpg', width=120, height=120)], categories=[dict(id=5, name='box')],
        annotations=[dict(id=1, image_id=1, category_id=5, iscrowd=0, area=10000.0, bbox=[0, 0, 100, 100],
                          segmentation=[[0, 0, 100, 0, 100, 100, 0, 100]])])))
    mask = torch.zeros(1, 120, 120, dtype=torch.bool)
    mask[0, :62, :100] = True
    scores = metric_on(ann_file, {1: dict(bboxes=torch.tensor([[0.0, 0, 100, 62]]), labels=torch.tensor([0]),
                                          scores=torch.tensor([0.9]), masks=mask)})
    assert scores['box_AP'] == pytest.approx(30) and scores['mask_AP'] == pytest.approx(30)
    assert scores['box_AP50'] == pytest.approx(100) and scores['box_AP75'] == pytest.approx(0)


def test_a_coco_set_of_ones_own_keeps_its_categories_crowds_and_empty_images(coco_set):
    from mmseg.registry import DATASETS
    dataset = DATASETS.build(dict(type='CocoInstances', data_root=str(coco_set),
                                  ann_file='annotations/instances_train.json', data_prefix=dict(img_path='train/')))
    assert dataset.metainfo['classes'] == tuple(CATEGORIES[i] for i in sorted(CATEGORIES))
    assert dataset.metainfo['cat_ids'] == tuple(sorted(CATEGORIES))
    entries = [dataset.get_data_info(i) for i in range(len(dataset))]
    assert len(entries) == 6 and entries[-1]['instances'] == []
    assert sum(i['ignore_flag'] for i in entries[0]['instances']) == 1
    assert {i['bbox_label'] for e in entries for i in e['instances']} <= {0, 1, 2}


def damaged_files(coco_set: Path, tmp_path: Path) -> dict[str, Path]:
    """Copies of the tiny training file, each with one fault."""
    content = json.loads((coco_set / 'annotations' / 'instances_train.json').read_text())
    faults = {
        'undeclared category': lambda c: c['annotations'][0].update(category_id=99),
        'rle of another size': lambda c: next(a for a in c['annotations'] if isinstance(a['segmentation'], dict))[
            'segmentation'].update(size=[10, 10]),
        'polygon outside': lambda c: c['annotations'][0].update(segmentation=[[0, 0, 500, 0, 500, 40]]),
        'repeated category': lambda c: c['categories'].append(dict(c['categories'][0])),
        'repeated annotation id': lambda c: c['annotations'][1].update(id=c['annotations'][0]['id']),
        'repeated image id': lambda c: c['images'][1].update(id=c['images'][0]['id']),
        'no polygon': lambda c: c['annotations'][0].update(segmentation=[]),
        'rle runs short': lambda c: c['annotations'][0].update(segmentation=dict(size=[48, 64], counts=[10, 5])),
        'rle not decoding': lambda c: c['annotations'][0].update(segmentation=dict(size=[48, 64], counts='@@@@')),
        'box of nan': lambda c: c['annotations'][0].update(bbox=[float('nan'), 1, 2, 3]),
        'annotations not a list': lambda c: c.update(annotations=None),
        'not json': None,
    }
    paths = {}
    for name, fault in faults.items():
        path = tmp_path / f'{name.replace(" ", "_")}.json'
        if fault is None:
            path.write_text('{"images": [')
        else:
            broken = json.loads(json.dumps(content))
            fault(broken)
            path.write_text(json.dumps(broken))
        paths[name] = path
    return paths


def test_masks_are_scored_in_the_size_range_of_their_own_area(tmp_path):
    """A small object found exactly, after a higher-scored false L-shaped mask (small in pixels, large in its box):
    among small objects the mask AP is 50, as the L counts among them; scored by its box's area it would be 100."""
    ann_file = tmp_path / 'small.json'
    ann_file.write_text(json.dumps(dict(
        images=[dict(id=1, file_name='a.jpg', width=200, height=200)], categories=[dict(id=1, name='thing')],
        annotations=[dict(id=1, image_id=1, category_id=1, iscrowd=0, area=100.0, bbox=[5, 5, 10, 10],
                          segmentation=[[5, 5, 15, 5, 15, 15, 5, 15]])])))
    masks = torch.zeros(2, 200, 200, dtype=torch.bool)
    masks[0, 100:160, 100:105] = masks[0, 155:160, 100:160] = True  # an L of 575 px in a 60x60 box
    masks[1, 5:15, 5:15] = True
    scores = metric_on(ann_file, {1: dict(bboxes=torch.tensor([[100.0, 100, 160, 160], [5, 5, 15, 15]]),
                                          labels=torch.tensor([0, 0]), scores=torch.tensor([0.9, 0.8]), masks=masks)})
    assert scores['mask_APs'] == pytest.approx(50) and scores['box_APs'] == pytest.approx(100)


def test_a_file_without_iscrowd_and_area_gets_them_from_its_masks(coco_set, tmp_path):
    content = json.loads((coco_set / 'annotations' / 'instances_val.json').read_text())
    for annotation in content['annotations']:
        del annotation['iscrowd'], annotation['area']
    path = tmp_path / 'plain.json'
    path.write_text(json.dumps(content))
    filled = load_coco(path).anns
    original = load_coco(coco_set / 'annotations' / 'instances_val.json').anns
    assert {i: (a['iscrowd'], a['area']) for i, a in filled.items()} == \
        {i: (0, a['area']) for i, a in original.items()}


def test_the_region_pools_take_the_pyramids_strides_whatever_the_first_image(coco_set, tmp_path):
    """torchvision guesses each level's scale from the first batch (a level off for a 40 px high image padded to
    64) and keeps it: the detector sets them from its pyramid."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmengine.structures import BaseDataElement
    from mmseg.registry import MODELS
    init_default_scope('mmseg')
    cfg = Config.fromfile(write_tiny_dense_config(tmp_path / 'tiny.py', 'maskrcnn_lvvit_s.py', coco_set))
    cfg.model.num_classes = 3
    model = MODELS.build(cfg.model).eval()
    sample = BaseDataElement(metainfo=dict(img_shape=(40, 64), ori_shape=(40, 64)))
    with torch.no_grad():
        model(torch.zeros(1, 3, 64, 64), [sample], mode='predict')
    for pool in (model.roi_heads.box_roi_pool, model.roi_heads.mask_roi_pool):
        assert pool.scales == [1 / 4, 1 / 8, 1 / 16, 1 / 32]
        assert (pool.map_levels.k_min, pool.map_levels.k_max) == (2, 5)


def test_region_align_is_roi_align_v2_in_the_vitdet_configs_and_torchvisions_without(coco_set, tmp_path):
    """ViTDet's configs pool with detectron2's ROIAlignV2 (aligned=True: corners shifted by half a pixel);
    torchvision's MultiScaleRoIAlign has no such option (aligned=False). Each box is pooled from the level
    torchvision's mapper gives it, with torchvision.ops.roi_align(aligned=True); without `aligned_roi`, the pool
    is torchvision's own."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS
    from torchvision.ops import MultiScaleRoIAlign, roi_align

    from backbones.dense.instances.detector import RegionAlign
    init_default_scope('mmseg')
    cfg = Config.fromfile(write_tiny_dense_config(tmp_path / 'tiny.py', 'maskrcnn_lvvit_s.py', coco_set))
    assert cfg.model.aligned_roi is True
    cfg.model.num_classes = 3
    model = MODELS.build(cfg.model)
    assert all(pool.aligned for pool in (model.roi_heads.box_roi_pool, model.roi_heads.mask_roi_pool))
    generator = torch.Generator().manual_seed(4)
    names, strides = ['p2', 'p3', 'p4', 'p5'], [4, 8, 16, 32]
    features = {name: torch.randn(2, 8, 512 // stride, 512 // stride, generator=generator)
                for name, stride in zip(names, strides)}
    corners = torch.rand(2, 30, 2, generator=generator) * 60
    boxes = [torch.cat([c, c + 2 + torch.rand(30, 2, generator=generator) ** 2 * 440], 1) for c in corners]
    aligned = RegionAlign(names, strides, 7, aligned=True)
    got = aligned(features, boxes, [(512, 512)] * 2)
    levels = aligned.map_levels(boxes)
    assert len(levels.unique()) >= 3  # boxes on several levels
    rois = torch.cat([torch.cat([torch.full((30, 1), float(i)), b], 1) for i, b in enumerate(boxes)])
    for number, (roi, level) in enumerate(zip(rois, levels.tolist())):
        expected = roi_align(features[names[level]], roi[None], 7, 1 / strides[level], 0, aligned=True)
        torch.testing.assert_close(got[number], expected[0], rtol=0, atol=1e-6)
    plain = RegionAlign(names, strides, 7)
    reference = MultiScaleRoIAlign(names, 7, 0)
    reference.scales, reference.map_levels = plain.scales, plain.map_levels
    assert torch.equal(plain(features, boxes, [(512, 512)] * 2), reference(features, boxes, [(512, 512)] * 2))
    assert (got - plain(features, boxes, [(512, 512)] * 2)).abs().max() > 1e-2  # the half pixel matters


def test_a_depth_image_without_measurement_is_left_out_and_counted(tmp_path):
    """One entry per image, an empty one too (mmengine gathers processes' results by position): the means are
    the measured images', the report says how many were left out."""
    metric = DepthReport(json_file=str(tmp_path / 'depth.json'), min_depth_eval=1e-3, max_depth_eval=10.0)
    truth = torch.full((1, 4, 4), 2.0)
    samples = [dict(img_path=f'{i}.jpg', pred_depth_map=dict(data=torch.full((1, 4, 4), 2.5)),
                    gt_depth_map=dict(data=truth * (i != 1))) for i in range(3)]
    metric.process({}, samples)
    assert len(metric.results) == 3 and metric.results[1] is None
    scores = metric.compute_metrics(metric.results)
    assert scores['abs_rel'] == pytest.approx(0.25)
    assert json.loads((tmp_path / 'depth.json').read_text())['left_out'] == 1
    from backbones.dense.tasks import TASKS
    assert TASKS['depth'].summary({'abs_rel': 0.25}) == 'abs_rel 0.250'  # a config scoring only some metrics


def test_a_damaged_annotation_file_is_an_error_naming_it(coco_set, tmp_path):
    for name, path in damaged_files(coco_set, tmp_path).items():
        with pytest.raises(DataError, match=str(path)):
            load_coco(path)


def test_an_image_file_listed_twice_or_declared_at_another_size_is_named(coco_set, tmp_path):
    """One file under two image ids (the second without annotations) would train its objects as background; a
    declared width its file does not have is named as such, not blamed on the RLE mask of the file's size."""
    from mmseg.registry import DATASETS
    content = json.loads((coco_set / 'annotations' / 'instances_train.json').read_text())
    twice = json.loads(json.dumps(content))
    twice['images'].append(dict(twice['images'][0], id=999))
    (tmp_path / 'twice.json').write_text(json.dumps(twice))
    with pytest.raises(DataError, match=f'images 100 and 999 are both the file {content["images"][0]["file_name"]}'):
        load_coco(tmp_path / 'twice.json')
    wide = json.loads(json.dumps(content))
    image_id = next(a['image_id'] for a in wide['annotations'] if isinstance(a['segmentation'], dict))
    next(i for i in wide['images'] if i['id'] == image_id)['width'] = 80
    (tmp_path / 'wide.json').write_text(json.dumps(wide))
    with pytest.raises(DataError, match=f'image {image_id} .* is declared 80x48, its file is 64x48'):
        DATASETS.build(dict(type='CocoInstances', data_root=str(coco_set), ann_file=str(tmp_path / 'wide.json'),
                            data_prefix=dict(img_path='train/')))
    data = linked_coco(coco_set, tmp_path / 'data', dict(train=wide, val=wide))
    cfg = Config.fromfile(write_tiny_dense_config(tmp_path / 'tiny.py', 'maskrcnn_lvvit_s.py', data))
    from backbones.dense.instances.coco import use_coco_categories
    with pytest.raises(DataError, match=f'image {image_id} .* is declared 80x48, its file is 64x48'):
        use_coco_categories(cfg)  # as train_seg reads the categories, before any data set is built
    with pytest.raises(DataError, match='RLE mask is'):  # without the images at hand, the mask is what is seen
        load_coco(tmp_path / 'wide.json')


def test_an_id_given_twice_or_an_annotation_of_an_unlisted_image_is_named_with_both_entries(coco_set, tmp_path):
    """pycocotools keys images and annotations by id: a repeated one replaces the other without a word (one
    image's objects given to another)."""
    content = json.loads((coco_set / 'annotations' / 'instances_train.json').read_text())
    first, second = content['images'][:2]
    cases = {
        'images': (lambda c: c['images'][1].__setitem__('id', first['id']),
                   f'the image id {first["id"]} is given twice (images[0] {first["file_name"]} and images[1] '
                   f'{second["file_name"]})'),
        'annotations': (lambda c: c['annotations'][1].__setitem__('id', c['annotations'][0]['id']),
                        f'the annotation id {content["annotations"][0]["id"]} is given twice (annotations[0] of image '
                        f'{content["annotations"][0]["image_id"]}'),
        'text id': (lambda c: c['images'][1].__setitem__('id', '7'),
                    'every image needs a whole-number "id"; images[1] has \'7\''),
        'unlisted': (lambda c: c['annotations'][0].__setitem__('image_id', 12345),
                     f'annotation {content["annotations"][0]["id"]} (image 12345) names an image the file does not '
                     f'list')}
    for name, (change, says) in cases.items():
        broken = json.loads(json.dumps(content))
        change(broken)
        (tmp_path / f'{name}.json').write_text(json.dumps(broken))
        with pytest.raises(DataError, match=re.escape(f'{tmp_path / name}.json: {says}')):
            load_coco(tmp_path / f'{name}.json')


def test_a_training_file_says_which_categories_and_boxes_train_nothing(coco_set, tmp_path, caplog):
    """A category no annotation uses and a box of no width whose polygon has an area: each named in a warning."""
    content = json.loads((coco_set / 'annotations' / 'instances_train.json').read_text())
    content['categories'].append(dict(id=77, name='owl'))
    polygon = next(a for a in content['annotations'] if isinstance(a['segmentation'], list) and not a['iscrowd'])
    polygon['bbox'][2] = 0
    data = linked_coco(coco_set, tmp_path / 'data', dict(train=content, val=content))
    cfg = Config.fromfile(write_tiny_dense_config(tmp_path / 'tiny.py', 'maskrcnn_lvvit_s.py', data))
    from backbones.dense.instances.coco import use_coco_categories
    use_coco_categories(cfg)
    assert '1 categories have no annotation, which the detector never learns: owl (id 77)' in caplog.text
    assert (f'1 annotation(s) with a box of no width or height are left out of training (the first: annotation '
            f'{polygon["id"]} of image {polygon["image_id"]}') in caplog.text


def test_a_depth_set_of_8_bit_maps_or_names_without_a_number_is_refused_naming_them(nyu_set, tmp_path):
    """An 8-bit depth map would be read as 0 .. 255 mm; mmseg's NYU data set fails deep inside on a name without a
    number."""
    import shutil

    from PIL import Image

    from backbones.dense.data_check import check_dataset, depth_pair_check
    image = sorted((nyu_set / 'images' / 'train').glob('*.jpg'))[0]
    Image.new('L', (64, 48), 30).save(tmp_path / 'eight.png')
    assert '8 bits' in depth_pair_check(str(image), str(tmp_path / 'eight.png')).message
    copy = shutil.copytree(nyu_set, tmp_path / 'nyu')
    (copy / 'images' / 'train' / image.name).rename(copy / 'images' / 'train' / 'room_abc.jpg')
    from mmengine.config import Config
    cfg = Config.fromfile(write_tiny_dense_config(tmp_path / 'tiny.py', 'depth_lvvit_s.py', copy))
    with pytest.raises(DataError, match='room_abc.jpg'):
        check_dataset(cfg.train_dataloader.dataset, task_of(cfg))


def test_nonsense_settings_are_errors_naming_them():
    with pytest.raises(UsageError, match='scale_range'):
        LargeScaleJitter(size=(64, 64), scale_range=(2.0, 0.5))
    with pytest.raises(UsageError, match='depth_metrics'):
        DepthReport(depth_metrics=['abs_rel', 'accuracy'])
    from mmseg.registry import MODELS
    with pytest.raises(UsageError, match='num_classes'):
        MODELS.build(dict(config_model('maskrcnn_lvvit_s.py'), num_classes=0))


@pytest.fixture(scope='module')
def nyu_set(tmp_path_factory) -> Path:
    return write_tiny_nyu(tmp_path_factory.mktemp('nyu'))


FAMILIES = ('upernet_lvvit_s.py', 'upernet_t2t_vit_14.py', 'upernet_cait_s24.py', 'upernet_deit_s.py',
            'upernet_dinov2_s.py')  # and a timm ViT of 14 px patches with register tokens


@pytest.mark.parametrize('family', FAMILIES, ids=lambda f: f.split('_', 1)[1][:-3])
@pytest.mark.parametrize('config_name', ['maskrcnn_lvvit_s.py', 'depth_lvvit_s.py'], ids=['detector', 'depth'])
def test_every_backbone_family_trains_a_detector_and_a_depth_model(config_name, family, coco_set, nyu_set, tmp_path):
    """A training step on two images through the config's real pipeline: finite losses, and every weight of the
    backbone, neck and heads gets a gradient."""
    from mmengine.config import Config
    from mmengine.dataset import pseudo_collate
    from mmengine.registry import init_default_scope
    from mmseg.registry import DATASETS, MODELS
    init_default_scope('mmseg')
    config = write_tiny_dense_config(tmp_path / 'tiny.py', config_name,
                                     coco_set if config_name.startswith('maskrcnn') else nyu_set, family)
    cfg = Config.fromfile(config)
    if config_name.startswith('maskrcnn'):
        cfg.model.num_classes = len(CATEGORIES)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.train()
    dataset = DATASETS.build(cfg.train_dataloader.dataset)
    batch = model.data_preprocessor(pseudo_collate([dataset[0], dataset[1]]), True)
    total, _ = model.parse_losses(model(**batch, mode='loss'))  # mmengine's sum of the `loss` terms
    assert torch.isfinite(total)
    total.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, missing[:5]


@pytest.fixture(scope='module')
def trained_detector(coco_set, tmp_path_factory) -> tuple[Path, Path]:
    """A tiny detector's config on the tiny COCO-format set (category ids 3, 17, 42), and its checkpoint after the
    two iterations train_seg sizes the own-data config's schedule to (1 epoch of 6 images, at least 2 updates)."""
    root = tmp_path_factory.mktemp('detector')
    config = write_tiny_dense_config(root / 'tiny.py', 'maskrcnn_lvvit_s_own_data.py', coco_set)
    trained = succeeded(run_tool('train_seg.py', [config, '--work-dir', root / 'work', '--cfg-options',
                                                  'own_data.epochs=1', 'own_data.min_iters=2']))
    assert '1 epochs of 6 images' in trained.stdout + trained.stderr
    return config, root / 'work' / 'iter_2.pth'


@pytest.fixture(scope='module')
def trained_depth(nyu_set, tmp_path_factory) -> tuple[Path, Path]:
    """A tiny depth model's config on the tiny NYU-layout set, and its checkpoint after two iterations."""
    root = tmp_path_factory.mktemp('depth')
    config = write_tiny_dense_config(root / 'tiny.py', 'depth_lvvit_s.py', nyu_set)
    succeeded(run_tool('train_seg.py', [config, '--work-dir', root / 'work', '--iters', '2']))
    return config, root / 'work' / 'iter_2.pth'


@pytest.mark.slow  # tools run end to end
def test_own_coco_set_trains_tests_and_reports_its_categories_by_name(trained_detector, coco_set, tmp_path):
    """train_seg and test_seg on a COCO-format set with category ids 3, 17, 42: the checkpoint records them, the
    report names the categories, predictions.json uses the set's own ids; a set of other categories is refused."""
    config, checkpoint = trained_detector
    meta = torch.load(checkpoint, weights_only=False)['meta']['dataset_meta']
    assert tuple(meta['cat_ids']) == tuple(sorted(CATEGORIES)) and tuple(meta['classes']) == ('cat', 'dog', 'bird')
    out, preds = tmp_path / 'ap.json', tmp_path / 'preds'
    tested = succeeded(run_tool('test_seg.py', [config, checkpoint, '--out', out, '--pred-dir', preds]))
    assert 'box_AP' in tested.stdout + tested.stderr
    report = json.loads(out.read_text())
    assert list(report['per_class']) == ['cat', 'dog', 'bird'] and report['images'] == 3
    detections = json.loads((preds / 'predictions.json').read_text())
    assert {d['category_id'] for d in detections} <= set(CATEGORIES)
    other = json.loads((coco_set / 'annotations' / 'instances_val.json').read_text())
    other['categories'][0]['name'] = 'lion'
    renamed = linked_coco(coco_set, tmp_path / 'renamed', dict(train=other, val=other))
    refused = one_line_error(run_tool('test_seg.py', [config, checkpoint, '--data-root', renamed]))
    assert str(checkpoint) in refused and 'lion' in refused
    # a test needs the test split's file only
    val_only = linked_coco(coco_set, tmp_path / 'val_only', dict(
        val=json.loads((coco_set / 'annotations' / 'instances_val.json').read_text())))
    succeeded(run_tool('test_seg.py', [config, checkpoint, '--data-root', val_only, '--out', tmp_path / 'val.json']))
    assert json.loads((tmp_path / 'val.json').read_text()) == report


@pytest.mark.slow  # tools run end to end
def test_predict_seg_writes_a_detectors_instances_as_a_coco_file_and_overlays(trained_detector, coco_set, tmp_path):
    """instances.json loads in pycocotools, its masks are the images' size, its ids the set's own and its scores at
    least the threshold; each image gets an overlay."""
    from pycocotools.coco import COCO
    config, checkpoint = trained_detector
    images = sorted((coco_set / 'val').glob('*.jpg'))
    out = tmp_path / 'out'
    succeeded(run_tool('predict_seg.py', [config, checkpoint, *images, '--out', out, '--overlay',
                                          '--score-threshold', '0.05']))
    content = json.loads((out / 'instances.json').read_text())
    coco = COCO()
    coco.dataset = content
    coco.createIndex()
    assert [i['file_name'] for i in content['images']] == [str(i) for i in images]
    assert [c['id'] for c in content['categories']] == sorted(CATEGORIES)
    for annotation in content['annotations']:
        assert annotation['score'] >= 0.05 and annotation['category_id'] in CATEGORIES
        assert coco.annToMask(annotation).shape == (48, 64)
    assert sorted(p.name for p in out.glob('*_overlay.png')) == [f'{i.stem}_overlay.png' for i in images]
    # an input image where a prediction would go is refused before any work, the image kept
    photo = tmp_path / 'own' / f'{images[0].stem}.png'
    photo.parent.mkdir()
    cv2.imwrite(str(photo), cv2.imread(str(images[0])))
    before = photo.read_bytes()
    refused = one_line_error(run_tool('predict_seg.py', [config, checkpoint, photo, '--out', photo.parent]))
    assert str(photo) in refused and photo.read_bytes() == before
    # without the data set at hand, the categories come from the checkpoint: the same instances
    elsewhere = write_tiny_dense_config(tmp_path / 'elsewhere.py', 'maskrcnn_lvvit_s_own_data.py', tmp_path / 'gone')
    succeeded(run_tool('predict_seg.py', [elsewhere, checkpoint, *images, '--out', tmp_path / 'again',
                                          '--score-threshold', '0.05']))
    assert json.loads((tmp_path / 'again' / 'instances.json').read_text()) == content


@pytest.mark.slow  # tools run end to end
def test_a_depth_export_gives_the_depth_predict_seg_writes(trained_depth, nyu_set, tmp_path):
    """predict_seg's 16-bit PNG and the exported program (fed as export.json says: RGB, normalised) agree to the
    millimetre on the same image; the detector's export stops at its pyramid."""
    config, checkpoint = trained_depth
    image = sorted((nyu_set / 'images' / 'test').glob('*.jpg'))[0]
    succeeded(run_tool('predict_seg.py', [config, checkpoint, image, '--out', tmp_path / 'depth']))
    written = cv2.imread(str(tmp_path / 'depth' / f'{image.stem}.png'), cv2.IMREAD_UNCHANGED)
    assert written.dtype == np.uint16 and written.shape == (48, 64)
    assert (tmp_path / 'depth' / f'{image.stem}_color.png').is_file()
    succeeded(run_tool('export.py', ['segmentor', config, checkpoint, '--out', tmp_path / 'export', '--size', '48',
                                     '64', '--torch-export']))
    description = json.loads((tmp_path / 'export' / 'export.json').read_text())
    assert description['task'] == 'depth' and description['depth_png_scale'] == 1000
    rgb = cv2.cvtColor(cv2.imread(str(image)), cv2.COLOR_BGR2RGB).astype(np.float32)
    normalised = ((rgb - description['input']['mean']) / description['input']['std']).astype(np.float32)
    program = torch.export.load(tmp_path / 'export' / 'model.pt2').module()
    with torch.no_grad():
        depth = program(torch.from_numpy(normalised).permute(2, 0, 1)[None].contiguous())[0, 0].numpy()
    assert np.abs(depth * 1000 - written).max() <= 1


@pytest.mark.slow  # tools run end to end
def test_a_detectors_export_holds_its_pyramid_and_visualize_draws_its_instances(trained_detector, tmp_path):
    from backbones.dense.export import segmentor_from
    config, checkpoint = trained_detector
    refused = one_line_error(run_tool('export.py', ['segmentor', config, checkpoint, '--out', tmp_path / 'export',
                                                    '--size', '48', '64']))
    assert 'multiples of 32' in refused and not (tmp_path / 'export').exists()
    # the pyramid alone at any size (the whole detector's export: test_export.py): from 96 px, where its coarsest
    # level (p6, stride 64) is two pixels; traced at 64 that level was one pixel, which torch.export fixed, and the
    # program failed its own check at another size after the work
    pyramid = ['segmentor', config, checkpoint, '--out', tmp_path / 'export', '--torch-export', '--pyramid-only',
               '--dynamic-size', '--size']
    refused = one_line_error(run_tool('export.py', [*pyramid, '64', '64']))
    assert 'trace at a size of 96 px or more a side (--size)' in refused and not (tmp_path / 'export').exists()
    succeeded(run_tool('export.py', [*pyramid, '96', '128']))
    description = json.loads((tmp_path / 'export' / 'export.json').read_text())
    assert description['levels'] == ['p2', 'p3', 'p4', 'p5', 'p6'] and 'batched_nms' in description['output']
    assert description['input'] == {**description['input'], 'stride': 32, 'size': 'any multiple of the stride from 96'}
    assert description['network'] == 'pyramid'
    program = torch.export.load(tmp_path / 'export' / 'model.pt2').module()
    model = segmentor_from(tmp_path / 'export')
    for size in ((96, 96), (160, 224)):
        images = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            for got, expected in zip(program(images), model.extract_feat(images).values(), strict=True):
                torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    assert [tuple(level.shape[-2:]) for level in program(images)] == [(40, 56), (20, 28), (10, 14), (5, 7), (3, 4)]
    succeeded(run_tool('visualize.py', ['segmentation', config, checkpoint, '--out', tmp_path / 'picture.png']))
    picture = cv2.imread(str(tmp_path / 'picture.png'))
    assert picture.shape[1] > 3 * 64 * 5  # image, ground truth and prediction, each enlarged to about 256 px high


@pytest.mark.slow  # tools run end to end
def test_an_annotation_of_an_undeclared_category_stops_training_naming_the_file(coco_set, tmp_path):
    content = json.loads((coco_set / 'annotations' / 'instances_train.json').read_text())
    content['annotations'][1]['category_id'] = 7
    broken = linked_coco(coco_set, tmp_path / 'broken', dict(
        train=content, val=json.loads((coco_set / 'annotations' / 'instances_val.json').read_text())))
    config = write_tiny_dense_config(tmp_path / 'tiny.py', 'maskrcnn_lvvit_s.py', broken)
    error = one_line_error(run_tool('train_seg.py', [config, '--work-dir', tmp_path / 'work', '--iters', '2']))
    assert 'instances_train.json' in error and 'category_id 7' in error


def independent_depth_scores(pred_dir: Path, depth_dir: Path) -> dict[str, float]:
    """delta < 1.25, AbsRel, RMSE and log10 of the saved 16-bit predictions against the 16-bit ground truth (both
    millimetres), per image over its measured pixels, then averaged over the images."""
    per_image = []
    for truth_file in sorted(depth_dir.glob('*.png')):
        truth = cv2.imread(str(truth_file), cv2.IMREAD_UNCHANGED).astype(np.float64) / 1000
        predicted = cv2.imread(str(pred_dir / truth_file.name), cv2.IMREAD_UNCHANGED).astype(np.float64) / 1000
        valid = (truth > 1e-3) & (truth < 10)
        t, p = truth[valid], predicted[valid]
        ratio = np.maximum(t / p, p / t)
        per_image.append(dict(d1=np.mean(ratio < 1.25), abs_rel=np.mean(np.abs(p - t) / t),
                              rmse=np.sqrt(np.mean((p - t) ** 2)), log10=np.mean(np.abs(np.log10(p) - np.log10(t)))))
    return {key: float(np.mean([image[key] for image in per_image])) for key in per_image[0]}


@pytest.mark.slow  # tools run end to end
def test_depth_scores_equal_an_independent_count_over_the_saved_predictions(trained_depth, nyu_set, tmp_path):
    config, checkpoint = trained_depth
    out, preds = tmp_path / 'depth.json', tmp_path / 'preds'
    tested = succeeded(run_tool('test_seg.py', [config, checkpoint, '--out', out, '--pred-dir', preds]))
    assert 'abs_rel' in tested.stdout + tested.stderr
    report = json.loads(out.read_text())
    expected = independent_depth_scores(preds, nyu_set / 'annotations' / 'test')
    # the PNGs hold whole millimetres: the saved depth is within 0.5 mm of the scored one
    assert report['abs_rel'] == pytest.approx(expected['abs_rel'], abs=2e-4)
    assert report['rmse'] == pytest.approx(expected['rmse'], abs=1e-3)
    assert report['log10'] == pytest.approx(expected['log10'], abs=1e-4)
    assert report['d1'] == pytest.approx(expected['d1'], abs=0.01)
    assert report['images'] == 3 and report['left_out'] == 0


@pytest.fixture(scope='module')
def depth_trained_elsewhere(nyu_set, tmp_path_factory) -> tuple[Path, Path]:
    """A tiny depth config naming NYU-v2's default folder (data/nyu, not on disk), trained on the tiny set through
    --data-root (a link to it, which a test may take away), as a user trains the shipped config on their own copy:
    its config, checkpoint and data folder."""
    root = tmp_path_factory.mktemp('depth_elsewhere')
    config = write_tiny_dense_config(root / 'tiny.py', 'depth_lvvit_s.py', Path('data/nyu'))
    (root / 'own_nyu').symlink_to(nyu_set)
    succeeded(run_tool('train_seg.py', [config, '--work-dir', root / 'work', '--iters', '2', '--data-root',
                                        root / 'own_nyu']))
    return config, root / 'work' / 'iter_2.pth', root / 'own_nyu'


@pytest.mark.slow  # tools run end to end
def test_a_checkpoint_trained_elsewhere_predicts_at_its_own_sizes_not_the_embedded_pages(depth_trained_elsewhere,
                                                                                         nyu_set, tmp_path):
    """Without --data-root, the config's folder missing: the checkpoint records the data it was trained on, so the
    embedded pages do not stand in (they scaled the test pipeline to a tenth): test_seg scores the folder trained
    on, saying so, predict_seg's maps are test_seg's, no page is written; with that folder gone too, test_seg names
    it and predict_seg still predicts the same maps."""
    config, checkpoint, trained_on = depth_trained_elsewhere
    pages = ROOT / 'data' / 'digits_seg'
    pages_before = sorted(pages.rglob('*')) if pages.exists() else None
    given = tmp_path / 'given.json'
    succeeded(run_tool('test_seg.py', [config, checkpoint, '--data-root', nyu_set, '--out', given,
                                       '--pred-dir', tmp_path / 'tested']))
    recorded = succeeded(run_tool('test_seg.py', [config, checkpoint, '--out', tmp_path / 'recorded.json']))
    assert f'data: {trained_on}, which {checkpoint} was trained on' in recorded.stdout + recorded.stderr
    assert json.loads((tmp_path / 'recorded.json').read_text()) == json.loads(given.read_text())
    images = sorted((nyu_set / 'images' / 'test').glob('*.jpg'))
    # a config whose test size was edited after training: the checkpoint's own test pipeline serves, one line says so
    edited = Config.fromfile(config)
    next(step for step in edited.test_dataloader.dataset.pipeline if step['type'] == 'Resize')['scale'] = (32, 24)
    edited.dump(str(tmp_path / 'edited.py'))
    # a checkpoint from before the record: the same read from the config text its meta holds
    older = torch.load(checkpoint, weights_only=False)
    del older['meta']['trained_data']
    torch.save(older, tmp_path / 'older.pth')
    for out, given_config, given in (('predicted', config, checkpoint), ('edited', tmp_path / 'edited.py', checkpoint),
                                     ('older', config, tmp_path / 'older.pth'), ('without_data', config, checkpoint)):
        if out == 'without_data':
            trained_on.unlink()
        predicted = succeeded(run_tool('predict_seg.py', [given_config, given, *images, '--out', tmp_path / out]))
        said = 'validated with another test pipeline than the config gives' in predicted.stdout + predicted.stderr
        assert said == (out == 'edited')
        assert 'embedded' not in predicted.stdout + predicted.stderr
        for image in images:
            tested = cv2.imread(str(tmp_path / 'tested' / f'{image.stem}.png'), cv2.IMREAD_UNCHANGED)
            written = cv2.imread(str(tmp_path / out / f'{image.stem}.png'), cv2.IMREAD_UNCHANGED)
            assert np.array_equal(written, tested), image
    # an export and a picture without the data: the checkpoint's sizes, no embedded pages
    succeeded(run_tool('export.py', ['segmentor', config, checkpoint, '--out', tmp_path / 'export', '--size', '48',
                                     '64']))
    exported = Config.fromfile(tmp_path / 'export' / 'config.py')
    assert next(step for step in exported.test_dataloader.dataset.pipeline if step['type'] == 'Resize')['scale'] == \
        (64, 48)
    assert 'digits_seg' not in (tmp_path / 'export' / 'config.py').read_text()
    succeeded(run_tool('visualize.py', ['segmentation', config, checkpoint, '--image', images[0], '--out',
                                        tmp_path / 'picture.png']))
    assert (sorted(pages.rglob('*')) if pages.exists() else None) == pages_before
    refused = one_line_error(run_tool('test_seg.py', [config, checkpoint]))
    assert f'{checkpoint} was trained on {trained_on}, which is not on disk' in refused and '--data-root' in refused


@pytest.mark.slow  # tools run end to end
def test_a_checkpoint_of_another_task_is_named_as_one_before_its_classes(trained_detector, trained_depth, tmp_path):
    """A detector's checkpoint given to a depth config, a depth model's to a detector's or a segmentor's config: one
    line names what the checkpoint holds, before any data is read (the embedded pages are not written)."""
    detector_config, detector = trained_detector
    depth_config, depth = trained_depth
    cv2.imwrite(str(tmp_path / 'x.jpg'), np.full((48, 64, 3), 90, np.uint8))
    cases = [(depth_config, detector, 'a detector', 'a depth config'),
             (detector_config, depth, 'a depth model', 'a detection config'),
             (CONFIGS / 'upernet_lvvit_s.py', depth, 'a depth model', 'a semantic segmentation config')]
    for config, checkpoint, holds, kind in cases:
        for tool, args in (('test_seg.py', []), ('predict_seg.py', [tmp_path / 'x.jpg', '--out', tmp_path / 'out'])):
            refused = one_line_error(run_tool(tool, [config, checkpoint, *args]))
            assert f'{checkpoint} holds {holds}' in refused and f'{config} is {kind}' in refused, refused


@pytest.mark.slow  # tools run end to end
def test_predict_seg_names_images_it_cannot_predict_and_keeps_what_it_predicted(trained_detector, trained_depth,
                                                                                 tmp_path):
    """A text file named .jpg is no image (not a format to convert); a 3000x10 image resized to fit 64x48 keeps no
    pixel of its height: both refused before any prediction. An image that fails while predicting keeps the
    instances of the images before it; an EXIF-turned photo is named for every task."""
    from PIL import Image
    detector_config, detector = trained_detector
    depth_config, depth = trained_depth
    photos = tmp_path / 'photos'
    photos.mkdir()
    for i in range(2):
        cv2.imwrite(str(photos / f'a{i}.jpg'), np.random.default_rng(i).integers(0, 255, (48, 64, 3), np.uint8))
    (tmp_path / 'notes.jpg').write_text('not an image')
    cv2.imwrite(str(tmp_path / 'thin.jpg'), np.full((10, 3000, 3), 90, np.uint8))
    refused = one_line_error(run_tool('predict_seg.py', [detector_config, detector, photos, tmp_path / 'notes.jpg',
                                                         '--out', tmp_path / 'out']))
    assert f'{tmp_path / "notes.jpg"} cannot be read as an image' in refused and 'convert' not in refused
    refused = one_line_error(run_tool('predict_seg.py', [detector_config, detector, photos, tmp_path / 'thin.jpg',
                                                         '--out', tmp_path / 'out']))
    assert f'{tmp_path / "thin.jpg"} is 3000x10' in refused and 'leaves 64x0 pixels' in refused
    assert not (tmp_path / 'out').exists()
    cut = tmp_path / 'z_cut.jpg'  # its header reads, its pixels do not decode
    cut.write_bytes((photos / 'a0.jpg').read_bytes()[:2000])
    refused = one_line_error(run_tool('predict_seg.py', [detector_config, detector, photos, cut, '--out',
                                                         tmp_path / 'out', '--score-threshold', '0']))
    assert str(cut) in refused
    kept = json.loads((tmp_path / 'out' / 'instances.json').read_text())
    assert [i['file_name'] for i in kept['images']] == [str(photos / 'a0.jpg'), str(photos / 'a1.jpg')]
    turned = tmp_path / 'turned.jpg'
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(np.full((48, 64, 3), 90, np.uint8)).save(turned, exif=exif)
    for config, checkpoint in ((detector_config, detector), (depth_config, depth)):
        predicted = succeeded(run_tool('predict_seg.py', [config, checkpoint, turned, '--out', tmp_path / 'turned']))
        assert f'{turned} has EXIF orientation 6' in predicted.stdout


def test_refusals_the_command_line_decides_come_before_any_loading(trained_depth, tmp_path):
    """--no-flip without --ms on a depth config is refused from the command line alone (the checkpoint is not even
    read; --ms itself is a depth model's test-time augmentation now, test_tta_on_depth_and_detection_...), and
    test_seg's --out given a folder names --pred-dir."""
    depth_config, _ = trained_depth
    for tool, args in (('predict_seg.py', [tmp_path, '--out', tmp_path / 'out', '--no-flip']),
                       ('test_seg.py', ['--no-flip'])):
        refused = one_line_error(run_tool(tool, [depth_config, tmp_path / 'no_such.pth', *args]))
        assert '--no-flip applies to the multi-scale test' in refused, refused
    refused = one_line_error(run_tool('test_seg.py', [depth_config, tmp_path / 'no_such.pth', '--out', tmp_path]))
    assert '--pred-dir' in refused


@pytest.mark.slow  # tools run end to end
def test_tta_on_depth_and_detection_gives_a_report_naming_the_mode_and_predict_seg_writes_its_files(
        trained_depth, trained_detector, nyu_set, coco_set, tmp_path):
    """test_seg --tta (once refused for both tasks): the depth model's flip-averaged test (its config's one scale)
    and the detector's multi-scale + flip test give their scores, the line naming the mode; the depth model's --tta
    --no-flip, one scale of ratio 1, scores exactly what its plain test does; predict_seg --tta writes each task's
    files."""
    depth_config, depth = trained_depth
    scores, lines = {}, {}
    for mode, options in (('plain', []), ('tta', ['--tta']), ('no_flip', ['--tta', '--no-flip'])):
        out = tmp_path / f'depth_{mode}.json'
        result = succeeded(run_tool('test_seg.py', [depth_config, depth, '--out', out, *options]))
        scores[mode], lines[mode] = json.loads(out.read_text()), result.stdout + result.stderr
    assert f"single-scale + flip: d1 {scores['tta']['d1']:.3f}" in lines['tta'], lines['tta'][-2000:]
    assert 'single-scale: d1' in lines['no_flip'] and scores['no_flip'] == scores['plain']
    assert scores['tta']['abs_rel'] != scores['plain']['abs_rel']

    detector_config, detector = trained_detector
    tested = succeeded(run_tool('test_seg.py', [detector_config, detector, '--tta', '--out', tmp_path / 'det.json']))
    detected = json.loads((tmp_path / 'det.json').read_text())
    assert f"multi-scale + flip: box_AP {detected['box_AP']:.2f}" in tested.stdout + tested.stderr

    image = sorted((nyu_set / 'images' / 'test').glob('*.jpg'))[0]
    succeeded(run_tool('predict_seg.py', [depth_config, depth, image, '--out', tmp_path / 'depth', '--tta']))
    assert sorted(p.name for p in (tmp_path / 'depth').iterdir()) == [f'{image.stem}.png', f'{image.stem}_color.png']
    image = sorted((coco_set / 'val').glob('*.jpg'))[0]
    succeeded(run_tool('predict_seg.py', [detector_config, detector, image, '--out', tmp_path / 'instances', '--tta',
                                          '--score-threshold', '0']))
    written = json.loads((tmp_path / 'instances' / 'instances.json').read_text())
    assert [i['file_name'] for i in written['images']] == [str(image)] and written['annotations']


@pytest.mark.slow  # tools run end to end
def test_a_run_resumed_on_renamed_categories_is_refused_naming_them(trained_detector, coco_set, tmp_path):
    """A detector's run resumed after a category of its training file was renamed would go on under the new name,
    and record it, without a word: one line names the change and how to start a new run from the checkpoint."""
    import shutil
    config, checkpoint = trained_detector
    renamed = {split: json.loads((coco_set / 'annotations' / f'instances_{split}.json').read_text())
               for split in ('train', 'val')}
    for content in renamed.values():
        content['categories'][1]['name'] = 'wolf'
    data = linked_coco(coco_set, tmp_path / 'renamed', renamed)
    work = shutil.copytree(checkpoint.parent, tmp_path / 'work')
    before = sorted(work.rglob('*'))
    refused = one_line_error(run_tool('train_seg.py', [config, '--work-dir', work, '--resume', '--data-root', data,
                                                       '--iters', '4']))
    assert 'was trained on other classes than the training data now declares (dog -> wolf)' in refused
    assert f'load_from={work}' in refused and sorted(work.rglob('*')) == before  # no log folder of its own left


@pytest.mark.slow  # tools run end to end
def test_a_run_resumed_with_another_tasks_config_is_refused_naming_both_before_any_write(trained_depth, coco_set,
                                                                                        tmp_path):
    """A depth run's work folder given to a detector's config with --resume: one line names the depth model and the
    detection config (not a mismatch of classes), and nothing is written into the folder."""
    import shutil
    depth_config, checkpoint = trained_depth
    work = shutil.copytree(checkpoint.parent, tmp_path / 'work')
    before = sorted(work.rglob('*'))
    detector = write_tiny_dense_config(tmp_path / 'detector.py', 'maskrcnn_lvvit_s_own_data.py', coco_set)
    refused = one_line_error(run_tool('train_seg.py', [detector, '--work-dir', work, '--resume', '--iters', '4']))
    assert 'holds a depth model (depth), and' in refused and 'is a detection config' in refused
    assert sorted(work.rglob('*')) == before


@pytest.mark.slow  # tools run end to end
def test_predict_seg_refuses_images_whose_outputs_would_be_one_file_and_no_others(trained_detector, trained_depth,
                                                                                  tmp_path):
    """b_color.png and b.png: the depth map of the first and the picture of the second are one file (it was
    overwritten, exit 0); two images of one name give a detector one file only with --overlay."""
    detector_config, detector = trained_detector
    depth_config, depth = trained_depth
    for folder, name in (('a', 'b_color.png'), ('b', 'b.png'), ('c', 'b.png')):
        (tmp_path / folder).mkdir()
        cv2.imwrite(str(tmp_path / folder / name), np.full((48, 64, 3), 90, np.uint8))
    refused = one_line_error(run_tool('predict_seg.py', [depth_config, depth, tmp_path / 'a', tmp_path / 'b',
                                                         '--out', tmp_path / 'out']))
    assert f'would both write {tmp_path / "out" / "b_color.png"}' in refused and not (tmp_path / 'out').exists()
    succeeded(run_tool('predict_seg.py', [detector_config, detector, tmp_path / 'b', tmp_path / 'c', '--out',
                                          tmp_path / 'found']))
    refused = one_line_error(run_tool('predict_seg.py', [detector_config, detector, tmp_path / 'b', tmp_path / 'c',
                                                         '--out', tmp_path / 'drawn', '--overlay']))
    assert f'would both write {tmp_path / "drawn" / "b_overlay.png"}' in refused
