#!/usr/bin/env python
"""The token-labeling paper's ablations in miniature ("All Tokens Matter": Tables 2, 4 and 7, Figure 4), each row
differing from token labeling in the factor its name gives:

    python tools/reproduce_token_labeling.py                      # Tables 2, 4 and 7: LV-ViT-S on the digits, 3 seeds
    python tools/reproduce_token_labeling.py --table fig4         # Figure 4: participation rate and annotator
    python tools/reproduce_token_labeling.py --quick              # every row, smoke-sized (1 seed, 1 epoch)
    python tools/reproduce_token_labeling.py --device cuda --out runs/tl_repro --table 2 4 7 fig4

The rows (`--table` picks the paper's, `--variants` names them):
  Table 2   token-labeling (MixToken), relabel-mixtoken and relabel (the annotator's map pooled to one label per
            image, MixToken or CutMix), mixtoken-label and cutmix-label (the image label alone)
  Table 4   standard (vanilla: the paper's MixUp 0.8 + CutMix 1.0 at lr 1e-3 per 1024 images), relabel,
            token-labeling, online-kd (the annotator as DeiT's hard-distillation teacher), online-token-labeling
            (the annotator's dense map of each augmented batch as token targets, no store), with their training
            times; and standard-same-lr (Standard at token labeling's lr: the lr is not the factor compared)
  Table 7   the backbones of token-labeling, standard and mixtoken-label (the image label alone: the one-factor
            row) transferred with FCN and UperNet, tested single-scale (SS) and multi-scale (MS)
  Figure 4  participation-20 ... -80 (that share of each image's tokens in the token loss) and annotator-resnet18,
            annotator-resnet34 (token labels from larger annotators than the digits' resnet10t)
Every row is pretrained, for every seed, before any is transferred; `--transfer all` transfers every row.

DIR/table.md: each row's top-1 (mean +- std over seeds) and pretraining time with its ratio to Standard's, each row
minus token labeling paired by seed with its 95% interval and "within noise" where the interval holds 0; the Table 7
layout with its paired differences; the paper's Table 2, Table 4 and Figure 4 layouts. DIR/results.json holds every
run and the summary; DIR/table2.png, table4.png, table7.png and figure4.png one figure per table.

Every stage is the suite's own command (tools/train_cls.py, tools/train_seg.py, tools/test_seg.py), logged to
DIR/runs/VARIANT/seed_S/*.log. A stage whose result is on disk is not run again, and an interrupted one resumes
from its last checkpoint: rerun the same command to continue, or add tables to an earlier run's DIR.
"""
from backbones.common.commands import run_command
from classification.studies.reproduction.runs import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__))
