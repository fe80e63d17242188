#!/usr/bin/env python
"""Train a segmentation config on ADE20K (or the embedded digits set) with mmengine's Runner.

    python tools/train_seg.py seg_configs/upernet_lvvit_m.py             # no ADE20K on disk: digits, CPU
    torchrun --nproc-per-node 8 tools/train_seg.py seg_configs/upernet_lvvit_m.py --launcher pytorch
    python tools/train_seg.py seg_configs/upernet_lvvit_m.py --resume      # continue an interrupted run

See --help for every option.
"""
from backbones.common.cli import run_command
from backbones.segmentation.train import build_parser, parse_with_fallback, prepare, train
from classification.digits.seg_data import EmbeddedPages


def main() -> None:
    """Without ADE20K on disk, the embedded pages; where the config's ImageNet weights are not on disk either, two
    stages: the backbone pretrained on the embedded scans (kept for the next run), then the segmentor from it."""
    args, pages = parse_with_fallback(build_parser(), None, EmbeddedPages)
    run = prepare(args, pages)
    backbone = pages.pretrained_backbone(run.pretraining) if run.pretraining else None
    train(run, backbone)


if __name__ == '__main__':
    run_command(main)
