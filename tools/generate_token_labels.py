#!/usr/bin/env python
"""Dense token labels for token-labeling training: a machine annotator's top-k scores at every map position.

    python tools/generate_token_labels.py --data-dir /data/imagenet --annotator dm_nfnet_f6 \\
        --output /data/imagenet_token_labels --img-size 576 --topk 5
    torchrun --nproc-per-node 8 tools/generate_token_labels.py ...     # the same, data-parallel

The annotator is any model of the suite's or timm's registry: timm's pretrained weights, or --checkpoint. The
map describes the whole image resized to --img-size (no crop), so that training crops anywhere in the image
find their labels. Run the same command again after an interruption: finished shards are kept. With several
nodes, --output must be on a file system all of them share.
"""
from backbones.common.commands import run_command
from classification.token_labeling.commands import generate

if __name__ == '__main__':
    run_command(lambda: generate(description=__doc__))
