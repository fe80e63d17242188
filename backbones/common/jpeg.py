"""Colour JPEGs decoded by libjpeg-turbo through simplejpeg, pixel for pixel as Pillow decodes them, at the scale
Pillow's `Image.draft` picks. Baseline and progressive 3-component YCbCr JPEGs only: anything else gets None here
and is read by Pillow (`images.read_rgb`). `fast=True` trades Pillow's pixels for speed (docs/speed.md);
`pillow_only()` turns this decoder off."""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np
import simplejpeg

DRAFT_SCALES = (8, 4, 2, 1)  # the reductions Pillow's `Image.draft` picks from, largest first
# simplejpeg picks the smallest factor n/8 whose rounded-up size reaches the size asked for: on a side of 8 pixels
# or more that is Pillow's scale, on a narrower one a smaller n can round to the same size (5 pixels at 7/8); and
# a 5x5 image at 1/4 decodes to other pixels in the two (tests/test_jpeg_decoding.py): Pillow reads those
SMALLEST_SIDE = 8
_state = {'enabled': True}


@contextlib.contextmanager
def pillow_only() -> Iterator[None]:
    """Every image read by Pillow while inside (in this process, and loader workers started inside)."""
    before, _state['enabled'] = _state['enabled'], False
    try:
        yield
    finally:
        _state['enabled'] = before


def colour_jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a 3-component YCbCr JPEG this decoder takes; None for any other file."""
    if not _state['enabled'] or data[:2] != b'\xff\xd8':
        return None
    try:
        height, width, colourspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:  # a header libjpeg-turbo cannot read: Pillow names the file
        return None
    return (width, height) if colourspace == 'YCbCr' else None


def draft_scale(size: tuple[int, int], requested: tuple[int, int] | None) -> int:
    """The reduction of 8, 4, 2, 1 at which `Image.draft` decodes a JPEG of `size` to at least `requested`."""
    if requested is None:
        return 1
    most = min(size[0] // requested[0], size[1] // requested[1])
    return next((s for s in DRAFT_SCALES if most >= s), 1)


def decode_colour_jpeg(data: bytes, size: tuple[int, int], requested: tuple[int, int] | None = None,
                       fast: bool = False) -> np.ndarray | None:
    """The (h, w, 3) uint8 pixels of a colour JPEG of `size` at Pillow's draft scale for `requested`; None for an
    image narrower than SMALLEST_SIDE or a file simplejpeg refuses (Pillow then reads it)."""
    if min(size) < SMALLEST_SIDE:
        return None
    least = tuple(math.ceil(side / draft_scale(size, requested)) for side in size)
    try:
        return simplejpeg.decode_jpeg(data, 'RGB', fastdct=fast, fastupsample=fast, min_width=least[0],
                                      min_height=least[1], strict=True)
    except ValueError:  # strict: a truncated or corrupt file too, which Pillow reports as before
        return None
