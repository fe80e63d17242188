#!/usr/bin/env python
"""Fine-tune a model on another data set with its paper's transfer recipe and report the test accuracy: CIFAR-10/100
(the T2T-ViT recipe, the epoch chosen on a held-out part of the training set), or Flowers-102, Stanford Cars,
Oxford-IIIT Pets, iNaturalist 2018/2019 in their published layouts and any class-folder set (DeiT's transfer recipe,
a new classifier on the starting weights); without --data-dir, a transfer set's recipe runs on the embedded digits
written in its layout (minutes on a CPU).

    python tools/transfer.py deit_small_patch16_224 --dataset pets            # embedded digits, pets' layout
    torchrun --nproc-per-node 8 tools/transfer.py deit_small_patch16_224 --dataset flowers102 \\
        --data-dir /data/flowers102 --pretrained                             # timm's weights from the local cache
    python tools/transfer.py t2t_vit_14 --dataset cifar10 --data-dir /data/cifar \\
        --finetune 81.5_T2T_ViT_14.pth.tar --use-ema

An interrupted run continues with the same command plus --resume. The recipe's values are printed at start; each has
its option (`--dataset NAME --help` lists them).
"""
from backbones.common.commands import run_command
from classification.digits.transfer_sets import EmbeddedTransferSet
from classification.transfer import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__, default_data=EmbeddedTransferSet))
