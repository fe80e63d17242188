#!/usr/bin/env python
"""Evaluate a segmentation checkpoint: single-scale, or multi-scale + flip as in the papers, mIoU/mAcc/aAcc.

    python tools/test_seg.py seg_configs/upernet_lvvit_m.py work_dirs/upernet_lvvit_m/iter_160000.pth --out ss.json
    python tools/test_seg.py seg_configs/upernet_lvvit_m.py work_dirs/upernet_lvvit_m/iter_160000.pth --ms --out ms.json
    python tools/test_seg.py CONFIG CHECKPOINT --tta --show-dir pictures/     # mmseg's names: --tta is --ms

The report (--out) holds the per-class table and the confusion matrix (tools/visualize.py confusion draws it); the
config's test_evaluator is honoured (IoUMetric's mDice, mFscore).
"""
from backbones.common.commands import run_command
from backbones.segmentation.test import main
from classification.digits.seg_data import EmbeddedPages

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__, fallback=EmbeddedPages))
