#!/usr/bin/env python
"""Train a dense config with mmengine's Runner: semantic segmentation on ADE20K, Mask R-CNN on COCO, depth on NYU-v2
(or each on the embedded digits pages when its data set is not on disk).

    python tools/train_seg.py seg_configs/upernet_lvvit_m.py             # no ADE20K on disk: digits, CPU
    torchrun --nproc-per-node 8 tools/train_seg.py seg_configs/upernet_lvvit_m.py --launcher pytorch
    python tools/train_seg.py seg_configs/upernet_lvvit_m.py --resume      # continue an interrupted run
    python tools/train_seg.py seg_configs/upernet_lvvit_m.py --log-wandb --log-mlflow    # also to the trackers

Without its data set on disk the config runs on the embedded digits pages, with a backbone pretrained on the digits
scans in place of the config's ImageNet weights (a first stage, run once and kept); --data-root gives a data set
elsewhere, and the *_own_data.py configs take your own.
An interrupted run continues with --resume (torchrun's restarts resume by themselves).
"""
from backbones.common.commands import run_command
from classification.digits.seg_data import EmbeddedPages
from classification.train_seg import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__, fallback=EmbeddedPages))
