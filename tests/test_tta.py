"""Test-time augmentation of depth models and detectors: each scale and mirror image brought back to the original
image and merged (depth averaged, detections kept by NMS per class), against the plain predictions it is made of:
a flip-equivariant model's flip-TTA is its plain prediction, one scale of ratio 1 without flip is the plain
prediction exactly, and the average is the mean of the plain predictions of each scale and of the mirror image."""
from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
import torch
from mmcv.transforms import Compose
from mmengine.config import Config
from mmengine.dataset import pseudo_collate
from mmengine.registry import init_default_scope
from mmengine.structures import InstanceData
from mmseg.registry import MODELS

import backbones.dense  # noqa: F401  (registration)
from backbones.dense.predict import without_annotations
from backbones.dense.tasks import task_of
from backbones.dense.tta import tta_flips, tta_scales
from helpers.dense_data import CATEGORIES, SIZE, write_tiny_coco, write_tiny_dense_config, write_tiny_nyu
from helpers.seg_data import CONFIGS


@pytest.fixture(scope='module')
def nyu_set(tmp_path_factory) -> Path:
    return write_tiny_nyu(tmp_path_factory.mktemp('nyu'), counts=(('train', 1), ('test', 1)))


@pytest.fixture(scope='module')
def coco_set(tmp_path_factory) -> Path:
    return write_tiny_coco(tmp_path_factory.mktemp('coco'), counts=(('train', 1), ('val', 1)))


def tiny_config(tmp_path: Path, config_name: str, data: Path, family: str = 'upernet_lvvit_s.py') -> Config:
    init_default_scope('mmseg')
    cfg = Config.fromfile(write_tiny_dense_config(tmp_path / 'tiny.py', config_name, data, family))
    if config_name.startswith('maskrcnn'):
        cfg.model.num_classes = len(CATEGORIES)
    return cfg


def tta_of(cfg: Config, model: torch.nn.Module, ratios: list[float], flip: bool) -> tuple[torch.nn.Module, Compose]:
    """The config's test-time model around `model`, and its pipeline at `ratios` of the tiny images' size."""
    pipeline = copy.deepcopy(without_annotations(cfg.tta_pipeline, task_of(cfg)))
    tta = next(step for step in pipeline if step['type'] == 'TestTimeAug')
    scale = tta_scales(pipeline)[0]
    tta['transforms'][0] = [dict(scale, scale=(round(SIZE[0] * r), round(SIZE[1] * r))) for r in ratios]
    return MODELS.build({**cfg.tta_model, 'flip': flip, 'module': model}).eval(), Compose(pipeline)


def plain_pipeline(cfg: Config, ratio: float = 1.0) -> Compose:
    """The config's single-scale test pipeline, resizing to `ratio` of the tiny images' size."""
    steps = copy.deepcopy(without_annotations(cfg.test_dataloader.dataset.pipeline, task_of(cfg)))
    for step in steps:
        if step['type'] == 'Resize':
            step['scale'] = (round(SIZE[0] * ratio), round(SIZE[1] * ratio))
    return Compose(steps)


def predicted(model: torch.nn.Module, pipeline: Compose, image: Path):
    with torch.no_grad():
        return model.test_step(pseudo_collate([pipeline({'img_path': str(image)})]))[0]


def depth(sample) -> torch.Tensor:
    return sample.pred_depth_map.data


def mirror_file(image: Path, folder: Path) -> Path:
    """The image's pixels as decoded, mirrored, in a lossless file."""
    path = folder / f'{image.stem}_mirrored.png'
    cv2.imwrite(str(path), cv2.imread(str(image))[:, ::-1])
    return path


def symmetric_file(image: Path, folder: Path) -> Path:
    """A mirror-symmetric image: the left half of `image` and its mirror image beside it."""
    pixels = cv2.imread(str(image))
    half = pixels[:, :pixels.shape[1] // 2]
    path = folder / f'{image.stem}_symmetric.png'
    cv2.imwrite(str(path), np.concatenate([half, half[:, ::-1]], axis=1))
    return path


def flip_equivariant(model: torch.nn.Module) -> torch.nn.Module:
    """A ViT depth model made mirror-equivariant: every convolution kernel and the position table made symmetric
    left to right (patch 16 on 64-px-wide images: the patches mirror onto patches; attention is equivariant to a
    permutation of the tokens that their positions follow)."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 4:
                parameter.copy_((parameter + parameter.flip(-1)) / 2)
        table = model.backbone.model.pos_embed
        side = round((table.shape[1] - 1) ** 0.5)
        grid = table[:, 1:].reshape(1, side, side, -1)
        table[:, 1:] = ((grid + grid.flip(2)) / 2).reshape(1, side * side, -1)
    return model


def test_flip_tta_of_a_flip_equivariant_depth_model_is_its_plain_prediction(nyu_set, tmp_path):
    """The image and its mirror image averaged: a model whose depth of a mirror image is the mirror image of its
    depth predicts the same with flip-TTA, for a mirror-symmetric image and any other (where a mirror image's depth
    not flipped back would differ: its plain depth is not symmetric)."""
    cfg = tiny_config(tmp_path, 'depth_lvvit_s.py', nyu_set, 'upernet_deit_s.py')
    torch.manual_seed(0)
    model = flip_equivariant(MODELS.build(cfg.model).eval())
    tta, tta_pipeline = tta_of(cfg, model, [1.0], flip=True)
    image = sorted((nyu_set / 'images' / 'test').glob('*.jpg'))[0]
    for path in (symmetric_file(image, tmp_path), image):
        plain = depth(predicted(model, plain_pipeline(cfg), path))
        assert torch.allclose(depth(predicted(tta, tta_pipeline, path)), plain, atol=1e-5), path
    assert (plain - plain.flip(-1)).abs().max() > 1e-2  # the second image's depth is no mirror image of itself


def test_depth_tta_is_the_mean_of_the_plain_depth_of_each_scale_and_mirror_image(nyu_set, tmp_path):
    """Two scales and their mirror images: the mean of the four plain predictions on the original image (the
    mirror image's predicted from a mirrored file and flipped back), each resampled to the image's size."""
    cfg = tiny_config(tmp_path, 'depth_lvvit_s.py', nyu_set)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).eval()
    image = sorted((nyu_set / 'images' / 'test').glob('*.jpg'))[0]
    mirror = mirror_file(image, tmp_path)
    ratios = [0.75, 1.0]
    expected = torch.stack([depth(predicted(model, plain_pipeline(cfg, r), image)) for r in ratios]
                           + [depth(predicted(model, plain_pipeline(cfg, r), mirror)).flip(-1) for r in ratios]).mean(0)
    tta, pipeline = tta_of(cfg, model, ratios, flip=True)
    merged = predicted(tta, pipeline, image)
    assert merged.pred_depth_map.shape == (SIZE[1], SIZE[0])
    assert torch.allclose(depth(merged), expected, atol=1e-5)
    assert (depth(merged) - depth(predicted(model, plain_pipeline(cfg), image))).abs().max() > 1e-4


@pytest.mark.parametrize('config_name', ['depth_lvvit_s.py', 'maskrcnn_lvvit_s.py'], ids=['depth', 'detector'])
def test_one_scale_of_ratio_1_without_flip_is_the_plain_prediction_exactly(config_name, nyu_set, coco_set, tmp_path):
    detector = config_name.startswith('maskrcnn')
    cfg = tiny_config(tmp_path, config_name, coco_set if detector else nyu_set)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).eval()
    image = sorted((coco_set / 'val').glob('*.jpg') if detector else (nyu_set / 'images' / 'test').glob('*.jpg'))[0]
    plain = predicted(model, plain_pipeline(cfg), image)
    merged = predicted(*tta_of(cfg, model, [1.0], flip=False), image)
    if detector:
        assert len(plain.pred_instances) > 0
        for key in ('bboxes', 'labels', 'scores', 'masks'):
            assert torch.equal(merged.pred_instances[key], plain.pred_instances[key]), key
    else:
        assert torch.equal(depth(merged), depth(plain))


class ChannelDetector(torch.nn.Module):
    """A mirror-equivariant detector with known answers: an instance of class c wherever channel c of the image
    (BGR as read) is above 128, its box around those pixels, its score 0.9 - c / 10; the images are not resized."""

    def __init__(self, nms_thresh: float = 0.5, detections_per_img: int = 100) -> None:
        super().__init__()
        self.roi_heads = SimpleNamespace(nms_thresh=nms_thresh, detections_per_img=detections_per_img)

    def test_step(self, data: dict) -> list:
        return [self.detected(image, sample) for image, sample in zip(data['inputs'], data['data_samples'])]

    @staticmethod
    def detected(image: torch.Tensor, sample):
        assert tuple(sample.metainfo['img_shape'][:2]) == tuple(sample.metainfo['ori_shape'][:2])
        masks = [image[c] > 128 for c in range(3) if (image[c] > 128).any()]
        labels = [c for c in range(3) if (image[c] > 128).any()]
        boxes = []
        for mask in masks:
            ys, xs = torch.nonzero(mask, as_tuple=True)
            boxes.append([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
        sample.pred_instances = InstanceData(
            bboxes=torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), labels=torch.tensor(labels),
            scores=torch.tensor([0.9 - c / 10 for c in labels]),
            masks=torch.stack(masks) if masks else torch.zeros(0, *image.shape[1:], dtype=torch.bool))
        return sample


def write_blobs(path: Path, symmetric: bool) -> Path:
    """Blobs of channels 0 and 1 overlapping (two classes at one place), channel 2 apart; all mirrored about the
    middle where `symmetric`."""
    width, height = SIZE
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[5:20, 3:20, 0] = 200
    pixels[8:24, 6:22, 1] = 200
    pixels[30:40, 22:30, 2] = 200
    if symmetric:
        pixels[:, width // 2:] = pixels[:, :width // 2][:, ::-1]
    cv2.imwrite(str(path), pixels)
    return path


def test_flip_tta_of_a_flip_equivariant_detector_keeps_its_plain_detections(coco_set, tmp_path):
    """Each detection found again in the mirror image, flipped back onto itself, is suppressed by NMS: the merged
    detections are the plain ones, for a mirror-symmetric image and any other (a mirror image's boxes and masks
    not flipped back would be found beside them); classes apart are not suppressed by one another, and at most
    `detections_per_img` are kept, the highest scores."""
    cfg = tiny_config(tmp_path, 'maskrcnn_lvvit_s.py', coco_set)
    plain = plain_pipeline(cfg)
    for symmetric in (True, False):
        image = write_blobs(tmp_path / f'blobs_{symmetric}.png', symmetric)
        detector = ChannelDetector()
        found = predicted(detector, plain, image).pred_instances
        assert found.labels.tolist() == [0, 1, 2]
        merged = predicted(*tta_of(cfg, detector, [1.0], flip=True), image).pred_instances
        for key in ('bboxes', 'labels', 'scores', 'masks'):
            assert torch.equal(merged[key], found[key]), (symmetric, key)
    capped = predicted(*tta_of(cfg, ChannelDetector(detections_per_img=2), [1.0], flip=True), image).pred_instances
    assert capped.labels.tolist() == [0, 1] and torch.equal(capped.bboxes, found.bboxes[:2])


@pytest.mark.parametrize('config_name', ['depth_lvvit_s.py', 'maskrcnn_lvvit_s.py'], ids=['depth', 'detector'])
def test_on_the_embedded_pages_tta_takes_their_ratios_without_mirror_images(config_name):
    """The pages are not mirrored (a mirrored digit is not one): their multi-scale test, for depth and detection as
    for segmentation, is TEST_RATIOS of the pages' single-scale size, without flips; the config keeps its own."""
    from classification.digits.seg_data import TEST_RATIOS, EmbeddedPages
    cfg = Config.fromfile(CONFIGS / config_name)
    assert tta_flips(cfg)
    task_of(cfg).use_small_data(cfg, EmbeddedPages().as_small_data())
    single = next(step['scale'] for step in cfg.test_dataloader.dataset.pipeline if step['type'] == 'Resize')
    assert not tta_flips(cfg)
    assert [tuple(step['scale']) for step in tta_scales(cfg.tta_pipeline)] == [
        (round(single[0] * r), round(single[1] * r)) for r in TEST_RATIOS]
