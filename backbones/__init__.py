"""The suite's model families in timm's registry, their weights, and the model side of token labeling; and
`backbones.dense`, the dense tasks (segmentation, detection, depth) on mmsegmentation and mmengine.

    import backbones
    model = backbones.create_model('lvvit_s', num_classes=100)     # or timm.create_model for the suite's own names
    backbones.load_checkpoint(model, 'lvvit_s-26M-224-83.3.pth.tar')
"""
from backbones import cait, lvvit, t2t_vit, vit  # noqa: F401  (importing registers the models)
from backbones.common.errors import CheckpointError
from backbones.registry import create_model, families, model_family, suite_models
from backbones.token_head import TokenLabelingModel, TokenLabelingOutput, bare_model
from backbones.weights import load_checkpoint

__all__ = [
    'CheckpointError', 'TokenLabelingModel', 'TokenLabelingOutput', 'bare_model', 'create_model', 'families',
    'load_checkpoint', 'model_family', 'suite_models',
]
