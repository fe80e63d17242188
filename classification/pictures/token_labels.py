"""Token labels as pictures: the annotator's dense map over the whole image, and the targets of each token of one
label-aware training augmentation of it, made by the training code itself (`TrainTransform`, `TokenTargetBuilder`)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from backbones.common.drawing import blend, class_colours, enlarge, figure, finished, legend_entries, upscale
from classification.data.augment import CropGeometry, TrainTransform
from classification.objectives.token_targets import TokenTargetBuilder


@dataclass
class TokenLabels:
    """One image's dense map and one augmentation's token targets, as top-1 class and its probability."""

    image: np.ndarray  # (H, W, 3) uint8, the whole image
    map_classes: np.ndarray  # (h, w) the annotator's top-1 class at each map position
    map_confidence: np.ndarray  # (h, w) its probability (softmax over the stored top-k)
    crop: np.ndarray  # (S, S, 3) uint8, the augmented training image
    token_classes: np.ndarray  # (gh, gw) each token's target top-1 class
    token_confidence: np.ndarray  # (gh, gw) its probability
    geometry: CropGeometry


def to_pixels(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """A normalised (3, H, W) tensor back to (H, W, 3) uint8."""
    pixels = x * torch.tensor(std).view(3, 1, 1) + torch.tensor(mean).view(3, 1, 1)
    return (pixels.clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()


def token_labels(image: Image.Image, scores: np.ndarray, classes: np.ndarray, transform: TrainTransform,
                 num_classes: int, patch_size: int = 16, extent: np.ndarray | None = None) -> TokenLabels:
    """The dense map and the token-grid targets of one augmentation of `image` (no label smoothing)."""
    scores_t, classes_t = torch.from_numpy(np.asarray(scores, np.float32)), torch.from_numpy(classes.astype(np.int64))
    map_probs = scores_t.softmax(dim=-1)
    x, geometry = transform(image)
    side = transform.img_size // patch_size
    batch = CropGeometry(*(t[None] for t in geometry))
    extent_t = None if extent is None else torch.as_tensor(extent, dtype=torch.float32)[None]
    _, targets = TokenTargetBuilder(num_classes, smoothing=0.0)(scores_t[None], classes_t[None], batch, (side, side),
                                                                extent_t)
    confidence, top = targets[0].max(dim=-1)
    return TokenLabels(np.asarray(image.convert('RGB')), classes_t[..., 0].numpy(), map_probs[..., 0].numpy(),
                       to_pixels(x, transform.mean, transform.std), top.numpy(), confidence.numpy(), geometry)


def class_mosaic(image: np.ndarray, classes: np.ndarray, confidence: np.ndarray, colours: np.ndarray) -> np.ndarray:
    """Each cell of a class grid laid over the image in its class colour, as opaque as the class is confident."""
    return blend(image, upscale(colours[classes], image.shape[:2]), upscale(confidence, image.shape[:2]))


def describe_geometry(geometry: CropGeometry) -> str:
    x1, y1, x2, y2 = (float(v) for v in geometry.box)
    warped = not torch.allclose(geometry.warp, torch.eye(3)[:2])
    changes = [name for name, done in (('flipped', bool(geometry.flip)), ('rotated/sheared/translated', warped))
               if done]
    return f'x {x1:.2f}-{x2:.2f}, y {y1:.2f}-{y2:.2f} of the image\n' + (', '.join(changes) or 'no flip or warp')


SHOWN_SIZE = 192  # pixels: smaller images and crops are enlarged to about this


def token_label_figure(labels: TokenLabels, class_names: Sequence[str], title: str = '') -> np.ndarray:
    """Four panels: the image, its map, the augmented crop, its token targets; a legend of the classes."""
    colours = class_colours(len(class_names))
    image = enlarge(labels.image, SHOWN_SIZE // max(labels.image.shape[:2]))
    crop = enlarge(labels.crop, SHOWN_SIZE // labels.crop.shape[0])
    fig, axes = figure(1, 4, size=(3.4, 3.6))
    opacity = '\nopacity = probability'
    panels = [('image', image),
              ('annotator map: top-1' + opacity, class_mosaic(image, labels.map_classes, labels.map_confidence,
                                                              colours)),
              ('training crop\n' + describe_geometry(labels.geometry), crop),
              ('token targets: top-1' + opacity, class_mosaic(crop, labels.token_classes, labels.token_confidence,
                                                              colours))]
    for ax, (name, picture) in zip(axes[0], panels):
        ax.imshow(picture, interpolation='nearest')
        ax.set_title(name, fontsize=8)
        ax.axis('off')
    grid_h, grid_w = labels.token_classes.shape
    for i in range(1, grid_h):
        axes[0, 3].axhline(i * crop.shape[0] / grid_h - 0.5, color='white', lw=0.6)
    for j in range(1, grid_w):
        axes[0, 3].axvline(j * crop.shape[1] / grid_w - 0.5, color='white', lw=0.6)
    shown = sorted(set(labels.map_classes.flatten()) | set(labels.token_classes.flatten()))
    legend_entries(axes[0, 3], [class_names[c] for c in shown[:20]], colours[shown[:20]])
    return finished(fig, title)
