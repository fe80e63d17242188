#!/usr/bin/env python
"""Speed of CIFAR transfer: the real training step of `tools/transfer_cifar.py` (on-device upsampling and
augmentation, classifier and backbone groups, SGD, cosine), evaluation, the projected time of the paper's 60-epoch
run, and the on-device input pipeline against the reference tool's per-image torchvision/PIL transforms.

    python tools/benchmark_transfer.py                               # T2T-ViT-14 and LV-ViT-S, CPU
    python tools/benchmark_transfer.py t2t_vit_14 --device cuda --batch-size 64 --steps 50
"""
from backbones.common.commands import run_command
from classification.studies.transfer_benchmark import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__))
