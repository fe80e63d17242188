#!/usr/bin/env python
"""Throughput and peak memory of a model: inference forward and a full training step (forward, loss, backward, AdamW).

    python tools/benchmark.py lvvit_s [--batch-size 32] [--img-size 224] [--device cuda] [--amp bf16]
    python tools/benchmark.py t2t_vit_14 --compare-unfused         # also explicit-softmax attention, with ratios
    python tools/benchmark.py lvvit_s --compare-grad-checkpointing # also with gradient checkpointing, with ratios
    python tools/benchmark.py deit_small_patch16_224 --teacher regnety_160   # also DeiT's hard distillation

Each configuration is measured in a fresh process, so that peak memory does not carry over: the accelerator's peak
allocation on CUDA, the process's peak resident size on CPU. Times come from `torch.utils.benchmark.Timer`.
"""
from backbones.common.commands import run_command
from classification.studies.model_benchmark import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__))
