"""One device call of a GPU session (tools/measure_gpu.py; the stages and their plan: `gpu_plan`): the stages chosen
with `--stages`, in the order of value, each in a process of its own under the call's remaining time (`--budget`)
and LIMIT_FACTOR times its predicted length; one that no longer fits is skipped, one stopped keeps what it measured.
Every figure is written into the results file as it comes, merged across calls (`--merge`); `--smoke` runs every
stage at tiny sizes (on a CPU the loops eager, decoding without nvJPEG, the GPU tests skipped)."""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from backbones.common.cli import command_parser, non_negative_float, positive_float
from backbones.common.commands import write_document
from backbones.common.devices import add_device_argument, device_name
from backbones.common.errors import DataError, UsageError
from backbones.common.files import write_json_atomic
from backbones.common.log import logger
from backbones.common.outputs import output_file
from classification.studies.gpu_plan import (
    DEFAULT_STAGES,
    GPU,
    LIMIT_FACTOR,
    RESERVE,
    SMOKE,
    STAGE_ORDER,
    SYNC_CANARY,
    call_predictions,
    plan_lines,
    session_amp,
)
from classification.studies.gpu_stages import CHILD_STAGES, MODULES, run_child_stage
from classification.studies.launcher import LaunchedCommand, tool_command
from classification.studies.results_file import check_envelope, checkout_commit, machine_slug, results_document


class Results:
    """The session's results file: every figure written into it atomically as it comes (`--merge`: an earlier one)."""

    def __init__(self, path: Path, document: dict) -> None:
        self.path, self.document = path, document
        self.data = document['figures']

    def update(self, key: str, value: object) -> None:
        self.data[key] = value
        write_json_atomic(self.path, self.document)

    def stage(self, name: str, **facts: object) -> None:
        self.update('stages', {**self.data.get('stages', {}), name: {**self.data.get('stages', {}).get(name, {}),
                                                                     **facts}})


def session_document(device: str, commit: str | None, smoke: bool, argv: list[str] | None) -> dict:
    """A new session's results document: machine, versions, commit (`commit`, else git's) and date."""
    import timm
    import torchvision

    checked = checkout_commit()
    if commit and not (checked and (checked.startswith(commit) or commit.startswith(checked))):
        # a device machine's copy may hold a stale history, or one git cannot read there: --commit is the source's
        logger.warning(f'--commit {commit}: this copy\'s git says {checked or "nothing readable"}; the figures are '
                       f'recorded at {commit}')
    if checked is None and not commit:
        raise UsageError('give --commit (git rev-parse --short HEAD where the session was prepared): this copy has '
                         'no git history, and a figure needs its commit')
    versions = {'torchvision': torchvision.__version__, 'timm': timm.__version__,
                'python': '.'.join(map(str, sys.version_info[:3])), 'smoke': smoke}
    return results_document('gpu_session', 'measure_gpu.py', argv, versions, device, commit=commit or checked)


def open_results(out: Path, merge: Path | None, new: dict, stages: list[str]) -> Results:
    """The results file `out`, starting from `merge` (an earlier call's file) or from `out` itself where it exists;
    an earlier file of another machine, commit or size (--smoke) is refused, not mixed in."""
    source = merge if merge is not None else out
    if merge is not None and not merge.is_file():
        raise UsageError(f'--merge {merge}: no such file')
    if merge is not None and out.exists() and out.resolve() != merge.resolve():
        raise UsageError(f'--out {out} exists: give a new file for the merged figures (or --out {merge})')
    if not source.is_file():
        document = new
    else:
        try:
            document = check_envelope(json.loads(source.read_text()), str(source))
        except (ValueError, DataError) as exc:
            raise UsageError(f'{source}: not a results file ({exc})') from None
        if document['study'] != 'gpu_session':
            raise UsageError(f'{source}: not a GPU session\'s results (its study is {document["study"]})')
        # the machine by its GPU (or cores): the cores a call may use can differ on the same machine
        earlier = {'machine': machine_slug(document['machine']), 'commit': document['commit'],
                   'smoke': document['figures'].get('smoke')}
        now = {'machine': machine_slug(new['machine']), 'commit': new['commit'], 'smoke': new['figures']['smoke']}
        for key, value in earlier.items():
            if value != now[key]:
                raise UsageError(f'{source} holds figures of {key} {value!r}, this session\'s is {now[key]!r}: '
                                 f'give another --out (and no --merge)')
    results = Results(out, document)
    results.update('calls', [*document['figures'].get('calls', []), stages])
    return results


# ---- the parts' stages, run by the parent: each a command whose lines it reads


BENCHMARK_FIGURE = re.compile(r'^(\S+): (.+): ([\d.]+) img/s$')  # loop_benchmark's `reported` lines


def loop_benchmark_stage(results: Results, args: argparse.Namespace, limit: float) -> str:
    """tools/benchmark_loop.py on DeiT-S, each figure recorded as it is logged, its JSON document at the end."""
    sizes = args.sizes
    options = ['--models', sizes.model, '--device', args.device, '--amp', session_amp(args.device),
               '--batch-size', sizes.batch_size, '--workers', sizes.workers, '--images', sizes.images, '--seconds',
               f'{sizes.seconds:g}', '--min-batches', sizes.min_batches, '--skip-updates', sizes.skip_updates,
               '--compare-loop', '--train-cls', '--json']
    if args.timm_train:  # the file given, wherever this call runs: the benchmark runs in the checkout
        options += ['--timm-train', Path(args.timm_train).resolve()]
    else:
        logger.info("loop_benchmark: no --timm-train: timm's train.py is not timed (the suite against it is part 1's "
                    "first figure: bring train.py from a clone of timm's repository)")
    progress: dict[str, float] = {}

    def on_line(line: str) -> None:
        logger.info(f'  {line}')
        found = BENCHMARK_FIGURE.match(line)
        if found:
            progress[found[2]] = float(found[3])
            results.update('loop_benchmark_progress', dict(progress))
            if (loop := loop_from_progress(progress)) is not None:
                results.update('loop_from_progress', loop)

    with tempfile.TemporaryDirectory() as tmp:
        document = Path(tmp) / 'benchmark.json'
        # its figures' lines on standard error as they come, its document on standard output at its end
        with LaunchedCommand(tool_command('benchmark_loop', options), limit=limit, stdout=document) as run:
            status = run.wait(on_line)
        if status is not None and document.is_file() and document.read_text().strip():
            results.update('loop_benchmark', json.loads(document.read_text())['figures'])
    return outcome(status, 'exit 1: a figure above its ceiling (MEASUREMENT ERROR), recorded as such' if status == 1
                   else None)


def loop_from_progress(progress: dict[str, float]) -> dict | None:
    """The loop against its step from the progress lines of a benchmark stopped before its document (None: none)."""
    def figure(prefix: str) -> float | None:
        return next((value for label, value in progress.items() if label.startswith(prefix)), None)

    loop, step, serial = (figure('whole loop, batched path, overlapped'), figure('model step'),
                          figure('whole loop, batched path, serial'))
    if loop is None or step is None:
        return None
    pipelines = {int(found[1]): value for label, value in progress.items()
                 if (found := re.fullmatch(r'input pipeline, batched path, (\d+) workers', label))}
    pipeline = pipelines[max(pipelines)] if pipelines else None
    return {'loop_img_s': loop, 'step_img_s': step, 'loop_of_step': loop / step, 'serial_img_s': serial,
            'overlap_gain': loop / serial if serial else None, 'pipeline_img_s': pipeline,
            'input_bound': pipeline is not None and pipeline < step}


PYTEST_OUTCOME = re.compile(r'^(tests/\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)')
PYTEST_FAILURE = re.compile(r'^(?:FAILED|ERROR) tests/\S+::(\S+) - (.*)$')


def pytest_stage(key: str, tests: tuple[str, ...], what: str) -> Callable[[Results, argparse.Namespace, float], str]:
    """`pytest -m gpu TESTS`, each test's outcome recorded under `key` as it comes (on a CPU every test a skip)."""
    def run(results: Results, args: argparse.Namespace, limit: float) -> str:
        outcomes: dict[str, str] = {}
        failures: dict[str, str] = {}
        started = time.perf_counter()

        def record(timed_out: bool = False) -> None:
            counted = Counter(outcomes.values())
            failed = counted['FAILED'] + counted['ERROR']
            results.update(key, {
                'how': f'python -m pytest -m gpu {" ".join(tests)}', 'passed': counted['PASSED'], 'failed': failed,
                'ran': counted['PASSED'] + failed, 'skipped': counted['SKIPPED'], 'outcomes': dict(outcomes),
                'failures': dict(failures), 'seconds': round(time.perf_counter() - started, 1), 'timed_out': timed_out})

        def on_line(line: str) -> None:
            logger.info(f'  {line}')
            found, failure = PYTEST_OUTCOME.match(line), PYTEST_FAILURE.match(line)
            if found:
                outcomes[found[1].split('::', 1)[1]] = found[2]
            elif failure:
                failures[failure[1]] = failure[2][:300]
            if found or failure:
                record()

        with LaunchedCommand([sys.executable, '-m', 'pytest', '-m', 'gpu', *tests, '-v', '-rfE', '-p',
                              'no:cacheprovider'], what, limit=limit) as run:  # stopped: pytest's summary
            status = run.wait(on_line)
        record(timed_out=status is None)
        return outcome(status, 'some tests failed, recorded with their messages' if status == 1 else None)
    return run


def child_stage(name: str) -> Callable[[Results, argparse.Namespace, float], str]:
    """A stage run in a process of its own (`--stage NAME`), its figures merged here with the modules it imported."""
    def run(results: Results, args: argparse.Namespace, limit: float) -> str:
        with tempfile.TemporaryDirectory() as tmp:
            figures = Path(tmp) / f'{name}.json'
            command = tool_command('measure_gpu', [
                '--stage', name, '--stage-out', figures, '--work', args.work, '--device', args.device,
                *(['--smoke'] if args.smoke else []),
                *(['--seconds', f'{args.seconds:g}'] if args.seconds is not None else [])])
            try:  # the compiler's cache in the work folder too: nothing of the call is left behind
                with LaunchedCommand(command, limit=limit,
                                     env={'TORCHINDUCTOR_CACHE_DIR': str(Path(args.work) / 'inductor')}) as stage:
                    status = stage.wait(lambda line: logger.info(f'  {line}'))
            finally:  # an interrupted stage's figures so far are kept too (the child writes its file atomically)
                if figures.is_file():
                    written = json.loads(figures.read_text())
                    results.stage(name, modules=written.pop(MODULES, []))
                    for key, value in written.items():
                        results.update(key, value)
        return outcome(status)
    return run


STOPPED = 'stopped at its time limit (its figures so far are kept)'


def outcome(status: int | None, known: str | None = None) -> str:
    if status is None:
        return STOPPED
    return 'done' if status == 0 else known or f'failed (exit {status}): its output is above'


STAGES: dict[str, Callable[[Results, argparse.Namespace, float], str]] = {
    'sync_canary': pytest_stage('sync_canary', SYNC_CANARY, 'the sync canary'),
    'loop_benchmark': loop_benchmark_stage, 'deit_loop': child_stage('deit_loop'),
    'lvvit_loop': child_stage('lvvit_loop'),
    'gpu_tests': pytest_stage('gpu_tests', ('tests/test_gpu.py',), 'the GPU suite'),
    'decoding': child_stage('decoding'), 'label_generation': child_stage('label_generation'),
    'dense_steps': child_stage('dense_steps'), 'dense_windows': child_stage('dense_windows')}


def stage_limit(predicted: float, left: float, smoke: bool) -> tuple[float, bool]:
    """A stage's time limit, and whether it is its own (LIMIT_FACTOR times its prediction) or the call's remainder."""
    own = LIMIT_FACTOR * predicted
    return (own, True) if own < left and not smoke else (max(left, 1.0), False)


def run_stages(args: argparse.Namespace, argv: list[str] | None) -> Results:
    """The chosen stages in order of value, each under its limit and the call's remaining time, or skipped."""
    started = time.perf_counter()
    new = session_document(args.device, args.commit, args.smoke, argv)
    results = open_results(Path(args.out), Path(args.merge) if args.merge else None, new, args.stages)
    plan = call_predictions(args.stages, args.sizes)
    logger.info(f'{", ".join(plan)} on {new["machine"]} at {new["commit"]}, budget {args.budget:g} s; predicted '
                f'on an H100 or H200: ' + ', '.join(f'{stage} {seconds:.0f} s' for stage, seconds in plan.items()))
    with tempfile.TemporaryDirectory(prefix='measure_gpu_') as work:
        args.work = work
        logger.info(f'work folder {work}')
        for stage, predicted in plan.items():
            run_stage(stage, predicted, args.budget - (time.perf_counter() - started) - RESERVE, results, args)
    logger.info(f'{time.perf_counter() - started:.0f} s -> {args.out}')
    return results


def run_stage(stage: str, predicted: float, left: float, results: Results, args: argparse.Namespace) -> None:
    """One stage, recorded with its status: skipped where it does not fit `left`, killed at its limit, figures kept."""
    if predicted > left and not args.smoke:
        status = f'skipped: predicted {predicted:.0f} s, {max(left, 0):.0f} s left of the budget'
    else:
        limit, own = stage_limit(predicted, left, args.smoke)
        logger.info(f'{stage}: starting ({left:.0f} s left, its limit {limit:.0f} s)')
        stage_started = time.perf_counter()
        try:
            status = STAGES[stage](results, args, limit)
        except BaseException:  # Ctrl-C or SIGTERM: the file says so, with the figures the stage kept
            results.stage(stage, status='interrupted (its figures so far are kept)')
            raise
        if status == STOPPED and own:
            status = (f'timed out: killed at {limit:.0f} s, {LIMIT_FACTOR:g}x its predicted {predicted:.0f} s (its '
                      f'figures so far are kept)')
        results.stage(stage, seconds=round(time.perf_counter() - stage_started, 1),
                      predicted_seconds=round(predicted))
    results.stage(stage, status=status)
    logger.info(f'{stage}: {status}')


def stage_list(text: str) -> list[str]:
    """`--stages`: stage names separated by commas, run in the order of value whatever order they are given in."""
    names = [name.strip() for name in text.split(',') if name.strip()]
    unknown = [name for name in names if name not in STAGE_ORDER]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f'{", ".join(unknown) or "no stage"}: the stages are '
                                         f'{", ".join(STAGE_ORDER)}')
    return [stage for stage in STAGE_ORDER if stage in names]


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    p = command_parser(description, 'measure_gpu.py')
    p.add_argument('--stages', type=stage_list, default=list(DEFAULT_STAGES), help=(
        f'the stages of this call, separated by commas (default {",".join(DEFAULT_STAGES)}), run in the order '
        f'{", ".join(STAGE_ORDER)}'))
    p.add_argument('--out', type=output_file, help='the results file, every figure written into it as it comes')
    p.add_argument('--merge', help="an earlier call's results file to add this call's figures to (the same device "
                                   'and commit)')
    p.add_argument('--timm-train', help="timm's train.py, from a clone of timm's repository at the installed timm's "
                                        'version (loop_benchmark: without it the suite is not timed against it)')
    p.add_argument('--commit', help="the source's commit, where this copy has no git history (a device machine's)")
    p.add_argument('--budget', type=positive_float, default=540.0,
                   help='seconds this call may take (default 540); a stage whose predicted length does not fit what '
                        'is left is skipped')
    p.add_argument('--seconds', type=non_negative_float,
                   help=f'each timing window\'s least length (default {GPU.seconds:g}, the dense steps\' '
                        f'{GPU.dense_seconds:g}; smoke {SMOKE.seconds:g})')
    add_device_argument(p)  # cpu only with --smoke
    p.add_argument('--smoke', action='store_true', help='tiny sizes, for a CPU: every stage runs its code once, the '
                                                        'stages that need CUDA skipped with a line saying so')
    p.add_argument('--plan', type=positive_float, metavar='BUDGET',
                   help='print the calls a session with BUDGET seconds of device time should make for --stages')
    p.add_argument('--stage', choices=sorted(CHILD_STAGES), help=argparse.SUPPRESS)  # the stages' own processes
    p.add_argument('--stage-out', help=argparse.SUPPRESS)
    p.add_argument('--work', help=argparse.SUPPRESS)  # the call's work folder, where its stages share their data
    return p


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    args = build_parser(description).parse_args(argv)
    if args.plan is not None:
        write_document('\n'.join(plan_lines(args.plan, args.stages)))  # the plan is this command's result
        return 0
    if args.device is None and not args.smoke and not torch.cuda.is_available():
        raise UsageError('no GPU is visible: this tool measures a GPU (--smoke --device cpu runs it at tiny sizes)')
    args.device = device_name(args.device)
    if args.device == 'cpu' and not args.smoke:
        raise UsageError('--device cpu: only with --smoke (the figures are a GPU\'s)')
    sizes = SMOKE if args.smoke else GPU
    if args.seconds is not None:
        sizes = replace(sizes, seconds=args.seconds, dense_seconds=args.seconds)
    args.sizes = sizes
    if args.stage:
        run_child_stage(args.stage, Path(args.stage_out), args.sizes, args.device, Path(args.work))
        return 0
    if args.out is None:
        raise UsageError('give --out, the results file')
    if args.timm_train and not Path(args.timm_train).is_file():
        raise UsageError(f'--timm-train {args.timm_train}: no such file')
    results = run_stages(args, argv)
    failed = [name for name, stage in results.data.get('stages', {}).items()
              if str(stage.get('status', '')).startswith('failed')]
    if failed:  # the figures measured are kept in the file; the call is not a success
        logger.error(f'{", ".join(failed)} failed (their output is above); the other figures are in {args.out}')
        return 1
    return 0
