#!/usr/bin/env python
"""Segmentation speed: evaluation images/s single-scale vs multi-scale + flip (against the sum of its ten single
passes, and mmseg's way), and training iterations/s.

    python tools/benchmark_seg.py                                   # UperNet + LV-ViT-S, CPU, the digits' scale
    python tools/benchmark_seg.py --device cuda --full-size --json bench.json

Runs the config's real pipelines and model (random weights) on the embedded digits set: at the embedded set's
scale by default (48/512 of ADE20K's sizes), or with --full-size at ADE20K's (images resized to 512 pixels on the
short side, 512 crops). The multi-scale + flip test runs with flips whatever the data set (the digits' own test
has none), four ways: the suite's (each scale and its mirror image one batch, windows in batches), the same window
by window (`window_batch=1`), mmseg's (the pipeline makes the ten views, run one by one), and as its ten single
passes, each view a single-scale test, whose summed time is the baseline of `ms_flip_cost_over_single_passes`.
"""
from backbones.common.commands import run_command
from classification.studies.dense.segmentation_speed import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__))
