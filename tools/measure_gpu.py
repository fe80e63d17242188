#!/usr/bin/env python
"""Measure a borrowed GPU machine in parts, one device call each, writing one results file that docs/speed.md renders
(docs/speed.md, "A GPU session", says how a session prepares and runs it):

    python3 tools/measure_gpu.py --part 1 --out $OUT/gpu.json --timm-train .gpu/timm_train.py --commit C
    python3 tools/measure_gpu.py --part 2 --out $OUT/gpu.json --merge .gpu/gpu.json --commit C
    python tools/measure_gpu.py --part 1 --smoke --device cpu --out /tmp/gpu_smoke.json     # tiny, on a CPU

Part 1 (about 8 minutes on an H100): tools/benchmark_loop.py on DeiT-S, bf16, batch 256, 15 workers, each window
>= 30 s in its steady state: the whole loop against its step (and the serial loop), tools/train_cls.py and timm's
own train.py on the same data, and their ratio. Part 2: the trainer's eager and compiled bf16 steps with their MFU,
`pytest -m gpu`, nvJPEG decoding against the workers' (4 workers), NFNet-F6 label generation in bf16 against fp32.
Each stage runs in a process of its own under the part's --budget; one whose predicted length does not fit what is
left is skipped with a line saying so, and one stopped at the budget keeps the figures it wrote.
"""
from backbones.common.cli import run_command
from classification.studies.gpu_session import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__))
