#!/usr/bin/env python
"""Top-k classes of new images with a classification checkpoint, by name (one line per image; --json for a file).

    python tools/predict_cls.py lvvit_s --checkpoint runs/lvvit_s/best.pth photos/ --topk 3
    python tools/predict_cls.py lvvit_s --checkpoint lvvit_s-26M-224-83.3.pth.tar cat.jpg --json cat.json

The images take the checkpoint's eval transform and its eval-mode prediction, as in tools/eval_cls.py. From Python:
`classification.predict.ClassPredictor(model, checkpoint)(paths, k)`.
"""
from backbones.common.commands import run_command
from classification.predict import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__))
