#!/usr/bin/env python
"""Train a segmentation config on ADE20K (or the embedded digits set) with mmengine's Runner.

    python tools/train_seg.py seg_configs/upernet_lvvit_m.py             # no ADE20K on disk: digits, CPU
    torchrun --nproc-per-node 8 tools/train_seg.py seg_configs/upernet_lvvit_m.py --launcher pytorch
    python tools/train_seg.py seg_configs/upernet_lvvit_m.py --resume      # continue an interrupted run

See --help for every option.
"""
from backbones.common.cli import run_command
from classification.digits.seg_data import EmbeddedPages
from backbones.segmentation.train import main

if __name__ == '__main__':
    run_command(lambda: main(fallback=EmbeddedPages))
