#!/usr/bin/env python
"""Rewrite the figures of README.md and docs/*.md from their data files (docs/results/*.json, each with its commit,
machine and date, and seg_configs/metafile.yaml), or check that the pages still say what the data say:

    python tools/render_results.py            # rewrite every marked block that differs from its data
    python tools/render_results.py --check    # change nothing; exit 1 naming each page and block that differs

A page marks what is rendered: `<!-- results: NAME ARGS -->` ... `<!-- /results -->`, NAME naming what renders it
(`value FILE PATH [FORMAT]` for a figure inside a sentence, or a table: reproduction-table, reproduction-rows,
reproduction-table7, reproduction-figure4, segmentation-runs, dense-defaults, loop-table, timm-table, burst-table,
rehearsal-table, gpu-session). To change a figure, change its data file (or write a new one: a new run is a new
file) and render; a figure edited in a page by hand is put back, and `--check` (run by the tests) fails until then.
"""
from backbones.common.commands import run_command
from classification.studies.results_pages import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__))
