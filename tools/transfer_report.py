#!/usr/bin/env python
"""A classifier's transfer battery in one command: DINOv2's frozen-feature protocols (k-NN and linear probes, linear
segmentation "lin." and "+ms", linear depth "lin. 1" and "lin. 4", DPT on the frozen encoder) and, by name, the
fine-tuned ones (UperNet, Mask R-CNN, DPT), each a stage a rerun does not redo; one results file, a Markdown table
and a bar chart (docs/frozen_features.md).

    python tools/transfer_report.py lvvit_s               # the embedded data, LV-ViT-S pretrained on the scans
    python tools/transfer_report.py runs/lvvit_s/best.pth --protocols knn linear seg-linear \\
        --data knn=/data/imagenet seg-linear=/data/ade/ADEChallengeData2016
    python tools/transfer_report.py lvvit_s --pretrained --protocols upernet depth-dpt

A stopped report continues with the same command: the finished stages are kept, a stopped training goes on.
"""
from backbones.common.commands import run_command
from classification.studies.transfer_report import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__))
