#!/usr/bin/env python
"""The real ImageNet job's size, rehearsed on this machine with the suite's own code.

Builds on local disk a synthetic tree with ImageNet's counts (1,281,167 training and 50,000 validation JPEGs of a few
KB in 1,000 class folders), a released-layout label tree for it (one `<wnid>/<stem>.pt` NFNet-F6-shaped map per
training image, [2, 5, 18, 18] float16) and the 8 GB store that importing it gives (written directly by the store's
writer, every row the release's one map: importing 1.28 million files takes about an hour on 2 cores), then times
each stage of the real job:

- listing: the training split listed as a training run lists it (files/s);
- import: the release tree imported into a second store (tools/import_token_labels.py's code; files/s): not in the
  default stages at full scale (`--stages import` adds it; a fraction of the tree gives the rate);
- store: the store opened with and without its verification (what each process does at start);
- dataset: the training set built as train_cls builds it (listing, store rows), and the main process's memory;
- pass: one shuffled epoch of the training sampler through the loader workers (each image decoded, its store row
  read; no augmentation, so the index and the store are what is measured), every worker's private (USS) and
  proportional (PSS) memory sampled from /proc at its start and end;
- val-listing: the validation split listed;
- first-step: `torchrun train_cls.py` (a 2-block LV-ViT-S, token labeling) from launch to its first update, twice
  (a second start in a fresh output: what a restart costs), with the training processes' memory at that step;
- checkpoint: a training checkpoint (weights, EMA, AdamW state) of LV-ViT-L and CaiT-M48 written as train_cls
  writes one: size and seconds.
- tar-build, tar-listing, tar-pass, tar-vs-folders, tar-first-step (not in the default stages): the same images
  as tars (`ROOT/imagenet-tar`: 1,000 per-class tars for training, one tar of class folders for validation), their
  index built and read again, the pass and the first update from them, and both readers' images/s (wall and per
  CPU second) in the same run, interleaved.

    python tools/rehearse_scale.py                                   # full scale: about 24 GB of disk
    python tools/rehearse_scale.py --scale 0.04 --stages build import  # the import's files/s
    python tools/rehearse_scale.py --scale 0.01 --stages build listing pass --json out.json

The trees are kept in --root and reused by later runs of the same --scale (the store too): delete --root to free
the disk. The embedded default is the full job's size; `--scale` gives a fraction of its images (1,000 classes).
"""
from backbones.common.commands import run_command
from classification.studies.scale_rehearsal import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__))
