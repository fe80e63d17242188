"""matplotlib figures as PNG files or as image arrays (TensorBoard), and class colours.

Figures are matplotlib `Figure` objects drawn on their own Agg canvas, never through pyplot's global state: importing
or using this module leaves the process's matplotlib backend (a notebook's inline plots) as it was. Only `show_image`,
which opens a window on request, uses pyplot."""
from __future__ import annotations

import colorsys
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.image import imsave

from backbones.common.errors import UsageError
from backbones.common.log import logger

Colour = tuple[int, int, int]


def class_colours(count: int) -> np.ndarray:
    """(count, 3) uint8 colours, distinct for neighbouring indices: tab10 / tab20, beyond 20 golden-ratio hues."""
    if count <= 20:
        table = matplotlib.colormaps['tab10' if count <= 10 else 'tab20'].colors[:count]
        return np.round(np.array(table) * 255).astype(np.uint8)
    hues = (np.arange(count) * 0.618033988749895) % 1.0
    return np.array([[round(255 * c) for c in colorsys.hsv_to_rgb(h, 0.75, 0.95)] for h in hues], dtype=np.uint8)


def figure(rows: int, cols: int, size: tuple[float, float] = (4.0, 4.0),
           width_ratios: Sequence[float] | None = None):
    """A figure with rows x cols axes of `size` inches on average (widths per `width_ratios`): (figure, axes)."""
    fig = Figure(figsize=(cols * size[0], rows * size[1]))
    FigureCanvasAgg(fig)  # the figure's own canvas: rendered without pyplot
    return fig, fig.subplots(rows, cols, squeeze=False, width_ratios=width_ratios)


def figure_array(fig) -> np.ndarray:
    """The rendered figure as an (H, W, 3) uint8 image."""
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def drawable(text: str) -> str:
    """`text` with a file name's undecodable bytes (surrogate escapes, which matplotlib refuses) as U+FFFD."""
    return text.encode('utf-8', 'surrogateescape').decode('utf-8', 'replace')


def finished(fig, title: str = '') -> np.ndarray:
    """Lay the figure out (under its title, if any) and render it (`figure_array`)."""
    if title:
        fig.suptitle(drawable(title), fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()) if title else None)
    return figure_array(fig)


def write_png(image: np.ndarray, path: str | Path, show: bool = False) -> Path:
    """An (H, W, 3) uint8 image written as a PNG exactly, shown in a window if asked and possible; returns the path."""
    path = Path(path)
    if path.parent and not path.parent.is_dir():
        raise UsageError(f'cannot write {path}: the folder {path.parent} does not exist')
    imsave(path, np.ascontiguousarray(image))
    if show:
        show_image(image, path.name)
    return path


def show_image(image: np.ndarray, title: str) -> None:
    """Open the image in a window (a GUI backend for pyplot, asked for by `--show`)."""
    if sys.platform not in ('darwin', 'win32') and not (os.environ.get('DISPLAY') or os.environ.get('WAYLAND_DISPLAY')):
        logger.warning(f'no display here: {title} is written, not shown')
        return
    import matplotlib.pyplot as plt
    plt.switch_backend(next(b for b in ('macosx', 'QtAgg', 'TkAgg') if _backend_works(b)))
    plt.figure(title)
    plt.imshow(image)
    plt.axis('off')
    plt.show()


def _backend_works(name: str) -> bool:
    import matplotlib.pyplot as plt
    try:
        plt.switch_backend(name)
        return True
    except Exception:  # a backend whose toolkit is missing
        return False


def blend(image: np.ndarray, colours: np.ndarray, alpha: np.ndarray | float) -> np.ndarray:
    """`colours` laid over `image` (both (H, W, 3) uint8) with opacity `alpha` (a number, or (H, W) in [0, 1])."""
    alpha = np.asarray(alpha, dtype=np.float64)
    if alpha.ndim == 2:
        alpha = alpha[..., None]
    return np.round(image * (1 - alpha) + colours * alpha).clip(0, 255).astype(np.uint8)


def enlarge(picture: np.ndarray, factor: int) -> np.ndarray:
    """Each pixel of an (H, W, ...) picture as a factor x factor block (colours unchanged)."""
    return picture.repeat(factor, axis=0).repeat(factor, axis=1) if factor > 1 else picture


def upscale(grid: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """An (h, w, ...) grid repeated to the nearest cells of an (H, W) image (cell edges at round(i * H / h))."""
    rows = (np.arange(size[0]) * grid.shape[0] // size[0]).clip(0, grid.shape[0] - 1)
    cols = (np.arange(size[1]) * grid.shape[1] // size[1]).clip(0, grid.shape[1] - 1)
    return grid[rows][:, cols]


def legend_entries(ax, names: Sequence[str], colours: np.ndarray, title: str = '') -> None:
    """A legend of class colours on `ax`."""
    from matplotlib.patches import Patch
    handles = [Patch(color=np.asarray(c) / 255, label=drawable(n)) for n, c in zip(names, colours)]
    ax.legend(handles=handles, title=title, loc='center left', bbox_to_anchor=(1.02, 0.5), fontsize=8, frameon=False)
