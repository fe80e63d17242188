#!/usr/bin/env python
"""Images/s of each stage of the real training loop in its steady state, and the stage that bounds it.

For each model (default: LV-ViT-S with token labeling, DeiT-S with the vanilla DeiT recipe), through the training
tool's own loaders, model, objective and optimizer:
- input pipeline per core: one process, one thread; the PIL path (`--augment pil`), and the batched path
  (`--augment batched`: the workers' half, then the device's half where the device is this CPU);
- input pipeline with `--workers` loader processes, both paths (the device's half included), each beside its
  physical ceiling: the workers' share of the work at the one-core rate, times the workers (at most the cores);
- model step: forward, loss (token targets included), backward and optimizer on a batch already on the device;
- whole loop: `train_one_epoch` over the loader, with the path `--augment` picks, and its share of the model step
  (`--compare-loop`: also the serial loop, each batch prepared between the steps instead of beside them);
- `--train-cls`: tools/train_cls.py itself on the same data, model, batch, workers, device and precision, timed from
  its update lines after its first `--skip-updates` (50) updates, then stopped.
Every stage is timed in its steady state: untimed warm-up batches past what the loader workers prefetch (workers x
prefetch factor, plus one), then a window of at least `--seconds` and `--min-batches` batches, the loader running
epoch after epoch as training does. A figure above its ceiling (N-worker pipeline) or above the slower of its stages
(the loop) is reported as a measurement error, not a result. The bound stage is the slower of the input pipeline
(the loop's path, with workers) and the model step. `--compare-step` also times the model step with each of the
trainer's step options alone (fused optimizer, channels-last, bf16 autocast, torch.compile) against the step
without any of them.

The synthetic data set (unless `--data-dir`) holds `--images` training entries of ImageNet's typical size
(500x375): 64 distinct JPEGs, the rest hard links to them (decoding costs the same; the disk and the label
generation do not grow), and a token-label store made by a random-weight annotator for the distinct images.

    python tools/benchmark_loop.py                      # 2 workers, batch 16, 30 s per stage: about 10 minutes
    python tools/benchmark_loop.py --device cuda --amp bf16 --batch-size 256 --workers 15 --images 200000 --train-cls
    python tools/benchmark_loop.py --device cuda --amp bf16 --batch-size 256 --workers 16 \\
        --data-dir /data/imagenet --token-label-dir /data/imagenet_labels
    python tools/benchmark_loop.py --models lvvit_s --compare-step --json
"""
from backbones.common.commands import run_command
from classification.studies.loop_benchmark import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__))
