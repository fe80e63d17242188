#!/usr/bin/env python
"""Pictures of what the models see: token labels, attention, segmentations and training curves, as PNG files.

    python tools/visualize.py token-labels --data-dir D --token-label-dir T [--image PATH] --out labels.png
    python tools/visualize.py attention MODEL [--checkpoint C] --image PATH [PATH ...] --out attention.png
    python tools/visualize.py segmentation CONFIG CHECKPOINT [--image PATH] [--report R.json] --out seg.png
    python tools/visualize.py confusion R.json --out confusion.png              # test_seg --out's confusion matrix
    python tools/visualize.py curves RUN_DIR [RUN_DIR ...] --out curves.png

`--show` also opens the picture where there is a display. See each subcommand's --help.
"""
from backbones.common.commands import run_command
from classification.digits.seg_data import EmbeddedPages
from classification.visualize import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__, fallback=EmbeddedPages))
