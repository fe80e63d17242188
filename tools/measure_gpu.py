#!/usr/bin/env python
"""Measure a borrowed GPU machine, the stages of one device call chosen with --stages, writing one results file that
docs/speed.md renders (docs/speed.md, "A GPU session", says how a session prepares and runs it):

    python tools/measure_gpu.py --plan 900        # the calls for 900 s of device time, the wheels to carry
    python3 tools/measure_gpu.py --stages sync_canary,deit_loop,lvvit_loop --budget 540 --out $OUT/gpu.json --commit C
    python3 tools/measure_gpu.py --stages decoding,label_generation --budget 210 --merge .gpu/gpu.json \
        --out $OUT/gpu.json --commit C
    python tools/measure_gpu.py --smoke --device cpu --out /tmp/gpu_smoke.json                # tiny, on a CPU

sync_canary: the sync-debug test of the loop with --decode gpu, first; deit_loop and lvvit_loop (LV-ViT-S with token
labeling): the whole loop with --decode gpu and 11 loader workers against the trainer's bf16 step (batch 256) in the
same process, eager and compiled; decoding: nvJPEG against 4 workers' decoding; label_generation: NFNet-F6 in bf16
against fp32; by name dense_steps, dense_windows, loop_benchmark and gpu_tests. Each window >= 15 s and a floor of
batches in its steady state; each stage runs in a process of its own under the call's --budget and 1.5 times its
predicted length: one that does not fit is skipped with a line saying so, one stopped keeps its figures.
"""
from backbones.common.commands import run_command
from classification.studies.gpu_session import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__))
