#!/usr/bin/env python
"""Parameters and MACs of the suite's models.

    python tools/model_info.py lvvit_s [--img-size 384] [--json]
    python tools/model_info.py --all
    python tools/model_info.py --seg-config seg_configs/*.py [--shape 512 2048]  # parameters per part, GMACs
"""
from backbones.common.commands import run_command
from backbones.dense.complexity import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__))
