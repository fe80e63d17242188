"""`DepthReport`: mmseg's DepthMetric (per-image delta < 1.25, AbsRel, RMSE, log10, ..., averaged over images) with
its faults mended: KITTI's SILog (mmseg's is `silog_mmseg`), predictions clipped to the evaluated range, explicit
metric lists, images without a valid pixel left out and counted, NYU's crop refused on other sizes and KITTI's Garg
crop beside it; predictions written as whole 16-bit PNGs in the data set's scale (NAME.png: the sample's
`pred_name`, else its image's name). With `json_file` the figures go there too."""
from __future__ import annotations

import os.path as osp
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from mmengine.dist import is_main_process
from mmseg.evaluation.metrics import DepthMetric
from mmseg.registry import METRICS
from PIL import Image

from backbones.common.errors import DataError, UsageError
from backbones.common.files import write_atomic, write_json_atomic
from backbones.common.log import logger

NYU_SIZE = (480, 640)  # the size NYU's evaluation crop (rows 45..470, columns 41..600) is written for
# KITTI's evaluation crop (Garg et al. 2016), as fractions of the map: rows top, bottom; columns left, right. The
# depth papers (BTS, AdaBins, DPT's successors) cut at int(fraction x size), as here.
GARG_CROP = (0.40810811, 0.99189189, 0.03594771, 0.96405229)
CROP_TYPES = (None, 'nyu_crop', 'garg_crop')
UINT16_MAX = 65535


def garg_crop_mask(shape: tuple[int, int], device: torch.device | None = None) -> torch.Tensor:
    """The pixels of a `shape` (height, width) depth map inside KITTI's Garg crop."""
    height, width = shape
    top, bottom, left, right = GARG_CROP
    mask = torch.zeros(shape, dtype=torch.bool, device=device)
    mask[int(top * height):int(bottom * height), int(left * width):int(right * width)] = True
    return mask


def depth_png(depth: np.ndarray, scale: float) -> np.ndarray:
    """Metres as a 16-bit map of `scale` units per metre, rounded, clipped to what 16 bits hold."""
    return np.clip(np.round(depth * scale), 0, UINT16_MAX).astype(np.uint16)


def write_depth_png(path: str | Path, depth: np.ndarray, scale: float) -> None:
    """A depth map (metres) written atomically as a 16-bit PNG of `scale` units per metre (`depth_png`)."""
    image = Image.fromarray(depth_png(depth, scale))
    write_atomic(path, lambda f: image.save(f, format='PNG'))


@METRICS.register_module()
class DepthReport(DepthMetric):
    """DepthMetric, mended; `depth_metrics`: some of METRICS (default: all); `crop_type`: None, 'nyu_crop', ..."""

    default_prefix = None
    # mmseg's figures, and two names of the scale-invariant log error: `silog` the KITTI benchmark's and BTS's,
    # 100 sqrt(mean d^2 - mean(d)^2) of d = log(pred) - log(truth); `silog_mmseg` mmseg's, sqrt(mean d^2 -
    # 0.5 mean(d)^2) (Eigen et al.'s training loss, lambda 0.5), which mmseg 1.2.2 reports as `silog`
    METRICS = (*DepthMetric.METRICS, 'silog_mmseg')

    def __init__(self, depth_metrics: Sequence[str] | None = None, json_file: str | None = None,
                 crop_type: str | None = None, **kwargs) -> None:
        if crop_type not in CROP_TYPES:
            raise UsageError(f'DepthReport: crop_type is one of {", ".join(map(str, CROP_TYPES))}; got {crop_type!r}')
        # mmseg's DepthMetric knows NYU's crop only: KITTI's is applied here (`_get_eval_mask`)
        super().__init__(crop_type=None if crop_type == 'garg_crop' else crop_type, **kwargs)
        self.crop_type = crop_type
        if depth_metrics is not None:
            unknown = [m for m in depth_metrics if m not in self.METRICS]
            if isinstance(depth_metrics, str) or unknown or not depth_metrics:
                raise UsageError(f'DepthReport: depth_metrics is a list of {", ".join(self.METRICS)}; got '
                                 f'{depth_metrics!r}')
            self.metrics = tuple(depth_metrics)
        self.json_file = json_file

    def process(self, data_batch: dict, data_samples: Sequence[dict]) -> None:
        for sample in data_samples:
            predicted = sample['pred_depth_map']['data'].squeeze()
            if self.output_dir is not None:
                # a data set whose image names repeat across folders (KITTI's frame numbers, per drive) names each
                name = sample.get('pred_name') or osp.splitext(osp.basename(sample['img_path']))[0]
                write_depth_png(osp.join(self.output_dir, f'{name}.png'), predicted.cpu().numpy(),
                                self.depth_scale_factor)
            if self.format_only:
                continue
            truth = sample['gt_depth_map']['data'].squeeze().to(predicted)
            if self.crop_type == 'nyu_crop' and tuple(truth.shape) != NYU_SIZE:
                raise DataError(f'{sample["img_path"]}: NYU\'s evaluation crop (crop_type="nyu_crop") is written for '
                                f'{NYU_SIZE[1]}x{NYU_SIZE[0]} depth maps, this one is {truth.shape[1]}x'
                                f'{truth.shape[0]}; set crop_type=None')
            mask = self._get_eval_mask(truth)
            # as BTS's evaluation: the prediction clipped to the range scored (a depth of 0 has no logarithm)
            scored = predicted[mask].clamp(self.min_depth_eval, self.max_depth_eval)
            # one entry per image, an empty one too: mmengine gathers the processes' results by position
            self.results.append((truth[mask], scored) if mask.any() else None)

    def _get_eval_mask(self, gt_depth: torch.Tensor) -> torch.Tensor:
        """mmseg's mask (depth within min_depth_eval .. max_depth_eval, NYU's crop), within Garg's crop when asked."""
        mask = super()._get_eval_mask(gt_depth)
        if self.crop_type == 'garg_crop':
            mask &= garg_crop_mask(tuple(gt_depth.shape), gt_depth.device)
        return mask

    @staticmethod
    def _calc_all_metrics(gt_depth: torch.Tensor, pred_depth: torch.Tensor) -> dict[str, float]:
        """One image's figures: mmseg's, its `silog` as `silog_mmseg`, and the benchmark's `silog` (see METRICS)."""
        figures = DepthMetric._calc_all_metrics(gt_depth, pred_depth)
        figures['silog_mmseg'] = figures.pop('silog')
        d = torch.log(pred_depth.double()) - torch.log(gt_depth.double())
        figures['silog'] = 100 * torch.sqrt(((d ** 2).mean() - d.mean() ** 2).clamp(min=0)).item()
        return figures

    def compute_metrics(self, results: list) -> dict[str, float]:
        if self.format_only:
            return super().compute_metrics(results)
        scored = [result for result in results if result is not None]
        empty = len(results) - len(scored)
        if empty:
            logger.warning(f'warning: {empty} image(s) hold no valid depth pixel (between {self.min_depth_eval} and '
                           f'{self.max_depth_eval} m): left out of the means')
        if not scored:
            raise DataError('no test image holds a valid depth pixel: nothing to score')
        metrics = super().compute_metrics(scored)
        if self.json_file and is_main_process():
            Path(self.json_file).parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.json_file, {**metrics, 'images': len(scored), 'left_out': empty})
        return metrics
