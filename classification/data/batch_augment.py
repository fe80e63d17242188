"""Label-aware augmentation in two halves (`--augment batched`): parameters and a small decode in the loader workers,
the pixels a batch at a time on the training device.

`RegionTransform` (workers) draws everything `TrainTransform` draws, in the same order from the same random streams,
so a seed gives the same `CropGeometry` on both paths; it sends the crop's region as uint8 with a plan (with
`decode='device'`, a colour JPEG's bytes, decoded a batch at a time on the device). `BatchAugment` (device) turns a
batch of regions into model input with Pillow's formulas. docs/speed.md tells how its images differ from the PIL
path's."""
from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import InterpolationMode

from backbones.common.distributed import on_device
from backbones.common.errors import UsageError
from backbones.common.images import ImageReadError, file_bytes, read_image, read_rgb
from backbones.common.random_state import batch_generator
from classification.data.augment import GEOMETRIC_OPS, AppliedOp, CropGeometry, TrainTransform
from classification.sources.tars import MemberFile

COLOUR_OPS = ('AutoContrast', 'Equalize', 'Invert', 'Posterize', 'Solarize', 'SolarizeAdd', 'Color', 'Contrast',
              'Brightness', 'Sharpness')
NO_OP = -1


def colour_op_code(name: str) -> int:
    """Index in COLOUR_OPS of a timm op name ('ColorIncreasing' -> 'Color'); a geometric op or another is an error."""
    base = name.removesuffix('Increasing').removesuffix('Original')
    if base not in COLOUR_OPS:
        raise UsageError(f'the batched augmentation has no {name!r}; it applies {", ".join(COLOUR_OPS)} and the '
                         f'geometric ops {", ".join(GEOMETRIC_OPS)} (use --augment pil for other policies)')
    return COLOUR_OPS.index(base)


def jpeg_draft_size(size: tuple[int, int], crop: tuple[int, int, int, int], out: int) -> tuple[int, int]:
    """The smallest whole-image size (w, h) at which the crop still covers `out` pixels each way, for `Image.draft`."""
    W, H = size
    _, _, h, w = crop
    return math.ceil(W * out / w), math.ceil(H * out / h)


@dataclass
class Region:
    """A crop's neighbourhood as decoded: uint8 (h, w, 3) pixels, and the crop box in them, (x1, y1, x2, y2) pixels."""

    pixels: np.ndarray
    box: tuple[float, float, float, float]


@dataclass(frozen=True)
class RegionBounds:
    """Where a crop's region lies in a decoded image: its pixels, the whole factors it is reduced by, its box."""

    pixels: tuple[int, int, int, int]
    factors: tuple[int, int]
    box: tuple[float, float, float, float]


def region_bounds(full_size: tuple[int, int], decoded_size: tuple[int, int], crop: tuple[int, int, int, int],
                  out: int) -> RegionBounds:
    """The region of `crop` (on the full-size image) in the image as decoded at `decoded_size`."""
    top, left, h, w = crop
    sx, sy = decoded_size[0] / full_size[0], decoded_size[1] / full_size[1]
    x1, y1, x2, y2 = left * sx, top * sy, (left + w) * sx, (top + h) * sy
    bx1, by1 = math.floor(x1), math.floor(y1)
    bx2, by2 = min(decoded_size[0], math.ceil(x2)), min(decoded_size[1], math.ceil(y2))
    fx, fy = max(1, int((x2 - x1) // out)), max(1, int((y2 - y1) // out))
    return RegionBounds((bx1, by1, bx2, by2), (fx, fy),
                        ((x1 - bx1) / fx, (y1 - by1) / fy, (x2 - bx1) / fx, (y2 - by1) / fy))


def cut_region(pixels: np.ndarray, full_size: tuple[int, int], crop: tuple[int, int, int, int], out: int) -> Region:
    """The pixels around `crop` from a possibly draft-decoded image, reduced by whole factors (`box_reduce`)."""
    bounds = region_bounds(full_size, (pixels.shape[1], pixels.shape[0]), crop, out)
    x1, y1, x2, y2 = bounds.pixels
    region = pixels[y1:y2, x1:x2]
    region = region.copy() if bounds.factors == (1, 1) else box_reduce(region, bounds.factors)
    return Region(region, bounds.box)


@functools.lru_cache(maxsize=64)  # a box size per entry; the whole factors a run meets are few
def reduce_table(count: int) -> np.ndarray:
    """Pillow's `reduce` of every sum a box of `count` pixels can hold: (sum + count // 2) times its fixed-point
    reciprocal 2^32 / (2^8 count) (in float32, truncated), shifted down 24 bits."""
    sums = np.arange(255 * count + 1, dtype=np.int64)
    multiplier = int(np.float32(2.0 ** 32) / np.float32(256 * count))
    return (((sums + count // 2) * multiplier) >> 24).astype(np.uint8)


def box_reduce(pixels: np.ndarray, factors: tuple[int, int]) -> np.ndarray:
    """Pillow's `Image.reduce(factors)` on (h, w) or (h, w, channels) uint8 pixels, value for value; the last row
    and column of blocks may be partial."""
    fx, fy = factors
    h, w = pixels.shape[:2]
    rows, cols = -(-h // fy), -(-w // fx)
    # zeros pad the partial blocks to whole ones: their sums keep, their counts come from the true lengths
    padded = np.zeros((rows * fy, cols * fx, *pixels.shape[2:]), np.uint16 if 255 * fx * fy < 2 ** 16 else np.uint32)
    padded[:h, :w] = pixels
    row_sums = padded[0::fy].copy()
    for i in range(1, fy):
        row_sums += padded[i::fy]
    blocks = row_sums.reshape(rows, cols, fx, *pixels.shape[2:])
    sums = blocks[:, :, 0].copy()
    for j in range(1, fx):
        sums += blocks[:, :, j]
    reduced = np.empty(sums.shape, np.uint8)
    for row_part, height in ((slice(0, h // fy), fy), (slice(h // fy, rows), h % fy)):
        for col_part, width in ((slice(0, w // fx), fx), (slice(w // fx, cols), w % fx)):
            if height and width:
                reduced[row_part, col_part] = reduce_table(height * width)[sums[row_part, col_part]]
    return reduced


def cut_decoded(image: torch.Tensor, bounds: RegionBounds) -> torch.Tensor:
    """`cut_region` on a decoded (3, H, W) uint8 tensor, on its device, partial blocks averaged as Pillow's."""
    x1, y1, x2, y2 = bounds.pixels
    region = image[:, y1:y2, x1:x2]
    if bounds.factors != (1, 1):
        fx, fy = bounds.factors
        region = F.avg_pool2d(region[None].float(), (fy, fx), ceil_mode=True)[0].round().to(torch.uint8)
    return region.permute(1, 2, 0)


@dataclass
class EncodedJpeg:
    """A JPEG file's bytes on their way to the device's decoder, with its crop's region and its path."""

    data: torch.Tensor  # uint8 (n,)
    bounds: RegionBounds
    path: str


def bytes_for_device(img: Image.Image, path: Path | MemberFile) -> bytes | None:
    """The file's bytes where the device's decoder takes it (a complete colour JPEG), else None."""
    if img.format != 'JPEG' or img.mode != 'RGB':
        return None
    data = file_bytes(path)
    return data if data.rstrip(b'\0')[-2:] == b'\xff\xd9' else None


class RegionTransform:
    """The worker half: reads an image file and returns (uint8 region (h, w, 3), `CropGeometry`, plan of Python
    values); with `decode='device'`, a colour JPEG's bytes instead (`EncodedJpeg`). The same draws either way."""

    takes_path = True  # ImageFolderDataset hands it the file, for the reduced decode

    def __init__(self, reference: TrainTransform, decode: str = 'worker') -> None:
        if decode not in ('worker', 'device'):
            raise UsageError(f'decode must be worker or device, got {decode!r}')
        self.reference, self.decode = reference, decode
        layers = reference.rand_augment.num_layers if reference.rand_augment is not None else 0
        self.layers = layers
        self.max_boxes = reference.erase_boxes.max_count if reference.erase_boxes is not None else 0

    def __call__(self, path: Path | MemberFile) -> tuple[torch.Tensor | EncodedJpeg, CropGeometry, dict]:
        t, out = self.reference, self.reference.img_size
        if self.decode == 'device':
            image, (W, H), crop = self.read_for_device(path)
        else:
            image, (W, H), crop = self.read_region(path)
        top, left, h, w = crop
        interpolation, flip = t.sample_view()
        applied, warp = t.rand_augment.plan((out, out)) if t.rand_augment is not None else ([], torch.eye(3)[:2])
        boxes = t.sample_erasing()
        geometry = CropGeometry(torch.tensor([left / W, top / H, (left + w) / W, (top + h) / H]), torch.tensor(flip),
                                warp)
        box = image.bounds.box if isinstance(image, EncodedJpeg) else image.box
        pixels = image if isinstance(image, EncodedJpeg) else torch.from_numpy(image.pixels)
        # Python values: the tensors are made once per batch (batch_plan), not a dozen per image
        plan = {'box': box, 'bicubic': interpolation == InterpolationMode.BICUBIC, 'flip': flip, 'warp': warp,
                **self.colour_plan(applied), 'erase': self.erase_plan(boxes)}
        return pixels, geometry, plan

    def read_region(self, path: Path | MemberFile) -> tuple[Region, tuple[int, int], tuple[int, int, int, int]]:
        """The crop drawn for the file's size, and its region decoded at the smallest JPEG scale that keeps the crop
        at least the output size (`read_rgb`: simplejpeg for colour JPEGs, Pillow for the rest)."""
        t, out, drawn = self.reference, self.reference.img_size, {}

        def requested(size: tuple[int, int]) -> tuple[int, int]:
            drawn['crop'] = crop = t.sample_crop(size)
            return jpeg_draft_size(size, crop, out)

        decoded = read_rgb(path, requested, t.fast_decode)
        return cut_region(decoded.pixels, decoded.full_size, drawn['crop'], out), decoded.full_size, drawn['crop']

    def read_for_device(self, path: Path | MemberFile) -> tuple[Region | EncodedJpeg, tuple[int, int],
                                                                 tuple[int, int, int, int]]:
        """A colour JPEG's bytes with its crop's region (`EncodedJpeg`); any other file decoded by Pillow here."""
        t, out, drawn = self.reference, self.reference.img_size, {}

        def plan_decode(img: Image.Image) -> bool:
            """Draw the crop; ask for the reduced decode, or for none where the device decodes the file."""
            drawn['size'] = img.size
            drawn['crop'] = crop = t.sample_crop(img.size)
            drawn['encoded'] = bytes_for_device(img, path)
            if drawn['encoded'] is not None:
                return False
            img.draft('RGB', jpeg_draft_size(img.size, crop, out))
            return True

        img = read_image(path, plan_decode)
        size, crop = drawn['size'], drawn['crop']
        if img is not None:
            return cut_region(np.asarray(img), size, crop, out), size, crop
        bounds = region_bounds(size, size, crop, out)
        return EncodedJpeg(torch.frombuffer(bytearray(drawn['encoded']), dtype=torch.uint8), bounds, str(path)), \
            size, crop

    def colour_plan(self, applied: Sequence[AppliedOp]) -> dict[str, list]:
        """The colour ops in the order applied, padded to the layer count, with `warped` and the `fill` colour."""
        ops, args, warped = [NO_OP] * self.layers, [0.0] * self.layers, [False] * self.layers
        geometric = [i for i, op in enumerate(applied) if op.name in GEOMETRIC_OPS]
        fill = next((op.fill for op in applied if op.fill is not None), (0, 0, 0))
        colour = [(i, op) for i, op in enumerate(applied) if op.name not in GEOMETRIC_OPS]
        for layer, (i, op) in enumerate(colour):
            ops[layer], warped[layer] = colour_op_code(op.name), bool(geometric) and i < geometric[-1]
            args[layer] = float(op.args[0]) if op.args else 0.0
        return {'ops': ops, 'args': args, 'warped': warped, 'fill': list(fill)}

    def erase_plan(self, boxes: Sequence[tuple[int, int, int, int]]) -> list[list[int]]:
        """The erased boxes (top, left, height, width), padded to the most a sample may get with height 0."""
        return [list(box) for box in boxes] + [[0, 0, 0, 0]] * (self.max_boxes - len(boxes))


# the plan's values and their tensors' types; `warp` (a tensor per image) is stacked
PLAN_TYPES = {'box': torch.float32, 'bicubic': torch.bool, 'flip': torch.bool, 'ops': torch.long,
              'args': torch.float32, 'warped': torch.bool, 'fill': torch.float32, 'erase': torch.long}


def batch_plan(plans: Sequence[dict]) -> dict[str, torch.Tensor]:
    """The workers' per-image plans as one tensor per key, (B, ...)."""
    plan = {key: torch.tensor([p[key] for p in plans], dtype=dtype) for key, dtype in PLAN_TYPES.items()}
    plan['erase'] = plan['erase'].reshape(len(plans), len(plans[0]['erase']), 4)  # (B, 0, 4) without erasing
    plan['warp'] = torch.stack([p['warp'] for p in plans])
    return plan


class Groups(NamedTuple):
    """Which images each part of the device half takes, as slices decided on the host (no read-back)."""

    resample: tuple[tuple[str, int, int], ...]  # (interpolation, start, stop) of plan['resample_index']
    colour: tuple[tuple[int, int, int, int], ...]  # (layer, op code, start, stop) of plan['colour_index']
    erased: int  # the images with an erasing box: plan['erase_index'], in order


def grouped_plan(plan: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], Groups]:
    """The collated plan with its index tensors and their `Groups`, in the order the device half applies them."""
    indices = {'resample_index': [], 'colour_index': [], 'erase_index': []}
    resample, colour = [], []

    def group(key: str, pick: torch.Tensor) -> tuple[int, int]:
        start = sum(len(i) for i in indices[key])
        indices[key].append(pick.nonzero().squeeze(1))
        return start, start + len(indices[key][-1])

    for mode, pick in (('bilinear', ~plan['bicubic']), ('bicubic', plan['bicubic'])):
        if pick.any():
            resample.append((mode, *group('resample_index', pick)))
    ops = plan['ops']
    for layer in range(ops.shape[1]):
        for code in ops[:, layer].unique().tolist():
            if code != NO_OP:
                colour.append((layer, code, *group('colour_index', ops[:, layer] == code)))
    boxes = plan['erase']
    erased = group('erase_index', ((boxes[..., 2] > 0) & (boxes[..., 3] > 0)).any(1))[1]
    index = {key: torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long) for key, parts in indices.items()}
    return {**plan, **index}, Groups(tuple(resample), tuple(colour), erased)


@dataclass
class PendingImages:
    """A batch of regions packed one after another (N, 3) (a padded canvas would carry up to 3x the bytes), their
    places in `plan['region']` (offset, h, w), the plans, their `Groups` and the largest region's size."""

    pixels: torch.Tensor
    plan: dict[str, torch.Tensor]
    groups: Groups
    size: tuple[int, int]  # (H, W): the largest height and width of the regions

    @classmethod
    def of(cls, regions: Sequence[torch.Tensor], plan: dict[str, torch.Tensor], groups: Groups) -> 'PendingImages':
        """Regions (h, w, 3) on one device, packed."""
        sizes = [tuple(r.shape[:2]) for r in regions]
        offsets = itertools.accumulate((h * w for h, w in sizes[:-1]), initial=0)
        region = torch.tensor([(o, h, w) for o, (h, w) in zip(offsets, sizes)], dtype=torch.long)
        pixels = torch.cat([r.reshape(-1, 3) for r in regions])
        return cls(pixels, {**plan, 'region': region.to(pixels.device, non_blocking=True)}, groups,
                   (max(h for h, _ in sizes), max(w for _, w in sizes)))

    def to(self, device: torch.device, non_blocking: bool = False) -> 'PendingImages':
        return PendingImages(self.pixels.to(device, non_blocking=non_blocking),
                             {k: v.to(device, non_blocking=non_blocking) for k, v in self.plan.items()}, self.groups,
                             self.size)

    def pin_memory(self) -> 'PendingImages':
        return PendingImages(self.pixels.pin_memory(), {k: v.pin_memory() for k, v in self.plan.items()},
                             self.groups, self.size)

    def __len__(self) -> int:
        return self.plan['box'].shape[0]

    def canvas(self) -> torch.Tensor:
        """The regions at the top left of one (B, H, W, 3) canvas on their device, each with its last row and column
        repeated to the canvas edge (interpolation at the crop border reads the region's own pixels): one gather."""
        (H, W), device = self.size, self.pixels.device
        offset, h, w = (self.plan['region'][:, i].view(-1, 1, 1) for i in range(3))
        rows = torch.minimum(torch.arange(H, device=device).view(1, H, 1), h - 1)
        cols = torch.minimum(torch.arange(W, device=device).view(1, 1, W), w - 1)
        return self.pixels[offset + rows * w + cols]


@dataclass
class EncodedImages:
    """A batch whose regions are still, some or all, JPEG files: `decode` makes them `PendingImages`."""

    regions: list[torch.Tensor | EncodedJpeg]
    plan: dict[str, torch.Tensor]
    groups: Groups

    def to(self, device: torch.device, non_blocking: bool = False) -> 'EncodedImages':
        """The plans on `device`; the files stay in host memory, where the decoder reads them."""
        return EncodedImages(self.regions, {k: v.to(device, non_blocking=non_blocking) for k, v in self.plan.items()},
                             self.groups)

    def pin_memory(self) -> 'EncodedImages':
        return EncodedImages(self.regions, {k: v.pin_memory() for k, v in self.plan.items()}, self.groups)

    def __len__(self) -> int:
        return len(self.regions)

    def decode(self) -> PendingImages:
        device = self.plan['box'].device
        files = [(i, r) for i, r in enumerate(self.regions) if isinstance(r, EncodedJpeg)]
        regions = [r if isinstance(r, EncodedJpeg) else r.to(device, non_blocking=True) for r in self.regions]
        for (i, jpeg), image in zip(files, decode_jpegs([jpeg for _, jpeg in files], device)):
            regions[i] = cut_decoded(image, jpeg.bounds)
        return PendingImages.of(regions, self.plan, self.groups)


def decode_jpegs(files: Sequence[EncodedJpeg], device: torch.device) -> list[torch.Tensor]:
    """The files as (3, H, W) uint8 RGB on `device`, decoded in one call; a file the decoder refuses is named."""
    if not files:
        return []
    decode = decoded_on_own_stream if device.type == 'cuda' else functools.partial(decode_jpeg,
                                                                                   mode=ImageReadMode.RGB)
    try:
        return decode([f.data for f in files], device=device)
    except RuntimeError:
        for f in files:
            try:
                decode([f.data], device=device)
            except RuntimeError as e:
                raise ImageReadError(f'cannot read image {f.path}: the {device.type} JPEG decoder: {e}; decode it '
                                     f'in the workers (--decode cpu) or replace the file') from e
        raise


@functools.cache
def decoding_stream(device: torch.device) -> torch.cuda.Stream:
    """A high-priority stream: from torch's pool of those, never the stream a batch is prepared on."""
    return torch.cuda.Stream(device, priority=-1)


def decoded_on_own_stream(data: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """nvJPEG's images, which the calling stream's next work waits for. torchvision's CUDA decoder writes its outputs
    from its own stream, which waits for nothing (pytorch/vision#9606): the decode runs on a stream holding only decoded
    images, each marked as used by the calling stream."""
    calling, decoding = torch.cuda.current_stream(device), decoding_stream(device)
    if calling == decoding:  # a caller on the decoding stream itself: drain it, as the only safe order left
        calling.synchronize()
        return decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    with torch.cuda.stream(decoding):
        images = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)  # decoding waits for the decoder
    calling.wait_stream(decoding)
    for image in images:
        image.record_stream(calling)
    return images


def collate_regions(regions: Sequence[torch.Tensor | EncodedJpeg],
                    plans: Sequence[dict]) -> PendingImages | EncodedImages:
    plan, groups = grouped_plan(batch_plan(plans))
    if any(isinstance(r, EncodedJpeg) for r in regions):
        return EncodedImages(list(regions), plan, groups)
    return PendingImages.of(regions, plan, groups)


def luma(x: torch.Tensor) -> torch.Tensor:
    """Pillow's RGB -> L: (19595 R + 38470 G + 7471 B + 2^15) >> 16, on (n, 3, H, W) integer values."""
    return torch.floor((x[:, 0:1] * 19595 + x[:, 1:2] * 38470 + x[:, 2:3] * 7471 + 32768) / 65536)


def blend(degenerate: torch.Tensor, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """ImageEnhance: degenerate + factor * (x - degenerate), truncated to uint8 as `Image.blend` does."""
    return (degenerate + factor.view(-1, 1, 1, 1) * (x - degenerate)).clamp(0, 255).floor()


def masked_histogram(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(n, c, 256) counts of each value per image and channel, over the pixels of `mask` (n, 1, H, W)."""
    n, c = x.shape[:2]
    weights = mask.expand_as(x).reshape(n * c, -1).float()
    hist = torch.zeros(n * c, 256, device=x.device)
    return hist.scatter_add_(1, x.reshape(n * c, -1).long(), weights).view(n, c, 256)


def apply_lut(x: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """Per image and channel look-up tables (n, c, 256) applied to integer values."""
    n, c = x.shape[:2]
    return lut.view(n * c, 256).gather(1, x.reshape(n * c, -1).long()).view_as(x).to(x.dtype)


def autocontrast(x: torch.Tensor, _: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    hist = masked_histogram(x, mask)
    values = torch.arange(256, device=x.device, dtype=torch.float32)
    present = hist > 0
    lo = torch.where(present, values, 256.0).amin(-1, keepdim=True)
    hi = torch.where(present, values, -1.0).amax(-1, keepdim=True)
    scale = 255.0 / (hi - lo).clamp_min(1)
    lut = (values * scale - lo * scale + 1e-4).clamp(0, 255).floor()
    return apply_lut(x, torch.where(hi > lo, lut, values))


def equalize(x: torch.Tensor, _: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    hist = masked_histogram(x, mask)
    values = torch.arange(256, device=x.device, dtype=torch.float32)
    last = torch.where(hist > 0, values, -1.0).argmax(-1, keepdim=True)  # the highest value present
    step = torch.div(hist.sum(-1, keepdim=True) - hist.gather(-1, last), 255, rounding_mode='floor')
    before = hist.cumsum(-1) - hist
    lut = torch.div(torch.div(step, 2, rounding_mode='floor') + before, step.clamp_min(1), rounding_mode='floor')
    flat = (step == 0) | ((hist > 0).sum(-1, keepdim=True) <= 1)
    return apply_lut(x, torch.where(flat, values, lut.clamp(max=255)))


def invert(x, _, __):
    return 255 - x


def posterize(x, bits, _):
    quantum = torch.exp2(8 - bits.clamp(0, 8)).view(-1, 1, 1, 1)
    return torch.floor(x / quantum) * quantum


def solarize(x, threshold, _):
    return torch.where(x < threshold.view(-1, 1, 1, 1), x, 255 - x)


def solarize_add(x, add, _, threshold: float = 128):
    return torch.where(x < threshold, (x + add.view(-1, 1, 1, 1)).clamp(max=255), x)


def color(x, factor, _):
    return blend(luma(x).expand_as(x), x, factor)


def contrast(x, factor, mask):
    grey = luma(x)
    mean = (grey * mask).sum((1, 2, 3)) / mask.sum((1, 2, 3)).clamp_min(1)
    return blend(torch.floor(mean + 0.5).view(-1, 1, 1, 1).expand_as(x), x, factor)


def brightness(x, factor, _):
    return blend(torch.zeros_like(x), x, factor)


SMOOTH = torch.tensor([[1.0, 1.0, 1.0], [1.0, 5.0, 1.0], [1.0, 1.0, 1.0]]) / 13  # ImageFilter.SMOOTH


def sharpness(x, factor, _):
    smooth = F.conv2d(x, on_device(SMOOTH, x.device).expand(x.shape[1], 1, 3, 3), groups=x.shape[1])
    degenerate = x.clone()
    degenerate[:, :, 1:-1, 1:-1] = torch.floor(smooth + 0.5).clamp(0, 255)  # Pillow keeps the border pixels
    return blend(degenerate, x, factor)


COLOUR_FUNCTIONS: dict[str, Callable] = {
    'AutoContrast': autocontrast, 'Equalize': equalize, 'Invert': invert, 'Posterize': posterize,
    'Solarize': solarize, 'SolarizeAdd': solarize_add, 'Color': color, 'Contrast': contrast,
    'Brightness': brightness, 'Sharpness': sharpness,
}


def canvas_map(plan: dict[str, torch.Tensor], canvas: tuple[int, int]) -> torch.Tensor:
    """(B, 2, 3) affine map of `grid_sample`: output [-1, 1] -> (warp) crop -> (flip) unmirrored crop -> canvas."""
    box, H, W = plan['box'], *canvas
    B = box.shape[0]
    to_canvas = torch.zeros(B, 3, 3, device=box.device)
    to_canvas[:, 0, 0], to_canvas[:, 1, 1] = (box[:, 2] - box[:, 0]) / W, (box[:, 3] - box[:, 1]) / H
    to_canvas[:, 0, 2], to_canvas[:, 1, 2] = (box[:, 0] + box[:, 2]) / W - 1, (box[:, 1] + box[:, 3]) / H - 1
    to_canvas[:, 2, 2] = 1
    mirror = torch.ones(B, 3, device=box.device)
    mirror[:, 0] = torch.where(plan['flip'], -1.0, 1.0)
    bottom = torch.zeros(B, 1, 3, device=box.device)
    bottom[..., 2] = 1  # made on the device: a row copied from the host would make it wait
    warp = torch.cat([plan['warp'].float(), bottom], 1)
    return (to_canvas @ torch.diag_embed(mirror) @ warp)[:, :2]


def sampling_grid(theta: torch.Tensor, size: int) -> torch.Tensor:
    """`F.affine_grid(theta, [B, C, size, size], align_corners=False)` as two broadcast sums (faster on CPU)."""
    centres = (torch.arange(size, device=theta.device, dtype=torch.float32) * 2 + 1) / size - 1
    x, y = centres.view(1, 1, size), centres.view(1, size, 1)
    t = theta.float().unsqueeze(-1).unsqueeze(-1)  # (B, 2, 3, 1, 1)
    return torch.stack([t[:, i, 0] * x + t[:, i, 1] * y + t[:, i, 2] for i in range(2)], dim=-1)


class BatchAugment:
    """The device half: `PendingImages` -> normalised (B, 3, S, S) images, as `TrainTransform` makes them."""

    def __init__(self, img_size: int, mean: Sequence[float], std: Sequence[float]) -> None:
        self.img_size = img_size
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1) * 255
        self.std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1) * 255

    def __call__(self, pending: PendingImages | EncodedImages, seed: int | None = None) -> torch.Tensor:
        """The batch's model input; erasing's noise drawn from a generator seeded with `seed`."""
        if isinstance(pending, EncodedImages):
            pending = pending.decode()
        x, inside = self.resample(pending)
        x = self.colour(x, inside, pending.plan, pending.groups)
        x = (x - on_device(self.mean, x.device)) / on_device(self.std, x.device)
        return self.erase(x, pending.plan, pending.groups, batch_generator(seed, x.device))

    def resample(self, pending: PendingImages) -> tuple[torch.Tensor, torch.Tensor]:
        """Crop, resize, flip and warp in one sampling per interpolation; the fill outside, and where the crop is."""
        plan, S, pixels = pending.plan, self.img_size, pending.canvas()
        B = pixels.shape[0]
        grid = sampling_grid(canvas_map(plan, pixels.shape[1:3]), S)
        x = torch.empty(B, 3, S, S, device=pixels.device)
        for mode, start, stop in pending.groups.resample:
            pick = slice(None) if stop - start == B else plan['resample_index'][start:stop]  # all: no copies
            source = pixels[pick].permute(0, 3, 1, 2).float()
            x[pick] = F.grid_sample(source, grid[pick], mode=mode, padding_mode='border', align_corners=False)
        inside = (sampling_grid(plan['warp'], S).abs() <= 1).all(dim=-1).unsqueeze(1)
        x = torch.where(inside, x.clamp(0, 255).round(), plan['fill'].view(B, 3, 1, 1))
        return x, inside

    def colour(self, x: torch.Tensor, inside: torch.Tensor, plan: dict[str, torch.Tensor],
               groups: Groups) -> torch.Tensor:
        """Each layer's colour op on the images that drew it (on the crop's pixels only before a geometric op)."""
        args, warped = plan['args'].float(), plan['warped']
        everywhere = torch.ones_like(inside)
        for layer, code, start, stop in groups.colour:
            pick = plan['colour_index'][start:stop]
            mask = torch.where(warped[pick, layer].view(-1, 1, 1, 1), inside[pick], everywhere[pick])
            before = x[pick]
            after = COLOUR_FUNCTIONS[COLOUR_OPS[code]](before, args[pick, layer], mask.float())
            x[pick] = torch.where(mask, after, before)
        return x

    def erase(self, x: torch.Tensor, plan: dict[str, torch.Tensor], groups: Groups,
              draws: torch.Generator | None) -> torch.Tensor:
        """Per-pixel normal noise in each drawn box (top, left, height, width)."""
        if not groups.erased:
            return x
        boxes = plan['erase']
        rows = torch.arange(x.shape[2], device=x.device).view(1, 1, -1, 1)
        cols = torch.arange(x.shape[3], device=x.device).view(1, 1, 1, -1)
        mask = torch.zeros(x.shape[0], 1, x.shape[2], x.shape[3], dtype=torch.bool, device=x.device)
        shape = (-1, 1, 1, 1)
        for top, left, h, w in (box.unbind(1) for box in boxes.unbind(1)):
            mask |= ((rows >= top.view(shape)) & (rows < (top + h).view(shape))
                     & (cols >= left.view(shape)) & (cols < (left + w).view(shape)))
        erased = plan['erase_index']
        chosen = x[erased]
        noise = torch.randn(chosen.shape, generator=draws, device=x.device, dtype=x.dtype)
        x[erased] = torch.where(mask[erased], noise, chosen)
        return x

