#!/usr/bin/env python
"""Predict new images with a trained dense checkpoint: a segmentor's PNG label map per image, in the image's own size;
a detector's instances in one COCO-format file (instances.json); a depth model's 16-bit depth PNG with a coloured
picture beside it.

    python tools/predict_seg.py seg_configs/upernet_lvvit_m.py work_dirs/upernet_lvvit_m/iter_160000.pth \\
        photos/ --out masks/ --overlay
    python tools/predict_seg.py CONFIG CHECKPOINT a.jpg b.jpg --out masks/ --ms      # the papers' multi-scale + flip

A mask holds the data set's label values, as its annotations and `tools/test_seg.py --pred-dir` do (ADE20K: class
index + 1, 0 being 'other'; Cityscapes: its label ids); `--overlay` also writes NAME_overlay.png, the classes in the
data set's palette over the image. The config is read as test_seg reads it (`--data-root`; without ADE20K on disk,
the embedded digits set), so the classes are the ones the checkpoint was trained on. From Python:
`backbones.dense.predict.SegPredictor(config, checkpoint)(path)` gives the class index of every pixel.
"""
from backbones.common.commands import run_command
from backbones.dense.masks import main
from classification.digits.seg_data import EmbeddedPages

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__, fallback=EmbeddedPages))
