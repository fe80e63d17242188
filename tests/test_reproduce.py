"""tools/reproduce_token_labeling.py: every stage runs, and its table and JSON hold what the runs wrote."""
from __future__ import annotations

import json
import statistics

import pytest
from scipy.stats import ttest_rel

from classification.studies.statistics import describe_difference
from helpers.commands import run_tool
from helpers.seg_data import write_tiny_ade, write_tiny_config

pytestmark = pytest.mark.slow  # tools run end to end here: make test-fast leaves this file out

VARIANTS = ('token-labeling', 'standard', 'online-token-labeling')  # mixtoken-label trains in test_presets
TRANSFERRED = VARIANTS[:2]  # Table 7's rows among them: online token labeling is compared by classification alone


@pytest.fixture(scope='module')
def reproduction(labeled_images, tmp_path_factory):
    data, labels = labeled_images
    root = tmp_path_factory.mktemp('repro')
    ade = write_tiny_ade(root / 'ade')
    configs = {head: write_tiny_config(root / f'tiny_{head}.py', f'{head}_lvvit_s.py', ade)
               for head in ('fcn', 'upernet')}
    out = root / 'out'
    argv = ['--quick', '--seeds', '2',
            '--device', 'cpu', '--out', str(out), '--fcn-config', str(configs['fcn']),
            '--upernet-config', str(configs['upernet']), '--epochs', '1', '--iters', '2',
            '--variants', *VARIANTS, '--cls-data-dir', str(data), '--token-label-dir', str(labels),
            '--annotator', 'resnet10t', '--annotator-checkpoint', str(labels.parent / 'annotator.pth'),
            '--cls-args', '--img-size', '32', '--batch-size', '4', '--lr-base-batch', '4', '--workers', '0']
    result = run_tool('reproduce_token_labeling.py', argv, timeout=1200, nested=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, result.stdout, argv


def test_results_are_the_runs_own_figures(reproduction):
    out, _, _ = reproduction
    results = json.loads((out / 'results.json').read_text())['figures']
    assert [(r['variant'], r['seed']) for r in results['runs']] == [(v, s) for s in range(2) for v in VARIANTS]
    for run in results['runs']:
        run_dir = out / 'runs' / run['variant'] / f'seed_{run["seed"]}'
        cls = json.loads((run_dir / 'cls' / 'metrics.json').read_text())
        preset = 'token-labeling' if run['variant'] == 'online-token-labeling' else run['variant']
        assert run['top1'] == cls['best_top1'] and cls['preset'] == preset
        assert cls['token_labeling'] == (run['variant'] != 'standard')
        assert cls['online_token_labeling'] == (run['variant'] == 'online-token-labeling')
        assert cls['teacher'] == ('resnet10t' if cls['online_token_labeling'] else None)
        epochs = [json.loads(line) for line in (run_dir / 'cls' / 'log.jsonl').read_text().splitlines()]
        assert run['train_seconds'] == pytest.approx(sum(epoch['time'] for epoch in epochs), abs=0.05)
        for head in ('fcn', 'upernet'):
            assert (head in run) == (run['variant'] in TRANSFERRED) == (run_dir / head).is_dir()
            for mode in ('ss', 'ms') if head in run else ():
                report = json.loads((run_dir / head / f'{mode}.json').read_text())
                assert run[head][mode] == {'mIoU': report['mIoU'], 'aAcc': report['aAcc']}
    for variant in TRANSFERRED:
        mine = [r for r in results['runs'] if r['variant'] == variant]
        values = [r['upernet']['ms']['mIoU'] for r in mine]
        stats = results['summary'][variant]['upernet']['ms']['mIoU']
        assert stats['mean'] == pytest.approx(statistics.fmean(values))
        assert stats['std'] == pytest.approx(statistics.stdev(values)) and stats['n'] == 2
    # the Standard row against token labeling, seed by seed: the differences of the runs' own figures
    by_seed = {(r['variant'], r['seed']): r for r in results['runs']}
    differences = [by_seed[('standard', s)]['upernet']['ms']['mIoU'] - by_seed[('token-labeling', s)]['upernet']['ms']
                   ['mIoU'] for s in range(2)]
    compared = results['summary']['standard']['vs_token_labeling']['upernet']['ms']
    reference = ttest_rel([by_seed[('standard', s)]['upernet']['ms']['mIoU'] for s in range(2)],
                          [by_seed[('token-labeling', s)]['upernet']['ms']['mIoU'] for s in range(2)])
    assert compared['mean'] == pytest.approx(statistics.fmean(differences)) and compared['n'] == 2
    if statistics.stdev(differences) > 0:
        interval = reference.confidence_interval(0.95)
        assert (compared['low'], compared['high']) == (pytest.approx(interval.low), pytest.approx(interval.high))
    assert 'vs_token_labeling' not in results['summary']['token-labeling']
    online = results['summary']['online-token-labeling']
    assert 'upernet' not in online and set(online['vs_token_labeling']) == {'top1'}


def test_table_shows_the_summary_in_the_papers_layout(reproduction):
    out, stdout, _ = reproduction
    results = json.loads((out / 'results.json').read_text())['figures']
    table = (out / 'table.md').read_text()
    assert table in stdout
    rows = [line for line in table.splitlines() if line.startswith('| lvvit_s')]  # the Table 7 layout
    assert len(rows) == 2 * len(TRANSFERRED)
    fcn_tl = rows[0].split(' | ')
    summary = results['summary']['token-labeling']
    assert fcn_tl[3] == 'FCN'
    assert fcn_tl[4] == f'{summary["fcn"]["ss"]["mIoU"]["mean"]:.1f} ± {summary["fcn"]["ss"]["mIoU"]["std"]:.1f}'
    assert fcn_tl[2] == f'{summary["top1"]["mean"]:.1f} ± {summary["top1"]["std"]:.1f}'
    for name in ('table4.png', 'table7.png'):  # Table 4 holds all three rows, Table 7 the two transferred
        assert (out / name).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    standard_rows = [line.split(' | ') for line in table.splitlines() if line.startswith('| Standard')]
    compared = results['summary']['standard']['vs_token_labeling']
    assert len(standard_rows) == 2  # its pretraining row, then its segmentation differences
    assert standard_rows[0][2] == describe_difference(compared['top1'])
    assert standard_rows[1][-1] == describe_difference(compared['upernet']['ms']) + ' |'


def test_a_finished_reproduction_reruns_nothing(reproduction):
    out, _, argv = reproduction
    before = json.loads((out / 'results.json').read_text())['figures']
    stamps = {p: p.stat().st_mtime for p in out.glob('runs/*/*/*/*.json')}
    result = run_tool('reproduce_token_labeling.py', argv, timeout=300, nested=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not [line for line in result.stdout.splitlines() if line.startswith('[')]  # no stage ran
    assert json.loads((out / 'results.json').read_text())['figures']['runs'] == before['runs']
    assert stamps and all(p.stat().st_mtime == t for p, t in stamps.items())


@pytest.mark.parametrize('changed, stage', [(('--epochs', '2'), 'cls'), (('--iters', '3'), 'fcn')])
def test_a_rerun_with_other_settings_is_refused_not_given_the_old_results(reproduction, changed, stage):
    """The same --out with another --epochs (pretraining) or --iters (segmentation): refused, naming the stage
    folder and the new setting, before any stage runs and with results.json untouched."""
    out, _, argv = reproduction
    before = (out / 'results.json').read_text()
    option, value = changed
    rerun = list(argv)
    rerun[rerun.index(option) + 1] = value
    result = run_tool('reproduce_token_labeling.py', rerun, timeout=300, nested=True)
    assert result.returncode == 2 and result.stderr.count('error:') == 1
    assert f'{out / "runs" / "token-labeling" / "seed_0"} was made by' in result.stderr
    assert f'{option} {value}' in result.stderr or value in result.stderr
    assert not [line for line in result.stdout.splitlines() if line.startswith('[')]
    assert (out / 'results.json').read_text() == before
