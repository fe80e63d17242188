#!/usr/bin/env python
"""Train a model on ImageNet (or the embedded digits data) with its paper recipe.

    python tools/train_cls.py lvvit_s                                   # embedded digits run, a few minutes on CPU
    torchrun --nproc-per-node 8 tools/train_cls.py lvvit_s --data-dir /data/imagenet \\
        --token-label-dir /data/imagenet_token_labels --output runs/lvvit_s
    python tools/train_cls.py t2t_vit_14 --data-dir /data/imagenet      # vanilla recipe (mixup/cutmix)

An interrupted run continues with the same command plus --resume. The recipe's values are the model's paper
preset, printed at start; each has its option below.
"""
from backbones.common.commands import run_command
from classification.digits.cls_data import EmbeddedScans
from classification.train import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__, default_data=EmbeddedScans))
