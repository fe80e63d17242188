"""Label-aware training augmentation: the image is transformed as timm does it, and every geometric step is
recorded as the sample's `CropGeometry`, which sends any point of the augmented image back to the whole image the
score map describes:
- `box`: the RandomResizedCrop box as fractions of the whole image, (x1, y1, x2, y2);
- `flip`: whether the crop was mirrored left-right;
- `warp`: RandAugment's rotate/shear/translate composed into one 2x3 affine map that takes a point of the
  final image to the crop it came from, both in [-1, 1] coordinates (x right, y down; -1 and 1 are the outer
  pixel edges, as in `grid_sample(align_corners=False)`). Points it sends outside [-1, 1] were filled in."""
from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO, NamedTuple

import numpy as np
import torch
import torchvision.transforms.functional as TF
from PIL import Image
from timm.data import RandomResizedCropAndInterpolation
from timm.data.auto_augment import _LEVEL_DENOM, AugmentOp, RandAugment, _interpolation, rand_augment_transform
from timm.data.random_erasing import RandomErasing
from torchvision.transforms import InterpolationMode

from backbones.common.images import read_rgb

GEOMETRIC_OPS = ('Rotate', 'ShearX', 'ShearY', 'TranslateXRel', 'TranslateYRel', 'TranslateX', 'TranslateY')
_INTERPOLATIONS = {'bilinear': InterpolationMode.BILINEAR, 'bicubic': InterpolationMode.BICUBIC}


class CropGeometry(NamedTuple):
    box: torch.Tensor  # (4,) or (B, 4): x1, y1, x2, y2 as fractions of the whole image
    flip: torch.Tensor  # () or (B,): bool
    warp: torch.Tensor  # (2, 3) or (B, 2, 3): final image -> crop, in [-1, 1] coordinates


def identity_geometry() -> CropGeometry:
    return CropGeometry(torch.tensor([0.0, 0.0, 1.0, 1.0]), torch.tensor(False), torch.eye(3)[:2].clone())


# the entry of the affine map each shear or translation sets, and whether its argument is a fraction of the size
AFFINE_ENTRIES = {'ShearX': (0, 1, False), 'ShearY': (1, 0, False), 'TranslateX': (0, 2, False),
                  'TranslateY': (1, 2, False), 'TranslateXRel': (0, 2, True), 'TranslateYRel': (1, 2, True)}


def pil_affine_matrix(op_name: str, args: Sequence[float], size: tuple[int, int]) -> np.ndarray:
    """3x3 map from output to input pixel coordinates of one of timm's geometric RandAugment ops (PIL samples the
    input at `M @ (x, y, 1)` for output pixel-edge coordinates), for the arguments timm passes."""
    w, h = size
    (arg,) = args
    if op_name == 'Rotate':  # PIL Image.rotate: counter-clockwise about the centre (w/2, h/2)
        a = -math.radians(arg)
        rot = np.array([[math.cos(a), math.sin(a), 0.0], [-math.sin(a), math.cos(a), 0.0], [0.0, 0.0, 1.0]])
        to_centre = np.array([[1.0, 0.0, -w / 2], [0.0, 1.0, -h / 2], [0.0, 0.0, 1.0]])
        from_centre = np.array([[1.0, 0.0, w / 2], [0.0, 1.0, h / 2], [0.0, 0.0, 1.0]])
        return from_centre @ rot @ to_centre
    if op_name not in AFFINE_ENTRIES:
        raise ValueError(f'not a geometric RandAugment op: {op_name}')
    row, col, relative = AFFINE_ENTRIES[op_name]
    m = np.eye(3)
    m[row, col] = arg * size[row] if relative else arg
    return m


def pixels_to_normalized(m: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Re-express a pixel-coordinate map of a (w, h) image in [-1, 1] coordinates."""
    w, h = size
    d = np.array([[w / 2, 0.0, w / 2], [0.0, h / 2, h / 2], [0.0, 0.0, 1.0]])  # normalised -> pixels
    d_inverse = np.array([[2 / w, 0.0, -1.0], [0.0, 2 / h, -1.0], [0.0, 0.0, 1.0]])
    return d_inverse @ m @ d


class AppliedOp(NamedTuple):
    """One RandAugment op as timm applied it: its name, the arguments its magnitude gave, and its fill colour."""

    name: str
    args: tuple
    fill: tuple | None


class _RecordingOp:
    """Stands in for an op's function: notes the op and its arguments, then runs it."""

    def __init__(self, name: str, fn, log: list[AppliedOp]) -> None:
        self.name, self.fn, self.log = name, fn, log

    def __call__(self, img: Image.Image, *args, **kwargs) -> Image.Image:
        self.log.append(AppliedOp(self.name, args, kwargs.get('fillcolor')))
        return self.fn(img, *args, **kwargs)


class _ZeroBitPosterize:
    """timm's posterize, keeping 0 bits (a black image) as Pillow < 12 did; Pillow 12+ rejects bits=0, which
    timm's 'inc' posterize reaches at magnitude 10 (m9 with mstd0.5 gets there)."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def __call__(self, img: Image.Image, bits: int, **kwargs) -> Image.Image:
        return Image.new(img.mode, img.size) if bits <= 0 else self.fn(img, bits, **kwargs)


def warp_of(applied: Sequence[AppliedOp], size: tuple[int, int]) -> torch.Tensor:
    """The geometric ops of `applied` (in the order applied) composed: final image -> crop, [-1, 1] coordinates."""
    geometric = [op for op in applied if op.name in GEOMETRIC_OPS]
    if not geometric:
        return torch.eye(3)[:2].clone()
    m = np.eye(3)
    for op in geometric:  # the first op applied is the outermost: out -> ... -> input of op 1
        m = m @ pil_affine_matrix(op.name, op.args, size)
    return torch.from_numpy(pixels_to_normalized(m, size)[:2]).float()


class LabelAwareRandAugment:
    """timm's RandAugment, returning the composed affine map of its geometric ops too; `plan` draws without an image."""

    def __init__(self, augment: RandAugment) -> None:
        self.augment = augment
        self.num_layers = augment.num_layers
        self._log: list[AppliedOp] = []
        for op in augment.ops:
            fn = _ZeroBitPosterize(op.aug_fn) if op.name.startswith('Posterize') else op.aug_fn
            op.aug_fn = _RecordingOp(op.name, fn, self._log)

    @classmethod
    def from_config(cls, config: str, img_size: int, mean: Sequence[float]) -> 'LabelAwareRandAugment':
        """As timm's `create_transform` builds it: translate limit 45% of the size, fill with the mean colour."""
        hparams = dict(translate_const=int(img_size * 0.45), img_mean=tuple(min(255, round(255 * m)) for m in mean))
        return cls(rand_augment_transform(config, hparams))

    def __call__(self, img: Image.Image) -> tuple[Image.Image, torch.Tensor]:
        self._log.clear()
        img = self.augment(img)
        return img, warp_of(self._log, img.size)

    def plan(self, size: tuple[int, int]) -> tuple[list[AppliedOp], torch.Tensor]:
        """The ops an image of `size` would get and their warp, drawn on the same random streams as a call, not run."""
        augment = self.augment
        ops = np.random.choice(augment.ops, augment.num_layers, replace=augment.choice_weights is None,
                               p=augment.choice_weights)
        applied = [drawn for drawn in map(drawn_op, ops) if drawn is not None]
        return applied, warp_of(applied, size)


def drawn_op(op: AugmentOp) -> AppliedOp | None:
    """What timm's `AugmentOp.__call__` draws for one op, in its order (None where it does not apply): its magnitude
    (clamped as timm does), its arguments and, for a geometric op, its resampling filter."""
    if op.prob < 1.0 and random.random() > op.prob:
        return None
    magnitude = op.magnitude
    if op.magnitude_std == float('inf'):
        magnitude = random.uniform(0, magnitude)
    elif op.magnitude_std > 0:
        magnitude = random.gauss(magnitude, op.magnitude_std)
    magnitude = max(0.0, min(magnitude, op.magnitude_max or _LEVEL_DENOM))
    args = op.level_fn(magnitude, op.hparams) if op.level_fn is not None else ()
    if op.name in GEOMETRIC_OPS:
        _interpolation(dict(op.kwargs))
    return AppliedOp(op.name, tuple(args), op.kwargs.get('fillcolor'))


class EraseBoxes:
    """Stands in for an image tensor: records the boxes (top, left, height, width) timm's RandomErasing draws for it."""

    def __init__(self, size: int) -> None:
        self.shape, self.dtype, self.boxes = (3, size, size), torch.float32, []

    def size(self) -> tuple:
        return self.shape

    def __setitem__(self, key: tuple, value: torch.Tensor) -> None:
        _, rows, cols = key
        self.boxes.append((rows.start, cols.start, rows.stop - rows.start, cols.stop - cols.start))


class TrainTransform:
    """RandomResizedCrop, flip, label-aware RandAugment, normalise, random erasing (the image only), one image at a
    time: the image tensor and its `CropGeometry`; the batched path draws the same (`sample_*`, in the same order)."""

    takes_path = True  # ImageFolderDataset hands it the file: a colour JPEG is cropped before Pillow sees it

    def __init__(
            self,
            img_size: int,
            scale: tuple[float, float] = (0.08, 1.0),
            ratio: tuple[float, float] = (3 / 4, 4 / 3),
            hflip: float = 0.5,
            auto_augment: str | None = 'rand-m9-mstd0.5-inc1',
            reprob: float = 0.25,
            interpolation: str = 'random',
            mean: Sequence[float] = (0.485, 0.456, 0.406),
            std: Sequence[float] = (0.229, 0.224, 0.225),
            fast_decode: bool = False,
    ) -> None:
        self.img_size, self.fast_decode = img_size, fast_decode
        self.scale, self.ratio, self.hflip = tuple(scale), tuple(ratio), hflip
        self.interpolations = list(_INTERPOLATIONS.values()) if interpolation == 'random' else [
            _INTERPOLATIONS[interpolation]]
        self.rand_augment = LabelAwareRandAugment.from_config(auto_augment, img_size, mean) if auto_augment else None
        self.mean, self.std = tuple(mean), tuple(std)
        self.mean_t, self.std_t = torch.tensor(mean).view(3, 1, 1), torch.tensor(std).view(3, 1, 1)
        self.erase = RandomErasing(reprob, mode='pixel', device='cpu') if reprob > 0 else None
        # the same draws as `erase`, without making the noise: erasing boxes for the batched path
        self.erase_boxes = RandomErasing(reprob, mode='const', device='cpu') if reprob > 0 else None

    def sample_crop(self, size: tuple[int, int]) -> tuple[int, int, int, int]:
        """RandomResizedCrop's (top, left, height, width) for an image of `size` (w, h), at least one pixel each way."""
        W, H = size
        shaped = torch.empty(0, H, W)  # timm reads the image's size only: a tensor of no elements carries it
        top, left, h, w = RandomResizedCropAndInterpolation.get_params(shaped, self.scale, self.ratio)
        h, w = max(h, 1), max(w, 1)
        return min(top, H - h), min(left, W - w), h, w

    def sample_view(self) -> tuple[InterpolationMode, bool]:
        """The crop's interpolation and whether it is mirrored."""
        return random.choice(self.interpolations), random.random() < self.hflip

    def sample_erasing(self) -> list[tuple[int, int, int, int]]:
        """Random erasing's boxes (top, left, height, width) on the output image; often none."""
        if self.erase_boxes is None:
            return []
        stand_in = EraseBoxes(self.img_size)
        self.erase_boxes(stand_in)
        return stand_in.boxes

    def __call__(self, img: Image.Image | Path | BinaryIO) -> tuple[torch.Tensor, CropGeometry]:
        """The augmented image of a decoded image or of a file (`read_rgb`: the same pixels as Pillow's)."""
        pixels = img if isinstance(img, Image.Image) else read_rgb(img, fast=self.fast_decode).pixels
        W, H = pixels.size if isinstance(pixels, Image.Image) else (pixels.shape[1], pixels.shape[0])
        top, left, h, w = self.sample_crop((W, H))
        interpolation, flip = self.sample_view()
        # Pillow copies the crop's rows; NumPy's copy of a strided slice into a new image is about 10x slower
        image = pixels if isinstance(pixels, Image.Image) else Image.fromarray(pixels)
        crop = image.crop((left, top, left + w, top + h))
        img = TF.resize(crop, [self.img_size, self.img_size], interpolation, antialias=True)
        box = torch.tensor([left / W, top / H, (left + w) / W, (top + h) / H])
        if flip:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        warp = torch.eye(3)[:2].clone()
        if self.rand_augment is not None:
            img, warp = self.rand_augment(img)
        # to_tensor then normalize, in one float copy: the same float32 operations in the same order
        x = torch.from_numpy(np.array(img)).permute(2, 0, 1).to(torch.float32, memory_format=torch.contiguous_format)
        x = x.div_(255).sub_(self.mean_t).div_(self.std_t)
        if self.erase is not None:
            x = self.erase(x)
        return x, CropGeometry(box, torch.tensor(flip), warp)
