"""Token targets follow the image geometry: known answers, RoIAlign equivalence, and the real image pipeline."""
import random

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import auto_augment
from timm.data.auto_augment import RandAugment, rand_augment_ops
from torchvision.ops import roi_align

from classification.data.augment import (
    CropGeometry,
    LabelAwareRandAugment,
    TrainTransform,
    pil_affine_matrix,
    pixels_to_normalized,
)
from classification.data.batch_augment import BatchAugment, RegionTransform, collate_regions
from classification.objectives.token_targets import TokenTargetBuilder


def one_hot_map(index_map: torch.Tensor, num_classes: int):
    """Top-1 'store' entries for an (h, w) map of class indices: probability 1 on that class."""
    h, w = index_map.shape
    return torch.full((1, h, w, 1), 10.0), index_map.view(1, h, w, 1).long()


def column_map(h: int, w: int) -> torch.Tensor:
    return torch.arange(w).expand(h, w)


def row_map(h: int, w: int) -> torch.Tensor:
    return torch.arange(h)[:, None].expand(h, w)


def expected_index(target: torch.Tensor) -> torch.Tensor:
    """Mean class index under each token's target distribution."""
    return (target * torch.arange(target.shape[-1], dtype=torch.float32)).sum(-1)


def geometry(box, flip=False, warp=None) -> CropGeometry:
    warp = torch.eye(3)[:2] if warp is None else torch.as_tensor(warp, dtype=torch.float32)
    return CropGeometry(torch.tensor([box], dtype=torch.float32), torch.tensor([flip]), warp[None])


@pytest.mark.parametrize('flip', [False, True])
def test_column_and_row_maps_in_a_non_square_box(flip):
    h, w, S = 6, 10, 4
    box = (0.2, 0.1, 0.7, 0.9)  # x1, y1, x2, y2: wide in y, narrow in x
    builder = TokenTargetBuilder(max(h, w), smoothing=0.0, samples=2)
    centres = (torch.arange(S) + 0.5) / S
    u = 1 - centres if flip else centres  # where in the crop each output column came from
    x_index = (box[0] + u * (box[2] - box[0])) * w - 0.5
    y_index = (box[1] + centres * (box[3] - box[1])) * h - 0.5

    _, tokens = builder(*one_hot_map(column_map(h, w), w), geometry(box, flip), (S, S))
    torch.testing.assert_close(expected_index(tokens[0]), x_index.expand(S, S), atol=1e-5, rtol=0)
    _, tokens = builder(*one_hot_map(row_map(h, w), h), geometry(box, flip), (S, S))
    torch.testing.assert_close(expected_index(tokens[0]), y_index[:, None].expand(S, S), atol=1e-5, rtol=0)


def test_rotation_by_90_degrees_turns_columns_into_rows():
    h = w = 8
    S = 4
    builder = TokenTargetBuilder(w, smoothing=0.0, samples=2)
    # output (x, y) comes from crop (-y, x): the image turned 90 degrees clockwise
    warp = [[0.0, -1.0, 0.0], [1.0, 0.0, 0.0]]
    _, tokens = builder(*one_hot_map(column_map(h, w), w), geometry((0, 0, 1, 1), warp=warp), (S, S))
    centres = (torch.arange(S) + 0.5) / S
    x_index = (1 - centres) * w - 0.5  # source column of output row i
    torch.testing.assert_close(expected_index(tokens[0]), x_index[:, None].expand(S, S), atol=1e-5, rtol=0)


def test_class_token_target_is_the_crop_average_and_smoothing_applies():
    h, w = 6, 10
    builder = TokenTargetBuilder(w, smoothing=0.1)
    cls, tokens = builder(*one_hot_map(column_map(h, w), w), geometry((0.2, 0.1, 0.7, 0.9), True), (3, 5))
    torch.testing.assert_close(cls[0], tokens[0].mean(dim=(0, 1)))
    assert cls.sum().item() == pytest.approx(1.0, abs=1e-5)
    assert tokens.min().item() >= 0.1 / w - 1e-6  # every class keeps the smoothing mass


def test_equals_torchvision_roi_align_for_axis_aligned_crops():
    torch.manual_seed(0)
    B, h, w, C, k, r = 3, 5, 7, 11, 4, 2
    top = (torch.randn(B, h, w, C) * 3).topk(k, dim=-1)
    boxes = torch.tensor([[0.1, 0.2, 0.9, 0.6], [0.0, 0.0, 1.0, 1.0], [0.3, 0.05, 0.5, 0.95]])
    geo = CropGeometry(boxes, torch.zeros(B, dtype=torch.bool), torch.eye(3)[:2].expand(B, 2, 3))
    cls, tokens = TokenTargetBuilder(C, smoothing=0.0, samples=r)(top.values, top.indices, geo, (3, 4))

    dense = torch.zeros(B, h, w, C).scatter_(-1, top.indices, top.values.softmax(-1)).permute(0, 3, 1, 2)
    rois = torch.cat([torch.arange(B, dtype=torch.float32)[:, None], boxes * torch.tensor([w, h, w, h])], dim=1)
    expected = roi_align(dense, rois, (3, 4), spatial_scale=1.0, sampling_ratio=r, aligned=True)
    torch.testing.assert_close(tokens, expected.permute(0, 2, 3, 1), atol=1e-6, rtol=0)


def test_probabilities_renormalised_over_the_stored_top_k():
    scores = torch.tensor([[[[2.0, 1.0, 0.0]]]])
    classes = torch.tensor([[[[4, 0, 2]]]])
    cls, _ = TokenTargetBuilder(6, smoothing=0.0)(scores, classes, geometry((0, 0, 1, 1)), (1, 1))
    expected = torch.zeros(6)
    expected[[4, 0, 2]] = torch.tensor([2.0, 1.0, 0.0]).softmax(0)
    torch.testing.assert_close(cls[0], expected)


def coordinate_image(W: int, H: int) -> Image.Image:
    """R encodes x, G encodes y (pixel centres, as fractions of the size), B = 255 marks real pixels."""
    x = (np.arange(W) + 0.5) / W
    y = (np.arange(H) + 0.5) / H
    rgb = np.stack([np.broadcast_to(x, (H, W)), np.broadcast_to(y[:, None], (H, W)), np.ones((H, W))], axis=-1)
    return Image.fromarray(np.uint8(np.round(rgb * 255)))


@pytest.mark.parametrize('op, arg', [('Rotate', 23.0), ('Rotate', 90.0), ('ShearX', 0.2), ('ShearY', -0.25),
                                     ('TranslateXRel', 0.3), ('TranslateYRel', -0.2)])
def test_affine_matrix_matches_what_timm_does_to_the_image(op, arg):
    W, H = 90, 60
    img = coordinate_image(W, H)
    fn = auto_augment.NAME_TO_OP[op]
    out = np.asarray(fn(img, arg, fillcolor=(0, 0, 0), resample=Image.BILINEAR), dtype=np.float64) / 255
    m = pil_affine_matrix(op, (arg,), (W, H))
    ys, xs = np.mgrid[0:H, 0:W] + 0.5
    src = np.einsum('ij,jhw->ihw', m, np.stack([xs, ys, np.ones_like(xs)]))
    inner = (out[..., 2] > 0.999) & (src[0] > 1) & (src[0] < W - 1) & (src[1] > 1) & (src[1] < H - 1)
    assert inner.sum() > 0.3 * W * H
    np.testing.assert_allclose(out[..., 0][inner], src[0][inner] / W, atol=1.5 / 255 + 1e-9)
    np.testing.assert_allclose(out[..., 1][inner], src[1][inner] / H, atol=1.5 / 255 + 1e-9)


def test_normalized_matrix_maps_edges_to_edges():
    """PIL turns counter-clockwise: the middle of the right edge shows the middle of the bottom edge."""
    m = pil_affine_matrix('Rotate', (90.0,), (40, 30))
    n = pixels_to_normalized(m, (40, 30))
    np.testing.assert_allclose(n[:2] @ np.array([1.0, 0.0, 1.0]), [0.0, 1.0 * 20 / 15], atol=1e-12)


def decode_tokens(image: torch.Tensor, grid: int):
    """Per token of an augmented coordinate image: mean source x, y (fractions) and the share of real pixels."""
    _, H, W = image.shape
    real = (image[2] > 0.98).float()
    p = H // grid
    pool = lambda t: t.view(grid, p, grid, p).sum(dim=(1, 3))  # noqa: E731
    count = pool(real)
    return pool(image[0] * real) / count.clamp_min(1), pool(image[1] * real) / count.clamp_min(1), count / p ** 2


def augmented(transform: TrainTransform, img: Image.Image, path: str, file) -> tuple:
    """One augmentation of `img` (also saved losslessly at `file`) by the PIL path or by the batched path's two
    halves (worker, then the device on a batch of one)."""
    if path == 'pil':
        return transform(img)
    region, geo, plan = RegionTransform(transform)(file)
    device = BatchAugment(transform.img_size, transform.mean, transform.std)
    return device(collate_regions([region], [plan]))[0], geo


@pytest.mark.parametrize('path', ['pil', 'batched'])
def test_targets_follow_the_real_augmentation_pipeline(path, tmp_path):
    """Crops of a non-square image, flips, and RandAugment's rotate/shear/translate applied by timm to the image
    (or by the batched path): each token's target must point at the place its pixels came from, read back from
    the image itself."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    W0, H0, h, w, size, grid = 200, 120, 6, 10, 64, 4
    transform = TrainTransform(size, scale=(0.15, 1.0), auto_augment=None, reprob=0.0, interpolation='bilinear',
                               mean=(0, 0, 0), std=(1, 1, 1))
    ops = rand_augment_ops(9, prob=1.0, hparams={'img_mean': (0, 0, 0), 'magnitude_std': 0.5},
                           transforms=['Rotate', 'ShearX', 'ShearY', 'TranslateXRel', 'TranslateYRel'])
    transform.rand_augment = LabelAwareRandAugment(RandAugment(ops, num_layers=2))
    builder = TokenTargetBuilder(w, smoothing=0.0, samples=4)
    img = coordinate_image(W0, H0)
    img.save(tmp_path / 'coordinates.png')
    col_errors, row_errors = [], []
    for _ in range(40):
        x, geo = augmented(transform, img, path, tmp_path / 'coordinates.png')
        batch_geo = CropGeometry(geo.box[None], geo.flip[None], geo.warp[None])
        _, col_tokens = builder(*one_hot_map(column_map(h, w), w), batch_geo, (grid, grid))
        _, row_tokens = builder(*one_hot_map(row_map(h, w), h), batch_geo, (grid, grid))
        src_x, src_y, real = decode_tokens(x, grid)
        ok = real > 0.95
        # the map's class index at a point is linear in its position (clamped at the outer half cells)
        want_col = (src_x * w - 0.5).clamp(0, w - 1)
        want_row = (src_y * h - 0.5).clamp(0, h - 1)
        col_errors.append((expected_index(col_tokens[0]) - want_col)[ok].abs())
        row_errors.append((expected_index(row_tokens[0]) - want_row)[ok].abs())
    col_errors, row_errors = torch.cat(col_errors), torch.cat(row_errors)
    assert col_errors.numel() > 200
    assert col_errors.max() < 0.3 and row_errors.max() < 0.3
