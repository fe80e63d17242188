#!/usr/bin/env python
"""k-NN and linear probes of a model's frozen features, as DINOv2 evaluates its backbones: features extracted once
with the eval transform, a weighted k-NN vote (k 10, 20, 100, 200; T 0.07) and a grid of linear heads (13 learning
rates x the last block's or last 4 blocks' class tokens, with or without the mean patch token), k and the head chosen
on a held-out 10% of each class of the training split, then evaluated on --split (docs/frozen_features.md).

    python tools/probe_features.py deit_tiny_patch16_224                   # the embedded digits, random weights
    python tools/probe_features.py deit_small_patch16_224 --pretrained --data-dir /data/imagenet --epochs 10
    python tools/probe_features.py lvvit_s --checkpoint runs/lvvit_s/best.pth --data-dir /data/flowers

Writes the results (per-k and per-head held-out accuracies, the chosen ones and their test accuracies) to --json.
"""
from backbones.common.commands import run_command
from classification.digits.cls_data import EmbeddedScans
from classification.probes import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__, default_data=EmbeddedScans))
