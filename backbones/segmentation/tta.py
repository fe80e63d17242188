"""The test-time augmentation every dense task shares: `MirroredViewsTTAModel`, mmengine's `BaseTTAModel` over one
pipeline view per scale (the config's `tta_pipeline`), each view decoded with its mirror image in one batch when
`flip` is on. A task's subclass merges the views' predictions its own way (`merge_preds`): the segmentors average
their softmax, the depth models their depth, the detectors keep their instances by NMS.

Each view goes back to the original image before it is merged: the model's own post-processing resamples every
scale to the original size; a mirror image's sample is marked flipped (`flip`, `flip_direction`), which mmseg's
segmentors and depth estimators undo themselves and a task's `merge_preds` undoes where its model does not.
"""
from __future__ import annotations

from mmengine.model import BaseTTAModel
from mmengine.structures import BaseDataElement

from backbones.common.errors import UsageError


def mirror_image(view: dict) -> dict:
    """A test batch's horizontal mirror image: inputs flipped (before the data preprocessor pads them, so that the
    padding stays at the right), samples of the same type holding the meta data, marked flipped."""
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
    """The config's views of each image (one per scale), each with its mirror image where `flip`; the predictions
    of every image's views go to `merge_preds` together (the unflipped view of the first scale first)."""

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
