#!/usr/bin/env python
"""Top-1 / top-5 of a classification checkpoint on an ImageNet-layout split, with its eval transform (the input size,
crop and normalisation the checkpoint's run recorded, else the model's own).

    python tools/eval_cls.py lvvit_s --checkpoint lvvit_s-26M-224-83.3.pth.tar --data-dir /data/imagenet
    python tools/eval_cls.py lvvit_s --checkpoint runs/lvvit_s/best.pth --data-dir /data/imagenet --real-labels

Models with a token head (LV-ViT, or any model trained here with token labeling) predict with the paper's rule:
class logits + 0.5 x the class-wise max over the token logits.
"""
from backbones.common.commands import run_command
from classification.evaluate import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__))
