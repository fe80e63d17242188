"""The LV-ViT segmentation releases (TokenLabeling `v1.1-seg`: `upernet_lvvit_{s,m,l}.pth`), written by the
reference's mmseg 0.x code, in the layout of this suite's UperNet configs: the neck the reference stores inside the
backbone (`backbone.side_layer1..4`) becomes `TokenPyramidNeck`'s `neck.levels.{i}`, the classification model's
keys move under `backbone.model.`; the heads keep mmseg's names."""
from __future__ import annotations

import re

from backbones.common.errors import CheckpointError
from backbones.lvvit import RELEASES

# the release files by the name of the config they load into (seg_configs/NAME.py); torch.hub's entry points
RELEASED_SEGMENTORS = {name: f'{RELEASES}/v1.1-seg/{name}.pth' for name in ('upernet_lvvit_s', 'upernet_lvvit_m',
                                                                         'upernet_lvvit_l')}
_SIDE_LAYER = re.compile(r'^backbone\.side_layer(\d+)\.(\d+)\.(.+)$')
# index in a reference side layer -> the same module in a neck level: with upsampling (six modules), without (three)
_UPSAMPLING_LEVEL = {0: '0', 1: '1', 3: '3.conv', 4: '3.bn'}
_PLAIN_LEVEL = {0: '0.conv', 1: '0.bn'}


def is_mmseg0_release(state_dict: dict[str, object]) -> bool:
    """Whether a segmentor state dict is in the reference's layout (a neck inside the backbone)."""
    return any(key.startswith('backbone.side_layer') for key in state_dict)


def convert_mmseg0_release(state_dict: dict[str, object]) -> dict[str, object]:
    """The state dict in this suite's layout (see the module docstring)."""
    upsampling = {int(m[1]) for key in state_dict if (m := _SIDE_LAYER.match(key)) and int(m[2]) > 2}
    converted = {}
    for key, value in state_dict.items():
        side = _SIDE_LAYER.match(key)
        if side:
            layer, index, rest = int(side[1]), int(side[2]), side[3]
            module = (_UPSAMPLING_LEVEL if layer in upsampling else _PLAIN_LEVEL).get(index)
            if module is None:
                raise CheckpointError(f'{key}: not a parameter of a reference side layer (indices 0, 1, 3, 4)')
            converted[f'neck.levels.{layer - 1}.{module}.{rest}'] = value
        elif key.startswith('backbone.'):
            converted['backbone.model.' + key[len('backbone.'):]] = value
        else:
            converted[key] = value
    return converted
