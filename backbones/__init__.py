"""The suite's model families, registered in timm's registry on import.

    import backbones, timm
    model = timm.create_model('lvvit_s', num_classes=100)      # or backbones.create_model(...)
    backbones.load_checkpoint(model, 'lvvit_s-26M-224-83.3.pth.tar')
"""
from . import cait, lvvit, t2t_vit, vit  # noqa: F401  (importing registers the models)
from .checkpoint import CheckpointError, load_checkpoint
from .registry import create_model, families, suite_models
from .token_labeling import TokenLabelingModel, TokenLabelingOutput

__all__ = [
    'CheckpointError', 'TokenLabelingModel', 'TokenLabelingOutput', 'create_model', 'families', 'load_checkpoint',
    'suite_models',
]
