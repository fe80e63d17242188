#!/usr/bin/env python
"""Export a checkpoint for other tools and runtimes; every file checked against the model's outputs first.

    # a classifier: safetensors + timm's config.json, torch.export's program, ONNX
    python tools/export.py classifier lvvit_s --checkpoint runs/lvvit_s/best.pth --out exported/lvvit_s \\
        --torch-export --onnx
    # then, wherever timm and the suite are installed:  import backbones, timm
    #     model = timm.create_model('local-dir:exported/lvvit_s', pretrained=True)

    # a segmentor: safetensors + its config + export.json; torch.export and ONNX of its test window's forward
    python tools/export.py segmentor seg_configs/upernet_lvvit_m.py work_dirs/upernet_lvvit_m/iter_160000.pth \\
        --out exported/upernet_lvvit_m --onnx

A classifier's folder holds one weight set: the trained weights, as eval_cls and predict_cls load them, or the EMA
copy with --use-ema (config.json's "suite_weights" says which). classification/export.py and
backbones/dense/export.py say what each file holds.
"""
from backbones.common.commands import run_command
from classification.digits.seg_data import EmbeddedPages
from classification.export import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__, fallback=EmbeddedPages))
