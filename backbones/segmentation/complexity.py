"""Parameter counts of a segmentation config's model, per part (built on the meta device: no memory, no weights)."""
from __future__ import annotations


import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

from mmseg.registry import MODELS

PARTS = ('backbone', 'neck', 'decode_head', 'auxiliary_head')


def segmentor_parameters(cfg: Config) -> dict[str, int]:
    """{'backbone', 'neck', 'decode_head', 'auxiliary_head', 'total'}: parameter counts (the papers count all)."""
    init_default_scope(cfg.get('default_scope', 'mmseg'))
    model_cfg = cfg.model.copy()
    model_cfg.backbone = {**model_cfg.backbone, 'pretrained': None}
    with torch.device('meta'):
        model = MODELS.build(model_cfg)
    counts = {part: sum(p.numel() for p in getattr(model, part).parameters())
              for part in PARTS if getattr(model, part, None) is not None}
    return {**counts, 'total': sum(p.numel() for p in model.parameters())}
