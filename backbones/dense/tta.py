"""The test-time augmentation every dense task shares: `MirroredViewsTTAModel`, mmengine's `BaseTTAModel` over one
pipeline view per scale (the config's `tta_pipeline`), each view decoded with its mirror image in one batch when
`flip` is on; a task's subclass merges the views' predictions (`merge_preds`), each already back at the original
image's size, a mirror image's sample marked flipped (undone by `merge_preds` where the model does not undo it)."""
from __future__ import annotations

import copy

from mmengine.config import Config
from mmengine.model import BaseTTAModel
from mmengine.structures import BaseDataElement

from backbones.common.errors import UsageError
from backbones.dense.layouts import SmallDenseData


def mirror_image(view: dict) -> dict:
    """A test batch's horizontal mirror image, flipped before the preprocessor pads it, its samples marked flipped."""
    samples = view['data_samples']
    if any(sample.metainfo.get('flip') for sample in samples):
        raise UsageError('the test-time pipeline already flips its views, and the tta_model (flip=True) mirrors '
                         'them again: drop the flip from tta_pipeline, or set tta_model.flip=False')
    return {'inputs': [image.flip(-1) for image in view['inputs']],
            'data_samples': [type(sample)(metainfo={**sample.metainfo, 'flip': True, 'flip_direction': 'horizontal'})
                             for sample in samples]}


def mirrored(view: dict) -> dict:
    """A test batch and its mirror image as one batch."""
    mirror = mirror_image(view)
    return {key: [*view[key], *mirror[key]] for key in ('inputs', 'data_samples')}


class MirroredViewsTTAModel(BaseTTAModel):
    """The config's views of each image (one per scale, mirrored where `flip`), merged by `merge_preds`."""

    def __init__(self, flip: bool = True, **kwargs) -> None:
        super().__init__(**kwargs)
        self.flip = flip

    def view_predictions(self, data: dict) -> list[list[BaseDataElement]]:
        """The predictions of every view (each followed by its mirror image's, with `flip`), before merging."""
        predictions = []
        for i in range(len(data['inputs'])):
            view = {key: value[i] for key, value in data.items()}
            count = len(view['inputs'])
            samples = self.module.test_step(mirrored(view) if self.flip else view)
            predictions += [samples[:count]] + ([samples[count:]] if self.flip else [])
        return predictions

    def test_step(self, data: dict) -> list[BaseDataElement]:
        return self.merge_preds(list(zip(*self.view_predictions(data))))


def drop_tta_flips(cfg: Config) -> None:
    """Test at every scale of the multi-scale test without the mirror images."""
    cfg.tta_model['flip'] = False


def flipping_tta_pipeline(pipeline: list) -> list:
    """mmseg's multi-scale + flip test, for comparison: every scale flipped by the pipeline (ten views)."""
    pipeline = copy.deepcopy(pipeline)
    tta = next(step for step in pipeline if step['type'] == 'TestTimeAug')
    tta['transforms'].insert(1, [dict(type='RandomFlip', prob=0.0, direction='horizontal'),
                                 dict(type='RandomFlip', prob=1.0, direction='horizontal')])
    return pipeline


def tta_flips(cfg: Config) -> bool:
    """Whether the multi-scale test adds each scale's mirror image."""
    return bool(cfg.tta_model.get('flip', False))


def tta_scales(pipeline: list) -> list[dict]:
    """The Resize steps of a test-time pipeline's TestTimeAug, one a scale."""
    tta = next((step for step in pipeline if step['type'] == 'TestTimeAug'), None)
    return [step for step in tta['transforms'][0] if step['type'] == 'Resize'] if tta else []


def test_mode(cfg: Config, multi_scale: bool) -> str:
    """A test's mode in words: 'single-scale', 'multi-scale + flip', 'single-scale + flip' (the depth papers')."""
    if not multi_scale:
        return 'single-scale'
    scales = 'multi-scale' if len(tta_scales(cfg.tta_pipeline)) > 1 else 'single-scale'
    return scales + (' + flip' if tta_flips(cfg) else '')


def check_tta_settings(cfg: Config) -> None:
    """--ms (--tta) takes the config's `tta_pipeline` and `tta_model`: one line if it lacks either."""
    missing = [key for key in ('tta_pipeline', 'tta_model') if not cfg.get(key)]
    if missing:
        raise UsageError(f'--ms (--tta) tests with the config\'s {" and ".join(missing)}, which it does not set '
                         f'(each task\'s test-time settings: see seg_configs/_base_/datasets)')


def use_small_test_time(cfg: Config, data: SmallDenseData) -> None:
    """A small data set's multi-scale test at `data.test_ratios`, no mirror images unless `data.mirrored`."""
    if cfg.get('tta_model') and not data.mirrored:
        drop_tta_flips(cfg)
    if cfg.get('tta_pipeline'):
        size = next(step['scale'] for step in cfg.test_dataloader.dataset.pipeline if step['type'] == 'Resize')
        tta = next(step for step in cfg.tta_pipeline if step['type'] == 'TestTimeAug')
        tta['transforms'][0] = [dict(type='Resize', scale=(round(size[0] * r), round(size[1] * r)), keep_ratio=True)
                                for r in data.test_ratios]
