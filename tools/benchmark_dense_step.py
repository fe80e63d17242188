#!/usr/bin/env python
"""Mask R-CNN's training step with ViTDet's window attention, with and without its relative positions, against
global attention (or, with --compare frozen, UperNet's step on a frozen backbone and DINOv2's linear head on it
against UperNet fine-tuning it): the time a step takes and its peak memory, each in a fresh process, and their ratios.

    python tools/benchmark_dense_step.py                                   # 512 px, one image a step, CPU
    python tools/benchmark_dense_step.py --json docs/results/dense_windows_cpu2_COMMIT.json
    python tools/benchmark_dense_step.py --compare frozen --size 512 --batch-size 2

The detector is seg_configs/maskrcnn_lvvit_s.py against seg_configs/maskrcnn_lvvit_s_windowed.py (14-token windows,
4 global blocks, relative positions) and the same without relative positions, random weights, on batches its own
training pipeline made from synthetic images (COCO's usual size times --size / 1024). Peak memory: the device's on a
GPU; on a CPU the process's resident memory above what it held before the first step. The GPU script
(tools/measure_gpu.py) measures the same at 1024 px in its dense_windows stage.
"""
from backbones.common.commands import run_command
from classification.studies.dense.training_step import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__))
