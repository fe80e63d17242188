#!/usr/bin/env python
"""Rewrite the figures of README.md and docs/*.md from their data files (docs/results/*.json, each in the results
envelope: study, source, commit, date, machine, torch, figures; and seg_configs/metafile.yaml), or check that the
pages still say what the data say:

    python tools/render_results.py            # rewrite every marked block that differs from its data
    python tools/render_results.py --check    # change nothing; exit 1 naming each page and block that differs

A page marks what is rendered: `<!-- results: KIND ARGS -->` ... `<!-- /results -->`, KIND one of `table FILE ...`
(the marker's next lines a table whose cells hold `{EXPRESSION:FORMAT}`), `view FILE VIEW` (a study's own view),
`runs TASK...` (the metafile's embedded defaults) and `value FILE EXPRESSION [FORMAT]` (one figure in a sentence);
an EXPRESSION is a figure's path, no arithmetic (docs/layout.md, "The figures in the pages"). To change a figure,
change its data file (or write a new one: a new run is a new file) and render; a figure edited in a page by hand is
put back, and `--check` (run by the tests) fails until then.
"""
from backbones.common.commands import run_command
from classification.studies.results_pages import main

if __name__ == '__main__':
    run_command(lambda: main(description=__doc__))
