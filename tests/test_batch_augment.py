"""The batched label-aware augmentation against the PIL path: the same draws, Pillow's colour ops, the same images."""
import random

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import auto_augment
from timm.data.random_erasing import RandomErasing
from torch.utils.data import DataLoader
from torchvision.io import decode_jpeg

from backbones.common.images import ImageReadError
from classification.data.augment import CropGeometry, TrainTransform
from classification.data.batch_augment import (
    COLOUR_FUNCTIONS,
    BatchAugment,
    EncodedImages,
    EncodedJpeg,
    PendingImages,
    RegionTransform,
    collate_regions,
    cut_decoded,
    cut_region,
    jpeg_draft_size,
    region_bounds,
)
from classification.data.folders import ImageFolderDataset, collate_skipping
from helpers.cls_data import textured_jpegs

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def smooth_image(W: int, H: int) -> Image.Image:
    """Gradients and slow waves: every value of every channel occurs, no edges for resampling to disagree on."""
    y, x = np.mgrid[0:H, 0:W] + 0.5
    rgb = np.stack([255 * x / W, 255 * y / H, 128 + 110 * np.sin(x / 9.0) * np.cos(y / 13.0)], axis=-1)
    return Image.fromarray(np.uint8(np.clip(np.round(rgb), 0, 255)))


def seed(value: int) -> None:
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)


def draws() -> tuple:
    """Where Python's and NumPy's random streams are."""
    return random.getstate(), np.random.get_state()[1].tolist(), np.random.get_state()[2]


@pytest.mark.parametrize('suffix, size', [('.jpg', (480, 360)), ('.png', (150, 200))])
def test_same_seed_same_draws_and_geometry_on_both_paths(tmp_path, suffix, size):
    """Crop, interpolation, flip, every RandAugment op and magnitude, and erasing: the worker half draws exactly
    what the PIL path draws (the streams end in the same state) and records the same geometry."""
    file = tmp_path / f'image{suffix}'
    smooth_image(*size).save(file, quality=95) if suffix == '.jpg' else smooth_image(*size).save(file)
    transform = TrainTransform(64, reprob=0.5)
    worker = RegionTransform(transform)
    warped = erased = 0
    for s in range(40):
        seed(s)
        _, geo = transform(Image.open(file).convert('RGB'))
        after_pil = draws()
        seed(s)
        _, worker_geo, plan = worker(file)
        assert draws() == after_pil, s
        for a, b in zip(geo, worker_geo):
            assert torch.equal(a, b), s
        warped += not torch.equal(geo.warp, torch.eye(3)[:2])
        erased += any(height > 0 for _, _, height, _ in plan['erase'])
    assert warped > 5 and erased > 5  # both kinds of draw were exercised


@pytest.mark.parametrize('suffix', ['.png', '.jpg'])
def test_a_one_pixel_image_is_cropped_to_its_pixel_on_both_paths(tmp_path, suffix):
    """timm's crop draw rounds to a crop of no pixel on a 1x1 image about one time in five; both paths crop the pixel:
    a uniform image of its colour, its geometry the whole image."""
    file = tmp_path / f'dot{suffix}'
    Image.new('RGB', (1, 1), (200, 40, 90)).save(file)
    transform = TrainTransform(8, auto_augment=None, reprob=0.0)
    worker, batched = RegionTransform(transform), BatchAugment(8, MEAN, STD)
    expected = (torch.tensor(np.asarray(Image.open(file).convert('RGB')), dtype=torch.float32).view(3, 1, 1) / 255
                - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
    for s in range(30):
        seed(s)
        image, geometry = transform(Image.open(file).convert('RGB'))
        torch.testing.assert_close(image, expected.expand(3, 8, 8), atol=1e-5, rtol=0)
        assert geometry.box.tolist() == [0.0, 0.0, 1.0, 1.0]
        seed(s)
        region, _, plan = worker(file)
        torch.testing.assert_close(batched(collate_regions([region], [plan]))[0], expected.expand(3, 8, 8),
                                   atol=1e-5, rtol=0)


def test_erasing_boxes_are_timms():
    transform = TrainTransform(48, auto_augment=None, reprob=1.0)
    for s in range(10):
        seed(s)
        image = torch.zeros(3, 48, 48)
        RandomErasing(1.0, mode='pixel', device='cpu')(image)
        rows, cols = image.abs().sum(0).nonzero().unbind(1)
        seed(s)
        (top, left, h, w), = transform.sample_erasing()
        assert (top, left, top + h - 1, left + w - 1) == (rows.min(), cols.min(), rows.max(), cols.max())


def test_large_jpeg_decodes_reduced_and_cuts_the_crop(tmp_path):
    """A crop four times the output size decodes at 1/2 (JPEG draft) or smaller, then reduces to between one and
    two output sizes; the box still frames the same part of the picture."""
    img = smooth_image(800, 600)
    crop = (100, 200, 400, 480)  # top, left, height, width
    img.save(tmp_path / 'big.jpg', quality=95)
    with Image.open(tmp_path / 'big.jpg') as lazy:
        lazy.draft('RGB', jpeg_draft_size(lazy.size, crop, 100))
        assert lazy.size[0] <= 400  # decoded at 1/2 or less
        region = cut_region(np.asarray(lazy.convert('RGB')), (800, 600), crop, 100)
    x1, y1, x2, y2 = region.box
    assert 100 <= x2 - x1 < 200 and 100 <= y2 - y1 < 200
    # the region's pixel at the box centre shows the full image's pixel at the crop centre (read on the linear
    # gradients of red and green, which encode x and y)
    centre = region.pixels[int((y1 + y2) / 2), int((x1 + x2) / 2), :2].astype(float)
    np.testing.assert_allclose(centre, np.asarray(img)[300, 440, :2].astype(float), atol=3)


OP_ARGS = {
    'AutoContrast': [()], 'Equalize': [()], 'Invert': [()], 'Posterize': [(0,), (2,), (4,), (7,)],
    'Solarize': [(0,), (100,), (200,), (256,)], 'SolarizeAdd': [(0,), (40,), (110,)],
    'Color': [(0.1,), (0.6,), (1.9,)], 'Contrast': [(0.1,), (0.5,), (1.9,)],
    'Brightness': [(0.1,), (0.7,), (1.9,)], 'Sharpness': [(0.1,), (0.5,), (1.9,)],
}
EXACT = ('AutoContrast', 'Equalize', 'Invert', 'Posterize', 'Solarize', 'SolarizeAdd')


def low_contrast_image() -> Image.Image:
    """The smooth image squeezed into 60..180 (so AutoContrast has something to stretch), with some grain."""
    values = np.asarray(smooth_image(70, 50), dtype=np.float64) * (120 / 255) + 60
    grain = np.random.default_rng(0).integers(-6, 7, values.shape)
    return Image.fromarray(np.uint8(np.clip(values + grain, 0, 255)))


@pytest.mark.parametrize('name', list(OP_ARGS))
def test_colour_ops_are_pillows(name):
    """Each colour op against timm's own (Pillow) op: look-up-table ops exactly, blends within one grey level."""
    img = low_contrast_image()
    x = torch.from_numpy(np.asarray(img, dtype=np.float32)).permute(2, 0, 1)[None]
    everywhere = torch.ones(1, 1, *x.shape[2:])
    for args in OP_ARGS[name]:
        pil_name = 'PosterizeIncreasing' if name == 'Posterize' else name  # bits=0 is 'inc' posterize's black image
        want = np.asarray(auto_augment.NAME_TO_OP[pil_name](img, *args) if args != (0,) or name != 'Posterize'
                          else Image.new('RGB', img.size), dtype=np.float32)
        got = COLOUR_FUNCTIONS[name](x, torch.tensor([float(a) for a in args] or [0.0]), everywhere)
        diff = np.abs(got[0].permute(1, 2, 0).numpy() - want)
        if name in EXACT:
            assert diff.max() == 0, (name, args)
        else:
            assert diff.max() <= 1 and diff.mean() < 0.1, (name, args, diff.max(), diff.mean())


def one_sample_batch(img: Image.Image, warp: torch.Tensor, ops: list, warped: list,
                     fill=(10.0, 20.0, 30.0)) -> PendingImages:
    """A hand-made plan: the whole image as the crop, `warp`, colour ops by index, no erasing."""
    pixels = torch.from_numpy(np.array(img))
    plan = {'box': (0.0, 0.0, img.size[0], img.size[1]), 'bicubic': False, 'flip': False, 'warp': warp, 'ops': ops,
            'args': [0.0] * len(ops), 'warped': warped, 'fill': list(fill), 'erase': [[0, 0, 0, 0]]}
    return collate_regions([pixels], [plan])


def test_a_colour_op_before_the_geometry_leaves_the_fill_alone():
    """timm: Invert then Rotate gives fill-coloured corners; Rotate then Invert inverts the fill too. The inside is
    inverted either way."""
    S = 32
    img = Image.new('RGB', (S, S), (200, 100, 50))
    angle = np.radians(45)
    warp = torch.tensor([[np.cos(angle), -np.sin(angle), 0.0], [np.sin(angle), np.cos(angle), 0.0]],
                        dtype=torch.float32)
    device = BatchAugment(S, (0, 0, 0), (1, 1, 1))
    invert = list(COLOUR_FUNCTIONS).index('Invert')
    for warped, corner in ((True, (10, 20, 30)), (False, (245, 235, 225))):
        x = device(one_sample_batch(img, warp, [invert], [warped]))[0] * 255
        torch.testing.assert_close(x[:, 0, 0], torch.tensor(corner, dtype=torch.float32))
        torch.testing.assert_close(x[:, S // 2, S // 2], torch.tensor([55.0, 155.0, 205.0]))


def test_batched_images_match_the_pil_path(tmp_path):
    """Same seeds, full recipe without erasing (its noise is drawn elsewhere): the two paths' images agree to about
    a grey level on average, and their colour statistics to half of one."""
    file = tmp_path / 'image.png'
    smooth_image(300, 220).save(file)
    transform = TrainTransform(64, reprob=0.0, mean=MEAN, std=STD)
    worker, device = RegionTransform(transform), BatchAugment(64, MEAN, STD)
    std = torch.tensor(STD).view(3, 1, 1) * 255
    errors, pil_means, batched_means = [], [], []
    for s in range(30):
        seed(s)
        pil, _ = transform(Image.open(file).convert('RGB'))
        seed(s)
        region, _, plan = worker(file)
        batched = device(collate_regions([region], [plan]))[0]
        errors.append(((pil - batched) * std).abs().mean())
        pil_means.append((pil * std).mean((1, 2)))
        batched_means.append((batched * std).mean((1, 2)))
    errors = torch.stack(errors)
    assert errors.median() < 1.0 and errors.max() < 3.0
    torch.testing.assert_close(torch.stack(batched_means).mean(0), torch.stack(pil_means).mean(0), atol=0.5, rtol=0)


def test_loader_batches_of_the_batched_path(labeled_images):
    """ImageFolderDataset + collate_skipping hand over one PendingImages per batch (regions of different sizes on
    one canvas) and the geometry; the device half makes the model input."""
    data, _ = labeled_images
    transform = TrainTransform(32, mean=MEAN, std=STD)
    dataset = ImageFolderDataset(data, 'train', RegionTransform(transform))
    batch = next(iter(DataLoader(dataset, batch_size=6, collate_fn=collate_skipping, num_workers=2)))
    assert len(batch['image']) == 6 and batch['label'].tolist() == [dataset.sample(i)[1] for i in range(6)]
    box = CropGeometry(*batch['geometry']).box  # each crop a box of its own image, RandomResizedCrop's area and shape
    width, height = box[:, 2] - box[:, 0], box[:, 3] - box[:, 1]
    assert box.shape == (6, 4) and (box >= 0).all() and (box <= 1).all() and (width > 0).all() and (height > 0).all()
    sizes = torch.tensor([Image.open(data / dataset.sample(i)[0]).size for i in range(6)], dtype=torch.float32)
    area = width * height
    aspect = width * sizes[:, 0] / (height * sizes[:, 1])
    assert (area >= 0.05).all() and (aspect > 3 / 4 - 0.2).all() and (aspect < 4 / 3 + 0.2).all()  # whole pixels
    x = BatchAugment(32, MEAN, STD)(batch['image'].to(torch.device('cpu')))
    assert x.shape == (6, 3, 32, 32) and x.dtype == torch.float32 and x.isfinite().all()
    assert (x.std((1, 2, 3)) > 0.05).all()  # images, not fill


def test_device_decoding_cuts_pillows_regions_from_the_decoded_file(tmp_path):
    """--decode gpu: the worker sends the file and the region's bounds on the full-size image; the device half
    decodes (here torchvision's CPU decoder, libjpeg-turbo as Pillow's) and cuts the region, its whole-factor box
    averages Pillow's `reduce` to the rounding (one grey level)."""
    (file,) = textured_jpegs(tmp_path, [(500, 375)])
    img = Image.open(file).convert('RGB')
    decoded = decode_jpeg(torch.frombuffer(bytearray(file.read_bytes()), dtype=torch.uint8))
    assert torch.equal(decoded.permute(1, 2, 0), torch.from_numpy(np.asarray(img).copy()))
    for crop in [(10, 20, 300, 400), (0, 0, 375, 500), (50, 60, 100, 120), (200, 301, 175, 199)]:
        region, bounds = cut_region(np.asarray(img), img.size, crop, 64), region_bounds(img.size, img.size, crop, 64)
        cut = cut_decoded(decoded, bounds).numpy().astype(int)
        assert bounds.box == region.box and cut.shape == region.pixels.shape
        assert np.abs(cut - region.pixels).max() <= 1, crop
    assert region_bounds(img.size, img.size, (10, 20, 300, 400), 64).factors == (6, 4)


def test_device_decoding_draws_the_same_and_makes_the_same_images(tmp_path):
    """The same seeds give the same geometry and plans with the JPEGs decoded in the workers (reduced, by
    Pillow) or on the device (whole, then reduced by box averages); the images agree to under a grey level on average.
    Grey and PNG files in the same batch are decoded by the workers: their images are the worker path's exactly."""
    files = textured_jpegs(tmp_path, [(500, 375), (375, 500), (640, 480), (300, 300)])
    Image.open(files[0]).convert('L').save(tmp_path / 'grey.JPEG', quality=90)
    smooth_image(150, 200).save(tmp_path / 'plain.png')
    files += [tmp_path / 'grey.JPEG', tmp_path / 'plain.png']
    transform = TrainTransform(64, reprob=0.25, mean=MEAN, std=STD)
    made = {}
    for decode in ('worker', 'device'):
        items = []
        for s, file in enumerate(files):
            seed(s)
            items.append(RegionTransform(transform, decode)(file))
        batch = collate_regions([item[0] for item in items], [item[2] for item in items])
        seed(99)
        made[decode] = items, BatchAugment(64, MEAN, STD)(batch)
    (worker_items, worker), (device_items, device) = made['worker'], made['device']
    assert [type(item[0]).__name__ for item in device_items] == ['EncodedJpeg'] * 4 + ['Tensor'] * 2
    for a, b in zip(worker_items, device_items):
        assert all(torch.equal(x, y) for x, y in zip(a[1], b[1])) and a[2].keys() == b[2].keys()
        # the crop's box in the region differs where the worker decoded a reduced JPEG: the rest is the same plan
        assert torch.equal(a[2]['warp'], b[2]['warp']) and all(a[2][key] == b[2][key] for key in a[2]
                                                               if key not in ('box', 'warp'))
    grey = ((worker - device) * torch.tensor(STD).view(1, 3, 1, 1) * 255).abs()
    assert grey[:4].mean() < 1.5 and grey[:4].mean((1, 2, 3)).max() < 3
    assert torch.equal(worker[4:], device[4:])


def test_a_truncated_jpeg_is_decoded_and_refused_by_the_worker(tmp_path):
    """A file without its end-of-image marker never reaches the device's decoder: the worker's decode names it."""
    (file,) = textured_jpegs(tmp_path, [(120, 90)])
    file.write_bytes(file.read_bytes()[:-200])
    with pytest.raises(ImageReadError, match=f'cannot read image {file}'):
        RegionTransform(TrainTransform(32), 'device')(file)


def test_loader_batches_with_device_decoding(labeled_images):
    """Through two loader workers and pinned memory: one EncodedImages per batch, the model input made by the device
    half; the same geometry as with the workers decoding."""
    data, _ = labeled_images
    transform = TrainTransform(32, mean=MEAN, std=STD)
    batches = {}
    for decode in ('worker', 'device'):
        dataset = ImageFolderDataset(data, 'train', RegionTransform(transform, decode))
        dataset.set_epoch(0, 1)  # the workers seed each image's draws
        loader = DataLoader(dataset, batch_size=6, collate_fn=collate_skipping, num_workers=2, pin_memory=True)
        batches[decode] = next(iter(loader))
    encoded = batches['device']['image']
    assert isinstance(encoded, EncodedImages) and len(encoded) == 6
    assert sum(isinstance(r, EncodedJpeg) for r in encoded.regions) == 4  # the folder's JPEGs; PNGs come decoded
    for a, b in zip(batches['worker']['geometry'], batches['device']['geometry']):
        assert torch.equal(a, b)
    x = BatchAugment(32, MEAN, STD)(encoded.to(torch.device('cpu')))
    assert x.shape == (6, 3, 32, 32) and x.isfinite().all() and (x.std((1, 2, 3)) > 0.05).all()


def test_the_groups_decided_on_the_host_are_the_partition_the_plans_and_the_drawn_boxes_give(tmp_path):
    """The device half reads nothing back from the device: which images each interpolation, each layer's colour op
    and the erasing take is decided when the plans are collated. On 48 drawn plans those groups are exactly the
    images whose plan says so, in index order, and the erased images are those whose drawn boxes cover a pixel."""
    file = tmp_path / 'image.jpg'
    smooth_image(480, 360).save(file, quality=95)
    transform = TrainTransform(64, reprob=0.6, mean=MEAN, std=STD)
    worker, plans = RegionTransform(transform), []
    for s in range(48):
        seed(s)
        plans.append(worker(file)[2])
    batch = collate_regions([torch.zeros(64, 64, 3, dtype=torch.uint8)] * 48, plans)
    plan, groups = batch.plan, batch.groups
    ops, index = plan['ops'], lambda key, start, stop: plan[key][start:stop].tolist()
    expected_resample = [(mode, pick.nonzero().squeeze(1).tolist()) for mode, pick in
                         (('bilinear', ~plan['bicubic']), ('bicubic', plan['bicubic'])) if pick.any()]
    assert [(mode, index('resample_index', a, b)) for mode, a, b in groups.resample] == expected_resample
    expected_colour = [(layer, code, (ops[:, layer] == code).nonzero().squeeze(1).tolist())
                       for layer in range(ops.shape[1]) for code in sorted(set(ops[:, layer].tolist())) if code >= 0]
    assert [(layer, code, index('colour_index', a, b)) for layer, code, a, b in groups.colour] == expected_colour
    assert len({code for _, code, _ in expected_colour}) > 3  # several ops drawn
    covered = torch.zeros(48, dtype=torch.bool)
    for b, boxes in enumerate(plan['erase'].tolist()):
        canvas = torch.zeros(64, 64, dtype=torch.bool)
        for top, left, h, w in boxes:
            canvas[top:top + h, left:left + w] = True
        covered[b] = canvas.any()
    assert plan['erase_index'].tolist() == covered.nonzero().squeeze(1).tolist() and 5 < groups.erased < 48
    assert batch.to(torch.device('cpu')).groups == groups  # they stay on the host


def test_regions_travel_packed_and_are_laid_out_on_the_canvas_with_their_edges_repeated(tmp_path):
    """A batch of regions of different sizes crosses to the device as their own bytes, with the plans under 1.2x
    them in all (a canvas padded to the largest would carry 1.9x here); laid out, each region sits at the top left of
    the canvas with its last row and column repeated to its edges, as a loop writing them one by one places them."""
    rng = np.random.default_rng(0)
    sizes = [(75, 90), (64, 64), (120, 66), (64, 100), (80, 71)]
    regions = [torch.from_numpy(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
    transform = TrainTransform(64, reprob=0.25, mean=MEAN, std=STD)
    file = tmp_path / 'image.jpg'
    smooth_image(480, 360).save(file, quality=95)
    plans = [RegionTransform(transform)(file)[2] for _ in sizes]
    batch = collate_regions(regions, plans)
    region_bytes = sum(r.numel() for r in regions)
    sent = batch.pixels.numel() + sum(t.numel() * t.element_size() for t in batch.plan.values())
    assert batch.pixels.numel() == region_bytes and sent <= 1.2 * region_bytes
    assert 120 * 100 * 3 * len(sizes) > 1.9 * region_bytes  # what the padded canvas carried
    expected = torch.empty(len(sizes), 120, 100, 3, dtype=torch.uint8)
    for b, r in enumerate(regions):
        h, w = r.shape[:2]
        for y in range(120):
            for x in range(100):
                expected[b, y, x] = r[min(y, h - 1), min(x, w - 1)]
    assert torch.equal(batch.canvas(), expected)
    assert torch.equal(batch.to(torch.device('cpu')).canvas(), expected) and len(batch) == len(sizes)
