#!/usr/bin/env python
"""Measure a borrowed GPU machine, the stages of one device call chosen with --stages, writing one results file that
docs/speed.md renders (docs/speed.md, "A GPU session", says how a session prepares and runs it):

    python3 tools/measure_gpu.py --out $OUT/gpu.json --commit C       # deit_loop,lvvit_loop,decoding,label_generation
    python3 tools/measure_gpu.py --stages gpu_tests --merge .gpu/gpu.json --out $OUT/gpu.json --commit C
    python tools/measure_gpu.py --smoke --device cpu --out /tmp/gpu_smoke.json                # tiny, on a CPU

deit_loop and lvvit_loop (LV-ViT-S with token labeling): the whole loop with --decode gpu and 11 loader workers
against the trainer's bf16 step (batch 256) in the same process, eager and compiled, with the loop's data-wait share;
decoding: nvJPEG against 4 workers' decoding; label_generation: NFNet-F6 in bf16 against fp32; loop_benchmark:
tools/benchmark_loop.py on DeiT-S, the suite against timm's own train.py; gpu_tests: pytest -m gpu. Each window
>= 30 s in its steady state; each stage runs in a process of its own under the call's --budget: one whose predicted
length does not fit what is left is skipped with a line saying so, and one stopped at the budget keeps its figures.
"""
from backbones.common.commands import run_command
from classification.studies.gpu_session import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__))
