"""Backbones for the embedded segmentation set: the same model, pretrained on the embedded classification digits.

Without ImageNet weights on disk, a segmentation config on the digits set starts its backbone from a checkpoint
of the *same* model (same name, same model arguments) trained with token labeling by `tools/train_cls.py` on the
embedded classification data. It is trained on first use (on 2 CPU cores about 6 minutes for LV-ViT-S, 12 for
LV-ViT-M), resumed if that was cut off, and reused afterwards.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from classification.digits import discard_outdated
from classification.fit import BEST, LAST, METRICS

DIGITS_DIR = Path('data/digits')  # tools/train_cls.py's default --digits-dir
DIGITS_BACKBONES = DIGITS_DIR / 'backbones'


def digits_backbone(model_name: str, model_kwargs: Optional[dict] = None) -> Path:
    """`best.pth` of `model_name` pretrained with token labeling on the embedded digits; trained if not on disk."""
    from classification.train import main as train_classifier
    output = DIGITS_BACKBONES / model_name
    discard_outdated(DIGITS_DIR)
    if not (output / METRICS).is_file():
        args = [model_name, '--preset', 'token-labeling', '--output', str(output)]
        if model_kwargs:
            args += ['--model-kwargs', *(f'{k}={v!r}' for k, v in model_kwargs.items())]
        if (output / LAST).is_file():
            args.append('--resume')
        print(f'pretraining {model_name} with token labeling on the embedded digits for the segmentation backbone '
              f'-> {output}', flush=True)
        train_classifier(args)
    return output / BEST


def describe_backbone(checkpoint: Path) -> str:
    """One line saying where a digits-pretrained backbone came from, with its classification result."""
    metrics = json.loads((checkpoint.parent / METRICS).read_text())
    return (f'{metrics["model"]} pretrained on the embedded digits ({metrics.get("preset", "token-labeling")}, '
            f'best val top-1 {metrics["best_top1"]:.1f}% at epoch {metrics["best_epoch"]}) from {checkpoint}')
