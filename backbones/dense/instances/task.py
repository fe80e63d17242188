"""Instance segmentation and detection as a dense task: COCO's box and mask AP, the instances of new images in one
COCO-format file (drawn over each image if asked), the categories the checkpoint was trained on, and an export of
the whole detector with static shapes (`static_detection.StaticMaskRCNN`: its best K detections, padded), or of its
feature pyramid alone."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn as nn
from mmengine.config import Config

from backbones.common.drawing import enlarge, write_png
from backbones.common.errors import UsageError
from backbones.common.files import write_json_atomic
from backbones.common.log import logger
from backbones.dense.data_check import PairCheck, image_check
from backbones.dense.instances.coco import CocoLayout, use_coco_categories, use_test_categories, use_trained_categories
from backbones.dense.instances.detector import MASK_THRESHOLD
from backbones.dense.instances.metric import coco_results
from backbones.dense.instances.transforms import decode_mask
from backbones.dense.masks import INSTANCES, OVERLAY_TAIL
from backbones.dense.pictures import side_by_side, titled
from backbones.dense.predict import SegPredictor
from backbones.dense.tasks import (
    DenseTask,
    ExportChoice,
    ExportedNetwork,
    PredictionRequest,
    SmallDenseData,
    register_task,
    small_datasets,
    synthetic_image,
)
from backbones.dense.tta import use_small_test_time

INSTANCES_PER_IMAGE = 7  # a synthetic image's: COCO's mean is 7.3 a training image
# A detector's pyramid and heads on a small data set, sized for minutes on 2 CPU cores (ViTDet's 256-channel heads
# on 512 regions per image take 45 s an iteration there): 64-channel pyramid and heads, 64 sampled regions per
# image, fewer proposals.
SMALL_DATA_MODEL = dict(neck=dict(out_channels=64), fc_channels=256, roi_heads=dict(batch_size_per_image=64),
                        rpn=dict(pre_nms_top_n=dict(training=300, testing=300),
                                 post_nms_top_n=dict(training=100, testing=100)))

# ViTDet's 14-token windows take 14/64 of the grid of a 1024 px image; the pages' grid is 10x4 tokens (144x48 px
# padded to 32, stride 16), which 14-token windows would cover whole: a config with windows gets 3-token windows on
# them, 4x2 windows a page.
SMALL_DATA_WINDOW = 3


@register_task
class Instances(DenseTask):
    name = 'instances'
    title = 'detection'
    model_kind = 'detector'
    models = ('TokenMaskRCNN', 'TokenCascadeMaskRCNN')
    head_weights = 'roi_heads.'  # torchvision's RoI heads
    multi_scale = True
    summary_keys = ('box_AP', 'box_AP50', 'mask_AP', 'mask_AP50')
    outputs_per_image = False  # --pred-dir gets one COCO results file
    classes_from_checkpoint = True  # the categories trained on, with their ids
    macs_counted = False  # its work depends on the proposals its image yields
    predictions_fit = 'instances fit'
    export_output = ('the best top_k detections of each image, best first: boxes (batch, top_k, 4) in input pixels '
                     '(x1, y1, x2, y2), scores (batch, top_k), labels (batch, top_k; the index into classes), masks '
                     '(batch, top_k, H, W), each instance\'s probability per pixel of the input (an instance\'s '
                     f'pixels: {MASK_THRESHOLD} or more); the model\'s predict on an image that fills the input')
    # its heads start from random weights and learn at a higher lr for longer, on fewer images a batch (with the
    # config's layer-wise lr decay, the backbone's lr shrinks towards its input)
    usual_image = (640, 480)  # COCO's
    annotation_steps = ('LoadInstances',)
    small_schedule = dict(iters=400, lr=5e-4, batch_size=8, val_interval=400, checkpoint_interval=200)

    def resolve_classes(self, cfg: Config, roots: set[str], checkpoint: str | None, embedded: bool) -> None:
        """The class count: a trained checkpoint's (its test set's categories the same), else the training set's."""
        if checkpoint is None:
            use_coco_categories(cfg)
        else:
            use_test_categories(cfg, checkpoint)

    def use_trained_classes(self, cfg: Config, checkpoint: str) -> None:
        use_trained_categories(cfg, checkpoint)

    def use_small_data(self, cfg: Config, data: SmallDenseData) -> None:
        """The instances in COCO's format, jitter and test size the images' own, the multi-scale test's ratios."""
        for dataset in small_datasets(cfg, data, CocoLayout()):
            for step in dataset['pipeline']:
                if step['type'] == 'LargeScaleJitter':
                    step.update(size=data.image_size, scale_range=data.ratio_range)
                if step['type'] == 'Resize':
                    step['scale'] = data.image_size
        use_small_test_time(cfg, data)

    def use_small_model(self, cfg: Config) -> None:
        cfg.merge_from_dict(dict(model=SMALL_DATA_MODEL))
        if cfg.model.backbone.get('window_size'):
            cfg.model.backbone.window_size = SMALL_DATA_WINDOW

    def loaded_sample(self, rng: np.random.Generator, width: int, height: int) -> dict:
        """The image and INSTANCES_PER_IMAGE instances: boxes, labels, and masks (each an ellipse filling its box)."""
        corners = np.sort(rng.uniform(0, 1, (INSTANCES_PER_IMAGE, 2, 2)), axis=1)  # (instance, corner, x|y)
        boxes = (corners.reshape(-1, 4) * np.float32([width, height, width, height])).astype(np.float32)
        boxes[:, 2:] = np.minimum(np.maximum(boxes[:, 2:], boxes[:, :2] + 8), [width, height])  # >= 8 px if room
        masks = np.zeros((INSTANCES_PER_IMAGE, height, width), np.uint8)
        ys, xs = np.mgrid[:height, :width]
        for mask, (x0, y0, x1, y1) in zip(masks, boxes):
            centre_x, centre_y, half_w, half_h = (x0 + x1) / 2, (y0 + y1) / 2, (x1 - x0) / 2, (y1 - y0) / 2
            mask[((xs - centre_x) / half_w) ** 2 + ((ys - centre_y) / half_h) ** 2 <= 1] = 1
        return {**synthetic_image(rng, width, height), 'height': height, 'width': width, 'gt_bboxes': boxes,
                'gt_labels': rng.integers(0, 80, INSTANCES_PER_IMAGE), 'gt_masks': masks}

    def check_entry(self, entry: dict, num_classes: int) -> PairCheck:
        """The image decodes at the size its annotation file says."""
        return PairCheck(image_check(entry['img_path'], (entry['width'], entry['height'])))

    def test_evaluator(self, cfg: Config, out: str | None, pred_dir: str | None) -> dict:
        return dict(type='CocoAP', json_file=out, predictions_dir=pred_dir)

    def write_predictions(self, predictor: SegPredictor, request: PredictionRequest) -> list[Path]:
        """The instances scoring the threshold or more as one COCO-format file; with overlays, drawn over each image."""
        path = request.out / INSTANCES
        content = dict(images=[], annotations=[],
                       categories=[dict(id=i, name=n) for i, n in zip(predictor.cat_ids, predictor.classes)])
        for image_id, (image, picture) in enumerate(zip(request.images, request.paths), start=1):
            try:
                pixels, sample = predictor.predict(image)
            except BaseException:
                if content['images']:  # the instances found so far are kept
                    write_json_atomic(path, content)
                    logger.warning(f'warning: stopped at {image}: the instances of the {len(content["images"])} '
                                   f'image(s) before it are in {path}')
                raise
            found = sample.pred_instances[sample.pred_instances.scores >= request.score_threshold]
            content['images'].append(dict(id=image_id, file_name=str(image), height=pixels.shape[0],
                                          width=pixels.shape[1]))
            areas = found.masks.flatten(1).sum(1).tolist()
            for entry, area in zip(coco_results(image_id, found, predictor.cat_ids), areas):
                content['annotations'].append(dict(entry, id=len(content['annotations']) + 1, iscrowd=0,
                                                   area=float(area)))
            if request.overlay:
                write_png(draw_instances(pixels, found.bboxes.cpu().numpy(), found.labels.tolist(),
                                         found.masks.cpu().numpy(), predictor.classes, predictor.palette,
                                         found.scores.tolist()), picture.with_name(f'{picture.stem}{OVERLAY_TAIL}'))
            names = [predictor.classes[label] for label in found.labels.tolist()]
            logger.info(f'{image}: {len(names)} instance(s)' + (f' ({", ".join(names[:8])})' if names else ''))
        write_json_atomic(path, content)
        logger.info(f'instances of {len(request.images)} image(s) -> {path}')
        return [path]

    def picture(self, predictor: SegPredictor, entry: dict, alpha: float, score_threshold: float,
                report: str | None, with_labels: bool) -> np.ndarray:
        """The instances scoring `score_threshold` or more over the image, beside the entry's ground truth."""
        pixels, sample = predictor.predict(entry['img_path'])
        scale = max(1, 256 // pixels.shape[0])
        big = enlarge(pixels, scale)

        def drawn(boxes, labels, masks, scores=None):
            masks = np.stack([enlarge(m.astype(np.uint8), scale) for m in masks]).astype(bool) if len(masks) \
                else np.zeros((0, *big.shape[:2]), bool)
            return draw_instances(big, np.asarray(boxes, np.float64).reshape(-1, 4) * scale, list(labels), masks,
                                  predictor.classes, predictor.palette, scores, alpha)

        panels = [titled(big, 'image')]
        found = sample.pred_instances[sample.pred_instances.scores >= score_threshold]
        if entry.get('instances') is not None:
            truth = [i for i in entry['instances'] if not i['ignore_flag']]
            height, width = pixels.shape[:2]
            panels.append(titled(drawn([i['bbox'] for i in truth], [i['bbox_label'] for i in truth],
                                       [decode_mask(i['mask'], height, width) for i in truth]), 'ground truth'))
        panels.append(titled(drawn(found.bboxes.cpu().numpy(), found.labels.tolist(), found.masks.cpu().numpy(),
                                   found.scores.tolist()), f'prediction (score >= {score_threshold:g})'))
        return side_by_side(panels)

    def check_export_choice(self, choice: ExportChoice, config: str) -> None:
        """A detector takes --top-k or --pyramid-only; its whole export is at one size."""
        if choice.dynamic_size and not choice.pyramid_only:
            raise UsageError('--dynamic-size: a whole detector is exported at one input size (its proposals per '
                             'level and its pasted masks are sized by it): give --size H W')

    def exported_network(self, model: nn.Module, choice: ExportChoice) -> ExportedNetwork:
        """The whole detector, its `choice.top_k` best detections padded, or the backbone and pyramid."""
        if choice.pyramid_only:
            # torch.export fixes a level of one pixel: the coarsest (p6, pooled from p5) must be two or more
            coarsest = 2 * round(model.neck.strides[-1])
            return ExportedNetwork(PyramidFeatures(model), list(model.neck.names),
                                   {'network': 'pyramid', 'output': PYRAMID_OUTPUT}, least_side=coarsest + 1)
        check_top_k(model, choice.top_k)
        detector = model.static_network(model, choice.top_k)
        return ExportedNetwork(detector, list(detector.output_names), {
            'network': 'detector', 'top_k': detector.top_k, 'inputs': list(detector.input_names),
            'image_sizes': IMAGE_SIZES, 'outputs': list(detector.output_names), 'output': self.export_output,
            'padding': 'fewer than top_k detections: the rest have label -1, score 0, a zero box and a zero mask',
            'candidates': f'NMS of the RoI heads over the {detector.candidates} best class candidates per image '
                          '(the model: all scoring above its score threshold); the same detections whenever top_k of '
                          'them survive NMS or no more score above the threshold'},
            input_names=detector.input_names, other_inputs=example_sizes)

    def input_stride(self, model: nn.Module, size: tuple[int, int]) -> int:
        """The detector's padding (32 px: the pyramid's levels halve exactly), which a fixed size is a multiple of."""
        stride = max(model.backbone.stride, model.data_preprocessor.pad_size_divisor)
        if size[0] % stride or size[1] % stride:
            raise UsageError(f'--size {size[0]} {size[1]}: the detector reads images padded to multiples of {stride} '
                             f'px (its data preprocessor): export it at such a size')
        return stride

    def export_facts(self, predictor: SegPredictor) -> dict:
        return {'classes': predictor.classes, 'category_ids': predictor.cat_ids,
                'levels': list(predictor.model.neck.names)}


def check_top_k(model: nn.Module, top_k: int | None) -> None:
    """A --top-k above the detections the detector can give is refused (the rest would be padding)."""
    proposals = model.rpn._post_nms_top_n['testing']  # the test's count (post_nms_top_n() reads the mode)
    most = proposals * model.num_classes
    if top_k is not None and top_k > most:
        raise UsageError(f'--top-k {top_k}: the detector gives at most {most} detections an image (its RPN\'s '
                         f'{proposals} proposals x {model.num_classes} classes); give {most} or fewer')


IMAGE_SIZES = ('(batch, 2) int64: each image\'s height and width; an image smaller than the input lies at its top '
               'left, the rest zeros (after normalising), and its detections are the model\'s test of it')


def example_sizes(images: torch.Tensor) -> tuple[torch.Tensor]:
    """`image_sizes` for a batch of example `images`: the first fills the input, the others are smaller."""
    height, width = images.shape[-2:]
    sizes = [(height, width), (height - height // 4, width), (height, width - width // 3)]
    return torch.tensor([sizes[number % len(sizes)] for number in range(len(images))], dtype=torch.int64),


PYRAMID_OUTPUT = ('the feature pyramid\'s levels (batch, channels, H / stride, W / stride), finest first; the RPN and '
                  'RoI heads are in model.safetensors with config.py (torchvision\'s batched_nms keeps a number of '
                  'boxes that depends on the image: the whole detector\'s export keeps its best top_k)')


class PyramidFeatures(nn.Module):
    """A detector's backbone and feature pyramid: its levels, finest first."""

    def __init__(self, detector: nn.Module) -> None:
        super().__init__()
        self.detector = detector

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.detector.extract_feat(images).values())


def draw_instances(image: np.ndarray, boxes: np.ndarray, labels: Sequence[int], masks: np.ndarray,
                   classes: Sequence[str], palette: Sequence[Sequence[int]], scores: Sequence[float] | None = None,
                   alpha: float = 0.5) -> np.ndarray:
    """Instances over an RGB image: masks in their category's colour (opacity `alpha`), boxes, names and scores."""
    drawn = image.copy()
    for mask, label in zip(masks, labels):
        colour = np.array(palette[label], np.float32)
        drawn[mask] = (drawn[mask] * (1 - alpha) + colour * alpha).astype(np.uint8)
    for i, (box, label) in enumerate(zip(boxes, labels)):
        x1, y1, x2, y2 = (int(round(v)) for v in box)
        colour = tuple(int(c) for c in palette[label])
        cv2.rectangle(drawn, (x1, y1), (max(x1, x2 - 1), max(y1, y2 - 1)), colour, 1)
        text = classes[label] + (f' {scores[i]:.2f}' if scores is not None else '')
        cv2.putText(drawn, text, (x1 + 1, max(8, y1 - 2)), cv2.FONT_HERSHEY_SIMPLEX, 0.3, colour, 1, cv2.LINE_AA)
    return drawn
