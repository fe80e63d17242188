#!/usr/bin/env python
"""Fine-tune a suite model on CIFAR-10/100 (T2T-ViT transfer recipe) and report the test accuracy of the epoch
chosen on a held-out part of the training set: tools/transfer.py under its former name (its other data sets too).

    python tools/transfer_cifar.py t2t_vit_14 --dataset cifar10 --data-dir /data/cifar \\
        --finetune 81.5_T2T_ViT_14.pth.tar --use-ema
    torchrun --nproc-per-node 4 tools/transfer_cifar.py lvvit_s --dataset cifar100 --data-dir /data/cifar \\
        --finetune lvvit_s-26M-224-83.3.pth.tar --batch-size 16
    python tools/transfer_cifar.py vit_small_patch16_224 --dataset cifar100 --data-dir /data/cifar --opt adamw

An interrupted run continues with the same command plus --resume. The recipe's values are printed at start; each has
its option below.
"""
from backbones.common.commands import run_command
from classification.digits.transfer_sets import EmbeddedTransferSet
from classification.transfer import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__, default_data=EmbeddedTransferSet, prog='transfer_cifar.py'))
