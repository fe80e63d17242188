#!/usr/bin/env python
"""Import a released dense-label set (one .pt file per image) into the suite's token-label store.

    python tools/import_token_labels.py --data-dir /data/imagenet --release-dir /data/label_top5_train_nfnet \\
        --output /data/imagenet_labels_nfnet                          # TokenLabeling's NFNet-F6 maps (auto-detected)
    python tools/import_token_labels.py --data-dir /data/imagenet \\
        --release-dir /data/imagenet_efficientnet_l2_sz475_top5 --output /data/imagenet_labels_relabel
    torchrun --nproc-per-node 8 tools/import_token_labels.py ...      # the same, shards spread over processes

Every file is checked (shape, dtype, finite scores, class indices in range), the release's class folders must be the
data folder's classes, and images without a file are named (--skip-missing gives them an empty row: they train on
their image label). Run the same command again after an interruption: finished shards are kept.
"""
from backbones.common.commands import run_command
from classification.token_labeling.commands import import_release

if __name__ == '__main__':
    run_command(lambda: import_release(description=__doc__))
