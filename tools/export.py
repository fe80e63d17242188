#!/usr/bin/env python
"""Export a classification checkpoint for other tools: safetensors + timm's config.json, optionally torch.export.

    python tools/export.py lvvit_s --checkpoint runs/lvvit_s/best.pth --out exported/lvvit_s --torch-export

    # then, anywhere timm and the suite's models are installed:
    import backbones, timm
    model = timm.create_model('local-dir:exported/lvvit_s', pretrained=True)

The folder holds one weight set: the trained weights, as eval_cls and predict_cls load them, or the EMA copy with
--use-ema (config.json's "suite_weights" says which). Every file is checked against the model's outputs before the
folder is written.
"""
from classification.export import main
from common.cli import run_command

if __name__ == '__main__':
    run_command(main)
