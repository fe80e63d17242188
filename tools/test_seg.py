#!/usr/bin/env python
"""Evaluate a dense checkpoint on its test set: a segmentor's mIoU/mAcc/aAcc, single-scale or multi-scale + flip as in
the papers; a detector's COCO box and mask AP; a depth model's depth figures (d1, AbsRel, RMSE, log10).

    python tools/test_seg.py seg_configs/upernet_lvvit_m.py work_dirs/upernet_lvvit_m/iter_160000.pth --out ss.json
    python tools/test_seg.py seg_configs/upernet_lvvit_m.py work_dirs/upernet_lvvit_m/iter_160000.pth --ms --out ms.json
    python tools/test_seg.py CONFIG CHECKPOINT --tta --show-dir pictures/     # mmseg's names: --tta is --ms

A segmentor's report (--out) holds the per-class table and the confusion matrix (tools/visualize.py confusion draws
it); the config's test_evaluator is honoured (IoUMetric's mDice, mFscore). A detector's and a depth model's report
hold their figures; --pred-dir writes their predictions (a COCO results file, 16-bit depth PNGs).
"""
from backbones.common.commands import run_command
from backbones.dense.test import main
from classification.digits.seg_data import EmbeddedPages

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__, fallback=EmbeddedPages))
