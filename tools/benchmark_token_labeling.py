#!/usr/bin/env python
"""What token labeling costs, measured against baselines in the same run.

1. train step: token labeling (target building, token head, MixToken, loss) vs plain cross-entropy, same model
   and batch, any model (`--model resnet50`: a CNN, its token grid the last feature map);
2. target builder: our batched builder vs a straightforward per-sample one (dense map, RoIAlign, per image);
3. label store: bytes per image, and random-read throughput of the packed memory-mapped store vs one file per
   image (the reference code's layout).

    python tools/benchmark_token_labeling.py --model lvvit_s --batch-size 8 --device cpu
"""
from backbones.common.commands import run_command
from classification.studies.token_labeling_benchmark import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__))
