"""Colour JPEGs decoded by simplejpeg: the scale Pillow's draft picks, Pillow's pixels, Pillow's `reduce` value for
value, both augmentation paths' outputs bit-identical to a Pillow-only decode; every other file read by Pillow as
before."""
from __future__ import annotations

import io
import random
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image

from backbones.common.images import ImageReadError, read_image, read_rgb
from backbones.common.jpeg import colour_jpeg_size, decode_colour_jpeg, draft_scale, pillow_only
from classification.data.augment import TrainTransform
from classification.data.batch_augment import RegionTransform, box_reduce, jpeg_draft_size

SUBSAMPLINGS = {'4:4:4': 0, '4:2:2': 1, '4:2:0': 2}  # Pillow's `subsampling` codes


def textured(W: int, H: int, seed: int = 0) -> np.ndarray:
    """Gradients, waves and noise: texture for IDCT scales, upsampling and box sums to differ on."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:H, 0:W] + 0.5
    rgb = np.stack([255 * x / W, 255 * y / H, 128 + 110 * np.sin(x / 7.0) * np.cos(y / 11.0)], axis=-1)
    return np.uint8(np.clip(rgb + rng.normal(0, 14, (H, W, 3)), 0, 255))


def jpeg_bytes(pixels: np.ndarray | Image.Image, **save) -> bytes:
    buffer = io.BytesIO()
    (pixels if isinstance(pixels, Image.Image) else Image.fromarray(pixels)).save(buffer, 'JPEG', **save)
    return buffer.getvalue()


def pillow_draft(data: bytes, requested: tuple[int, int] | None) -> np.ndarray:
    """Pillow's own reduced decode, as the workers read files before simplejpeg."""
    with Image.open(io.BytesIO(data)) as img:
        if requested is not None:
            img.draft('RGB', requested)
        return np.asarray(img.convert('RGB'))


SIZES = [(500, 375), (375, 500), (333, 257), (640, 480), (97, 131), (1024, 77), (16, 16), (9, 40), (8, 8),
         (5, 5), (7, 3), (6, 12)]
SAVES = [dict(quality=90, subsampling=2), dict(quality=75, subsampling=0), dict(quality=95, subsampling=1),
         dict(quality=85, subsampling=2, progressive=True), dict(quality=60, subsampling=0, progressive=True)]


@pytest.mark.parametrize('save', SAVES, ids=lambda s: '-'.join(f'{k}{v}' for k, v in s.items()))
def test_simplejpeg_decodes_pillows_pixels_at_pillows_draft_scale(save):
    """Over many sizes and requested sizes (every crop size's request a draft may get), where the decoder takes the
    file its pixels are Pillow's draft decode exactly; it declines only tiny images, whose eighths round alike."""
    declined = []
    for i, (W, H) in enumerate(SIZES):
        data = jpeg_bytes(textured(W, H, i), **save)
        assert colour_jpeg_size(data) == (W, H)
        requests = {None, (2 * W, H + 1)} | {(max(1, W // d), max(1, H // e)) for d in (1, 2, 3, 4, 5, 7, 8, 9, 16)
                                             for e in (1, 2, 3, 5, 8, 12)}
        for requested in sorted(requests, key=str):
            ours, theirs = decode_colour_jpeg(data, (W, H), requested), pillow_draft(data, requested)
            if ours is None:
                declined.append((W, H, requested))
                continue
            assert ours.shape == theirs.shape and np.array_equal(ours, theirs), (W, H, requested)
    assert declined and all(min(W, H) < 8 for W, H, _ in declined)  # only where eighths round alike


def test_images_narrower_than_a_block_are_left_to_pillow():
    """A 5x5 image asked for Pillow's 1/4 draft (2x2 pixels): simplejpeg decodes other pixels than Pillow there, so
    images narrower than a block are declined, and read_rgb gives Pillow's pixels."""
    data = jpeg_bytes(textured(5, 5))
    theirs = simplejpeg.decode_jpeg(data, 'RGB', min_width=2, min_height=2)
    assert theirs.shape == (2, 2, 3) and not np.array_equal(theirs, pillow_draft(data, (1, 1)))
    assert decode_colour_jpeg(data, (5, 5), (1, 1)) is None and decode_colour_jpeg(data, (5, 5)) is None
    assert np.array_equal(read_rgb(io.BytesIO(data), lambda _: (1, 1)).pixels, pillow_draft(data, (1, 1)))


def test_draft_scale_is_pillows():
    """The scale `draft_scale` names is the one Pillow's draft decodes at (its size), for many requests."""
    data = jpeg_bytes(textured(640, 480))
    for requested in [(640, 480), (320, 240), (319, 241), (160, 100), (81, 59), (80, 60), (79, 10), (1, 1)]:
        with Image.open(io.BytesIO(data)) as img:
            img.draft('RGB', requested)
            scale = draft_scale((640, 480), requested)
            assert img.size == (-(-640 // scale), -(-480 // scale)), requested


def test_box_reduce_is_pillows_reduce():
    """Every factor pair up to 7 (Pillow's special cases 2x2 to 5x5 and its general one), on sizes with and without
    partial last blocks: value for value."""
    pixels = textured(61, 47)
    image = Image.fromarray(pixels)
    for fx in range(1, 8):
        for fy in range(1, 8):
            ours = box_reduce(pixels, (fx, fy))
            assert np.array_equal(ours, np.asarray(image.reduce((fx, fy)))), (fx, fy)
    assert np.array_equal(box_reduce(pixels[3:40, 5:59], (3, 2)), np.asarray(image.reduce((3, 2), box=(5, 3, 59, 40))))


def pillow_files(folder: Path) -> dict[str, Path]:
    """One file of each kind the decoder leaves to Pillow."""
    rgb = textured(120, 90)
    files = {'grey JPEG': Image.fromarray(rgb).convert('L'), 'CMYK JPEG': Image.fromarray(rgb).convert('CMYK'),
             'PNG': Image.fromarray(rgb), 'WebP': Image.fromarray(rgb)}
    paths = {}
    for kind, image in files.items():
        suffix = {'PNG': 'png', 'WebP': 'webp'}.get(kind, 'jpg')
        paths[kind] = folder / f"{kind.replace(' ', '_')}.{suffix}"
        image.save(paths[kind], **({'quality': 90} if kind != 'PNG' else {}))
    return paths


def test_files_only_pillow_reads_go_through_pillow_as_before(tmp_path):
    """Grey and CMYK JPEGs, PNG, WebP: not taken by the decoder, read by Pillow with the same pixels as with it
    turned off; a truncated JPEG and a file of garbage named as before; a JPEG simplejpeg refuses in strict mode
    (cut short) is not decoded to grey by it."""
    for kind, path in pillow_files(tmp_path).items():
        assert colour_jpeg_size(path.read_bytes()) is None, kind
        with pillow_only():
            before = read_rgb(path, lambda size: (size[0] // 2, size[1] // 2))
        after = read_rgb(path, lambda size: (size[0] // 2, size[1] // 2))
        assert np.array_equal(before.pixels, after.pixels) and before.full_size == after.full_size, kind
        with pillow_only():
            whole = np.asarray(read_image(path))
        assert np.array_equal(np.asarray(read_image(path)), whole), kind
    data = jpeg_bytes(textured(200, 150))
    (tmp_path / 'cut.jpg').write_bytes(data[:len(data) // 2])
    (tmp_path / 'garbage.jpg').write_bytes(b'\xff\xd8' + bytes(range(256)) * 4)
    assert colour_jpeg_size((tmp_path / 'cut.jpg').read_bytes()) == (200, 150)
    assert decode_colour_jpeg((tmp_path / 'cut.jpg').read_bytes(), (200, 150)) is None
    for name in ('cut.jpg', 'garbage.jpg'):
        for read in (read_image, read_rgb):
            with pytest.raises(ImageReadError, match=f'cannot read image .*{name}'):
                read(tmp_path / name)


def generated_jpegs(folder: Path) -> list[Path]:
    """Various sizes, subsamplings, qualities, baseline and progressive."""
    files = []
    for i, ((W, H), subsampling, quality, progressive) in enumerate([
            ((500, 375), '4:2:0', 90, False), ((375, 500), '4:4:4', 75, False), ((640, 427), '4:2:2', 95, False),
            ((333, 500), '4:2:0', 85, True), ((1000, 750), '4:4:4', 80, True), ((160, 120), '4:2:2', 70, True),
            ((250, 1000), '4:2:0', 92, False)]):
        files.append(folder / f'{i}.JPEG')
        files[-1].write_bytes(jpeg_bytes(textured(W, H, i), quality=quality, subsampling=SUBSAMPLINGS[subsampling],
                                         progressive=progressive))
    return files


def outputs(transform, files: list[Path], seed: int = 3) -> list:
    """The transform's output for each file, each draw seeded."""
    results = []
    for i, file in enumerate(files * 4):
        random.seed(seed + i)
        np.random.seed(seed + i)
        torch.manual_seed(seed + i)
        results.append(transform(file))
    return results


def assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b) and all(assert_same(x, y) is None for x, y in zip(a, b))
    elif isinstance(a, dict):
        assert a.keys() == b.keys() and all(assert_same(a[k], b[k]) is None for k in a)
    else:
        assert a == b


@pytest.mark.parametrize('path', ['pil', 'batched'])
def test_both_paths_are_bit_identical_to_the_pillow_only_decode(tmp_path, path):
    """The PIL path (TrainTransform reading the file) and the batched workers' half (regions, reduced decodes and
    box averages included) give the same tensors, geometry and plans with simplejpeg as with Pillow alone."""
    files = generated_jpegs(tmp_path)
    reference = TrainTransform(64, reprob=0.5)
    transform = reference if path == 'pil' else RegionTransform(reference)
    with pillow_only():
        before = outputs(transform, files)
    after = outputs(transform, files)
    assert_same(before, after)
    if path == 'batched':  # the regions were reduced (draft scales above 1, whole-factor averages) somewhere
        sizes = [Image.open(f).size for f in files * 4]
        assert any(region.shape[1] < 0.45 * W for (region, _, _), (W, _) in zip(after, sizes))


def test_fast_decode_is_close_to_pillow_but_not_the_same(tmp_path):
    """The opt-in fast IDCT and upsampling: a few grey levels from Pillow's pixels on average, never the same file."""
    data = (generated_jpegs(tmp_path)[0]).read_bytes()
    exact, fast = decode_colour_jpeg(data, (500, 375)), decode_colour_jpeg(data, (500, 375), fast=True)
    difference = np.abs(exact.astype(int) - fast.astype(int))
    assert 0 < difference.mean() < 4


def test_draft_request_is_the_workers():
    """The workers ask for the size at which the crop still covers the output (jpeg_draft_size), and simplejpeg then
    decodes at Pillow's scale for it (the whole of 800x600 at output 100: 1/4, as 600 // 100 = 6 allows)."""
    crop = (0, 0, 600, 800)
    requested = jpeg_draft_size((800, 600), crop, 100)
    assert draft_scale((800, 600), requested) == 4
    assert decode_colour_jpeg(jpeg_bytes(textured(800, 600)), (800, 600), requested).shape == (150, 200, 3)
