"""Semantic segmentation's pictures: label maps laid over the image in the data set's palette (mmseg's own
visualiser), ground truth and prediction side by side with a report's per-class IoU as bars, a report's confusion
matrix; the `ValidationPictures` hook (a few validation images drawn at every validation of a training run) and the
`PredictionPictures` hook (test_seg.py --show-dir)."""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import mmcv
import numpy as np
from mmengine.hooks import Hook
from mmengine.structures import PixelData
from mmseg.engine.hooks import SegVisualizationHook
from mmseg.registry import HOOKS
from mmseg.structures import SegDataSample
from mmseg.visualization import SegLocalVisualizer
from PIL import Image

from backbones.common.drawing import enlarge, figure, finished, write_png
from backbones.common.errors import DataError
from backbones.dense.data_check import loaded_value
from backbones.dense.pictures import side_by_side, titled
from backbones.dense.semantic.metric import read_confusion, row_shares, top_confusions

_NAMES = itertools.count()


def draw_labels(image: np.ndarray, labels: np.ndarray, classes: Sequence[str], palette: Sequence[Sequence[int]],
                alpha: float = 0.6, with_labels: bool = True) -> np.ndarray:
    """A label map over an RGB image, by mmseg's SegLocalVisualizer (palette colours, opacity `alpha`, class names);
    ignored pixels (255) show the image as it is, where mmseg would darken them."""
    visualizer = SegLocalVisualizer(name=f'suite-picture-{next(_NAMES)}', alpha=alpha)
    visualizer.dataset_meta = dict(classes=list(classes), palette=[list(c) for c in palette])
    sample = SegDataSample()
    # NumPy labels: mmseg indexes the image with `labels == class`, which for a one-pixel torch tensor numpy takes
    # for an integer index
    sample.pred_sem_seg = PixelData(data=labels.astype(np.int64)[None])
    visualizer.add_datasample('labels', image, sample, draw_gt=False, draw_pred=True, with_labels=with_labels)
    drawn = visualizer.get_image().copy()
    unpainted = (labels >= len(classes)) & (drawn == (image * (1 - alpha)).astype(np.uint8)).all(axis=-1)
    drawn[unpainted] = image[unpainted]  # a class name's box drawn there stays
    return drawn


@HOOKS.register_module()
class ValidationPictures(SegVisualizationHook):
    """mmseg's SegVisualizationHook drawing `count` validation batches spread over the set (the same each time)."""

    def __init__(self, count: int = 4, **kwargs) -> None:
        super().__init__(draw=count > 0, interval=1, **kwargs)
        self.count = count
        self._drawn: set[int] = set()

    def before_val_epoch(self, runner) -> None:
        batches = len(runner.val_loop.dataloader)
        self._drawn = {i * batches // self.count for i in range(min(self.count, batches))}

    def _after_iter(self, runner, batch_idx: int, data_batch: dict, outputs: Sequence[SegDataSample],
                    mode: str = 'val') -> None:
        if mode == 'val' and batch_idx in self._drawn:
            super()._after_iter(runner, batch_idx, data_batch, outputs, mode)


@HOOKS.register_module()
class PredictionPictures(Hook):
    """tools/test_seg.py --show-dir: each test image's `segmentation_picture` as FOLDER/NAME.png."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def before_test(self, runner) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)

    def after_test_iter(self, runner, batch_idx: int, data_batch=None, outputs: Sequence[SegDataSample] = ()) -> None:
        meta = runner.test_loop.dataloader.dataset.metainfo
        for sample in outputs:
            # decoded as the test pipeline decodes it (mmcv, OpenCV), which the prediction's pixels are of
            image = mmcv.imfrombytes(Path(sample.img_path).read_bytes(), flag='color', channel_order='rgb')
            truth = sample.gt_sem_seg.data[0].cpu().numpy() if 'gt_sem_seg' in sample else None
            picture = segmentation_picture(image, sample.pred_sem_seg.data[0].cpu().numpy(), meta['classes'],
                                           meta['palette'], truth)
            write_png(picture, self.folder / f'{Path(sample.img_path).stem}.png')


def iou_bars(report: dict) -> np.ndarray:
    """The per-class IoU of a test_seg.py report as bars, best first (classes without an IoU left out)."""
    rows = sorted(((name, v['IoU']) for name, v in report['per_class'].items() if v['IoU'] is not None),
                  key=lambda row: row[1], reverse=True)
    fig, axes = figure(1, 1, size=(6.0, max(1.5, 0.18 * len(rows) + 0.8)))
    ax = axes[0, 0]
    ax.barh(range(len(rows)), [iou for _, iou in rows], color='#4878b0')
    ax.set_yticks(range(len(rows)), [name for name, _ in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel('IoU (%)')
    ax.axvline(report['mIoU'], color='#c44e52', lw=1)
    ax.set_title(f'per-class IoU: mIoU {report["mIoU"]:.1f}, aAcc {report["aAcc"]:.1f}', fontsize=9)
    return finished(fig)


def confusion_picture(report: str | Path, top: int = 20) -> np.ndarray:
    """A test_seg.py report's confusion matrix, rows normalised, log scale, the `top` largest confusions beside."""
    classes, matrix = read_confusion(report)
    shares = row_shares(matrix)
    fig, axes = figure(1, 2, size=(6.0, 6.0), width_ratios=(3, 2))
    ax, listing = axes[0]
    scale = matplotlib.colors.LogNorm(vmin=1e-3, vmax=1, clip=True)
    shown = ax.imshow(np.where(shares > 0, shares, np.nan), cmap='viridis', norm=scale, interpolation='nearest')
    ax.set_facecolor('#f0f0f0')  # cells of no pixel
    ax.set_xlabel('predicted class')
    ax.set_ylabel('ground-truth class (rows normalised)')
    if len(classes) <= 40:
        ax.set_xticks(range(len(classes)), classes, rotation=90, fontsize=6)
        ax.set_yticks(range(len(classes)), classes, fontsize=6)
    fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.04, label='share of the row\'s pixels')
    listing.axis('off')
    lines = [f'{truth} -> {predicted}: {share:.1%} ({pixels:,} px)'
             for truth, predicted, share, pixels in top_confusions(classes, matrix, top)]
    listing.text(0, 1, '\n'.join([f'largest confusions (of {len(classes)} classes)', *lines]), va='top', fontsize=7,
                 family='monospace', transform=listing.transAxes)
    accuracy = np.trace(matrix) / max(1, matrix.sum())
    return finished(fig, f'confusion matrix: {Path(report).name}, pixel accuracy {accuracy:.1%}')


def read_annotation(path: str, reduce_zero_label: bool = False, label_map: dict[int, int] | None = None
                    ) -> np.ndarray:
    """A label map as mmseg's LoadAnnotations reads it; a damaged file is a DataError naming it."""
    try:
        with Image.open(path) as annotation:
            labels = np.asarray(annotation).astype(np.int64)
    except Exception as e:  # PIL raises OSError, ValueError, SyntaxError, ... for broken files
        raise DataError(f'cannot read annotation {path}: {type(e).__name__}: {e}') from e
    values, places = np.unique(labels, return_inverse=True)
    loaded = np.array([loaded_value(int(value), reduce_zero_label, label_map) for value in values], np.int64)
    return loaded[places].reshape(labels.shape)


def segmentation_picture(image: np.ndarray, prediction: np.ndarray, classes: Sequence[str],
                         palette: Sequence[Sequence[int]], ground_truth: np.ndarray | None = None,
                         report: dict | None = None, alpha: float = 0.6, with_labels: bool = True,
                         scale: int | None = None) -> np.ndarray:
    """The image, its ground truth (if given) and the prediction side by side, enlarged, the report's IoU bars below."""
    scale = scale or max(1, 256 // image.shape[0])
    image = enlarge(image, scale)  # before drawing, so that the class names are legible
    panels = [titled(image, 'image')]
    if ground_truth is not None:
        panels.append(titled(draw_labels(image, enlarge(ground_truth, scale), classes, palette, alpha, with_labels),
                             'ground truth'))
    panels.append(titled(draw_labels(image, enlarge(prediction, scale), classes, palette, alpha, with_labels),
                         'prediction'))
    picture = side_by_side(panels)
    if report is not None:
        bars = iou_bars(report)
        width = max(picture.shape[1], bars.shape[1])
        picture, bars = (np.pad(p, ((0, 0), (0, width - p.shape[1]), (0, 0)), constant_values=255)
                         for p in (picture, bars))
        picture = np.concatenate([picture, bars])
    return picture
