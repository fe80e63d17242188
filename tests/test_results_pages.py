"""The figures the pages quote come from their data files (tools/render_results.py), and the prepared GPU session
(tools/measure_gpu.py) runs end to end at smoke sizes on a CPU."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from backbones.common.errors import DataError, UsageError
from classification.studies import gpu_plan, gpu_session, results_pages
from classification.studies.figure_formats import formatted
from classification.studies.gpu_session_view import gpu_session_figures
from classification.studies.metafile_runs import embedded_runs
from classification.studies.results_data import DataFiles
from classification.studies.results_file import check_envelope, file_name
from helpers.commands import ROOT, run_tool
from helpers.device_image import import_failures_on_the_device


def output(result: subprocess.CompletedProcess) -> str:
    """A command's log (standard output) and its one-line error (standard error), in that order."""
    return result.stdout + result.stderr


def copy_pages_and_data(root: Path) -> Path:
    """The pages (README.md, docs/*.md) and their data files, as render_results reads them, under `root`."""
    (root / 'docs').mkdir(parents=True)
    shutil.copy(ROOT / 'README.md', root / 'README.md')
    for page in (ROOT / 'docs').glob('*.md'):
        shutil.copy(page, root / 'docs' / page.name)
    shutil.copytree(ROOT / 'docs' / 'results', root / 'docs' / 'results')
    (root / 'seg_configs').mkdir()
    shutil.copy(ROOT / 'seg_configs' / 'metafile.yaml', root / 'seg_configs' / 'metafile.yaml')
    return root


def test_the_repository_pages_say_what_their_data_say():
    result = run_tool('render_results.py', ['--check'])
    assert result.returncode == 0, output(result)[-2000:]
    assert 'no block(s) differ' in output(result)


MAKE_RUN = 'make_run_cpu2_acef882'


def test_no_measured_time_is_typed_in_the_pages_prose():
    """A time measured and typed in prose (docs/reproduction.md's '--quick takes 13 min 53 s') has no results file,
    so the check above cannot catch an edit to it: every such time lies in a rendered block, or says it is an
    estimate ('about ...')."""
    block = re.compile(r'<!-- results: .*?<!-- /results -->', re.S)
    time = re.compile(r'(?<!about )\b\d+(\.\d+)? (min|h) \d+ (s|min)\b')
    typed = [(page.name, found.group(0)) for page in [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md'))]
             for found in time.finditer(block.sub('', page.read_text()))]
    assert typed == []


def test_a_figure_edited_by_hand_fails_the_check_names_its_block_and_is_put_back(tmp_path):
    root = copy_pages_and_data(tmp_path / 'repo')
    readme = root / 'README.md'
    text = readme.read_text()
    best = json.loads((root / 'docs' / 'results' / f'{MAKE_RUN}.json').read_text())['figures']['top1_best']
    published = f'**{best:.1f}% top-1**'
    assert text.count(published) == 1  # the make run table's cell
    edited = text.replace(published, '**99.9% top-1**')
    readme.write_text(edited)

    checked = run_tool('render_results.py', ['--check', '--root', root])
    assert checked.returncode == 1
    assert 'README.md:' in output(checked) and f'block "table {MAKE_RUN} suite=' in output(checked)
    assert '1 block(s) differ' in output(checked)  # only the edited one
    assert readme.read_text() == edited  # --check changes nothing

    rendered = run_tool('render_results.py', ['--root', root])
    assert rendered.returncode == 0, output(rendered)[-2000:]
    assert readme.read_text() == text
    assert run_tool('render_results.py', ['--check', '--root', root]).returncode == 0


def test_a_figure_changed_in_its_data_file_reaches_every_page_that_quotes_it(tmp_path):
    root = copy_pages_and_data(tmp_path / 'repo')
    data = root / 'docs' / 'results' / f'{MAKE_RUN}.json'
    run = json.loads(data.read_text())
    run['figures']['top1_best'] = 12.34
    data.write_text(json.dumps(run))

    differing = results_pages.render_pages(root, write=False)
    quoting = {'README.md': 1, 'docs/imagenet.md': 0}  # the README's table; imagenet.md's figures inside sentences
    quoting['docs/imagenet.md'] = (root / 'docs' / 'imagenet.md').read_text().count(f'value {MAKE_RUN} top1_best')
    assert quoting['docs/imagenet.md'] >= 1
    assert sorted(block.split(':')[0] for block in differing) == sorted(
        page for page, count in quoting.items() for _ in range(count))
    results_pages.render_pages(root)
    assert '**12.3% top-1**' in (root / 'README.md').read_text()
    assert '-->12.3%<!-- /results --> top-1' in (root / 'docs' / 'imagenet.md').read_text()


def envelope(figures: dict, study: str = 'run', commit: str | None = 'abc1234', **fields: object) -> dict:
    return {'study': study, 'source': 'a test', 'commit': commit, 'date': '2026-11-28', 'machine': '2 CPU cores',
            'torch': '2.15.0', **fields, 'figures': figures}


def page_and_data(root: Path, page: str, **documents: dict) -> Path:
    """A repository `root` with README.md holding `page` and docs/results/NAME.json for each document."""
    (root / 'docs' / 'results').mkdir(parents=True)
    for name, document in documents.items():
        (root / 'docs' / 'results' / f'{name}.json').write_text(json.dumps(document))
    (root / 'README.md').write_text(page)
    return root


def test_a_block_naming_a_missing_figure_is_one_error_naming_page_line_and_file(tmp_path):
    root = page_and_data(tmp_path / 'repo', 'Top-1\n<!-- results: value run top5 {:.0%} -->50%<!-- /results -->\n',
                         run=envelope({'top1': 0.5}))
    result = run_tool('render_results.py', ['--check', '--root', root])
    assert result.returncode == 2  # an error, not a difference
    assert output(result).strip().splitlines()[-1] == (
        f"error: README.md:2: {root}/docs/results/run.json: no top5 (stopped at 'top5')  (--debug shows the "
        f'traceback)')


def test_a_results_file_outside_the_envelope_is_refused_naming_what_is_wrong(tmp_path):
    page = '<!-- results: value run top1 -->0.5<!-- /results -->\n'
    cases = {'no study, source, commit, date, machine, torch, figures; top1 outside figures': {'top1': 0.5},
             "commit 'HEAD' is not a commit": envelope({'top1': 0.5}, commit='HEAD'),
             'commit is null and notes.commit does not say why': envelope({'top1': 0.5}, commit=None),
             "date '28/11/2026' is not YYYY-MM-DD": envelope({'top1': 0.5}, date='28/11/2026'),
             "date '2026-99-99' is not YYYY-MM-DD": envelope({'top1': 0.5}, date='2026-99-99'),
             'notes is not an object': envelope({'top1': 0.5}, commit=None, notes=['not recorded']),
             'no figures': envelope({})}
    for i, (why, document) in enumerate(cases.items()):
        root = page_and_data(tmp_path / str(i), page, run=document)
        with pytest.raises(DataError, match=re.escape(why)):
            results_pages.render_pages(root, write=False)
    unrecorded = envelope({'top1': 0.5}, commit=None, notes={'commit': 'not recorded'})
    root = page_and_data(tmp_path / 'ok', page, run=unrecorded)
    assert results_pages.render_pages(root, write=False) == []


def test_a_table_fills_its_cells_from_its_files_and_says_where_each_was_measured(tmp_path):
    page = textwrap.dedent('''\
        <!-- results: table run base=base
        | | img/s |
        |---|---:|
        | step | {step:rate} (x{step_over_base:.2f} of {base#step:rate}
          at {base#commit}) |
        -->
        <!-- /results -->
        ''')
    root = page_and_data(tmp_path / 'repo', page, run=envelope({'step': 1234.4, 'step_over_base': 1.2344}),
                         base=envelope({'step': 1000.0}, commit='def5678', machine='NVIDIA H200, 16 CPU cores'))
    results_pages.render_pages(root)
    text = (root / 'README.md').read_text()
    assert '| step | 1,234 (x1.23 of 1,000 at def5678) |' in text  # a row written over two lines, rendered as one
    assert ('2 CPU cores, torch 2.15.0, commit abc1234, 2026-11-28 ([run.json](docs/results/run.json)); '
            'NVIDIA H200, 16 CPU cores, torch 2.15.0, commit def5678') in ' '.join(text.split())
    assert results_pages.render_pages(root, write=False) == []  # rendered once, it stays

    (root / 'README.md').write_text(page.replace('{base#commit}', '{other#commit}'))
    with pytest.raises(UsageError, match=r'other is not one of the table\'s files \(run, base\)'):
        results_pages.render_pages(root, write=False)


@pytest.mark.parametrize('marker, error, message', [
    ('<!-- results: value run \'step / zero\' -->x<!-- /results -->', DataError, 'no step / zero'),  # a path alone
    ('<!-- results: value run other#step -->x<!-- /results -->', DataError, 'no other#step'),  # a table's alone
    ('<!-- results: value run nested \'{:.1f}\' -->x<!-- /results -->', DataError, 'not a single figure'),
    ('<!-- results: value run missing -->x<!-- /results -->', DataError, 'missing is null'),
    ('<!-- results: value run step cell -->x<!-- /results -->', DataError, "format 'cell' cannot write 12.5"),
    ('<!-- results: value run step x y -->x<!-- /results -->', UsageError, 'value: too many positional arguments'),
    ("<!-- results: value run 'step -->x<!-- /results -->", UsageError, 'No closing quotation'),
    ('<!-- results: tabel run -->x<!-- /results -->', UsageError, "unknown results block 'tabel run'"),
    ('Text <!-- results: table run\n| a |\n-->x<!-- /results -->', UsageError, 'stands on a line of its own'),
    ('<!-- results: value run step -->x\n\n<!-- results: value run step -->x<!-- /results -->', UsageError,
     'a results marker inside the block of line 3'),  # an unclosed block would take the next one with it
    ('<!-- result: value run step -->x<!-- /results -->', UsageError, 'a results marker outside a block'),
    ('<!-- results: value run step -->x<!-- /results --> <!-- /results -->', UsageError, 'outside a block'),
    ('<!-- results: runs \'Semantic Segmentaton\' -->x<!-- /results -->', DataError, 'no embedded default of'),
])
def test_a_block_that_cannot_render_is_one_error_naming_page_and_line(tmp_path, marker, error, message):
    figures = {'step': 12.5, 'zero': 0, 'nested': {'a': 1}, 'missing': None}
    root = page_and_data(tmp_path / 'repo', f'Title\n\n{marker}\n', run=envelope(figures))
    shutil.copytree(ROOT / 'seg_configs', root / 'seg_configs', ignore=lambda folder, names: [
        name for name in names if name != 'metafile.yaml'])
    with pytest.raises(error, match=f'README.md:[35]: .*{re.escape(message)}'):  # 5: the marker inside
        results_pages.render_pages(root, write=False)


def test_one_bad_page_leaves_every_page_as_it_was(tmp_path):
    """The pages are all rendered before any is written: an error in the second leaves the first unchanged."""
    root = page_and_data(tmp_path / 'repo', '<!-- results: value run step -->1<!-- /results -->\n',
                         run=envelope({'step': 2}))
    (root / 'docs' / 'later.md').write_text('<!-- results: value run absent -->1<!-- /results -->\n')
    with pytest.raises(DataError, match='docs/later.md:1: .*no absent'):
        results_pages.render_pages(root)
    assert (root / 'README.md').read_text() == '<!-- results: value run step -->1<!-- /results -->\n'
    (root / 'docs' / 'later.md').write_bytes(b'\xff\xfe not text\n')
    with pytest.raises(UsageError, match='later.md: not UTF-8 text'):
        results_pages.render_pages(root)


def test_a_value_takes_a_cells_format_too(tmp_path):
    root = page_and_data(tmp_path / 'repo', '<!-- results: value run step .1f -->x<!-- /results -->\n',
                         run=envelope({'step': 2.25}))
    results_pages.render_pages(root)
    assert (root / 'README.md').read_text() == '<!-- results: value run step .1f -->2.2<!-- /results -->\n'


def test_a_figure_holding_a_bar_stays_in_its_cell(tmp_path):
    page = '<!-- results: table run\n| note |\n|---|\n| {note} |\n-->\n<!-- /results -->\n'
    root = page_and_data(tmp_path / 'repo', page, run=envelope({'note': 'a | b'}))
    results_pages.render_pages(root)
    assert '| a \\| b |' in (root / 'README.md').read_text()


@pytest.mark.parametrize('machine, slug', [('2 CPU cores', 'cpu2'), ('NVIDIA H200, 16 CPU cores', 'h200'),
                                           ('NVIDIA H100 80GB HBM3, 16 CPU cores', 'h100'),
                                           ('NVIDIA GH200 480GB, 72 CPU cores', 'gh200'),
                                           ('NVIDIA L4, 8 CPU cores', 'l4'),
                                           ('NVIDIA GeForce RTX 4090, 16 CPU cores', 'rtx4090'),
                                           ('AMD Instinct MI300X, 64 CPU cores', 'mi300x')])
def test_a_results_file_is_named_by_its_machine(machine, slug):
    assert file_name(envelope({'a': 1}, study='loop', machine=machine)) == f'loop_{slug}_abc1234.json'


def test_a_results_file_without_its_commit_is_named_by_the_commit_that_first_quoted_it_or_its_papers_key():
    quoted = envelope({'a': 1}, study='burst', commit=None, notes={'commit': 'not recorded', 'first_quoted': 'e2f88b5'})
    assert file_name(quoted) == 'burst_cpu2_e2f88b5.json'
    paper = envelope({'a': 1}, study='token_labeling', commit=None, machine='published (the paper)',
                     notes={'commit': 'a publication', 'key': 'jiang2021'})
    assert file_name(paper) == 'token_labeling_paper_jiang2021.json'
    for notes in ({'commit': 'not recorded'}, {'commit': 'not recorded', 'first_quoted': '2026-11-24'}):
        with pytest.raises(DataError, match='no commit to name its file by'):  # no date stands in
            file_name(envelope({'a': 1}, commit=None, notes=notes))


def test_every_results_file_is_in_the_envelope_and_named_by_study_machine_and_commit():
    files = sorted((ROOT / 'docs' / 'results').glob('*.json'))
    assert files
    for path in files:
        document = check_envelope(json.loads(path.read_text()), str(path))
        assert path.name == file_name(document)


def test_the_metafile_holds_the_dense_defaults_of_every_task_and_the_readme_stays_narrow():
    files = DataFiles(ROOT)
    for task, score in (('Semantic Segmentation', 'mIoU'), ('Instance Segmentation', 'mask AP'),
                        ('Object Detection', 'box AP'), ('Depth Estimation', 'AbsRel')):
        table = embedded_runs(files, 'latest', task)
        assert re.search(rf'[ *]{re.escape(score)} \d', table), table
    long = [i for i, line in enumerate((ROOT / 'README.md').read_text().splitlines(), 1) if len(line) > 160]
    assert not long, f'README.md lines over 160 characters: {long}'
    # the runs on pages in a published set's layout render apart from the others
    in_layouts = embedded_runs(files, 'layouts', 'Semantic Segmentation')
    own = embedded_runs(files, 'latest', 'Semantic Segmentation')
    assert 'upernet_lvvit_s_cityscapes at' in in_layouts and 'upernet_lvvit_m at' not in in_layouts
    assert 'upernet_lvvit_m at' in own and 'cityscapes' not in own
    # each run a list item, wrapped: its scores and what they compare with, however many
    items = embedded_runs(files, 'Instance Segmentation', 'Depth Estimation')
    assert items.startswith('- maskrcnn_lvvit_s at ') and max(map(len, items.splitlines())) <= 118
    assert 'For comparison, the training set' in ' '.join(items.split())


def test_no_line_of_the_pages_is_over_200_characters():
    """The pages' sources stay readable: a long table row of a marker goes on over several lines (rendered as one),
    the runs and a GPU session's figures render as wrapped list items, prose tables whose rows would run long are
    lists."""
    long = [f'{page.relative_to(ROOT)}:{i}' for page in [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md'))]
            for i, line in enumerate(page.read_text().splitlines(), 1) if len(line) > 200]
    assert long == []


def test_a_root_without_the_pages_is_an_error_not_a_pass(tmp_path):
    (tmp_path / 'notes.txt').write_text('no pages here')
    for root in (tmp_path, tmp_path / 'absent'):  # a mistyped --root would check nothing and pass
        with pytest.raises(UsageError, match=f'{root}: no README.md there'):
            results_pages.render_pages(root, write=False)


def test_a_gpu_results_file_that_is_a_folder_is_refused_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit):
        gpu_session.build_parser().parse_args(['--smoke', '--device', 'cpu', '--out', str(tmp_path)])
    assert f'argument --out: {tmp_path}' in capsys.readouterr().err


def test_an_expression_is_a_path_into_the_figures_or_the_envelope():
    files, burst = DataFiles(ROOT), 'burst_h100_e2f88b5'
    lvvit = json.loads((ROOT / 'docs' / 'results' / f'{burst}.json').read_text())['figures']['models'][0]
    assert files.lookup(burst, 'models.0.pipeline_per_core_img_s.pil') == lvvit['pipeline_per_core_img_s']['pil']
    # a list item by its Name, a key holding spaces and a slash (mmseg's)
    meta = 'Models.upernet_lvvit_m_digits_212fcae.Metadata'
    assert files.lookup('metafile', f'{meta}.inference time (ms/im).0.value') == 531
    assert results_pages.value(files, burst, 'models.0.pipeline_15_workers_ceiling_img_s.batched', ',.0f') == (
        f'{15 * lvvit["pipeline_per_core_img_s"]["batched"]:,.0f}')
    assert files.lookup(burst, 'machine') == 'NVIDIA H100 80GB, 16 CPU cores'  # the envelope's own field
    with pytest.raises(DataError, match='no workers \\* models.0.pipeline_per_core_img_s.pil'):  # no arithmetic
        files.lookup(burst, 'workers * models.0.pipeline_per_core_img_s.pil')


def test_per_seed_values_render_as_mean_and_sample_deviation_and_anything_else_is_refused():
    assert formatted([70.0, 72.0, 77.0], 'spread') == '73.0 ± 3.6'  # sample stdev: sqrt(13)
    assert formatted([71.25], 'spread') == '71.2 ± 0.0'
    for value in (71.5, []):
        with pytest.raises(DataError, match='spread needs a list of per-seed values'):
            formatted(value, 'spread')


def smoke_call(tmp_path: Path, stages: list[str], *extra: str) -> tuple[dict, str]:
    """`measure_gpu.py --smoke --device cpu` with `stages` (one device call, at tiny sizes): the figures of its
    results file, which must be in the envelope, and its log."""
    out = tmp_path / f'{"-".join(stages)}.json'
    result = run_tool('measure_gpu.py', ['--stages', ','.join(stages), '--smoke', '--device', 'cpu', '--out', out,
                                         *extra], nested=True)
    assert result.returncode == 0, output(result)[-3000:]
    document = check_envelope(json.loads(out.read_text()), str(out))
    assert document['study'] == 'gpu_session' and document['machine'].endswith(' CPU cores')
    (work,) = re.findall(r'work folder (\S+)', output(result))
    assert not Path(work).exists()  # the stages' shared data and the compiler's cache went with it
    for stage in stages:  # each stage ran (none skipped), and what it imported reaches the device machine
        assert document['figures']['stages'][stage]['status'] in ('done', MEASURED_WRONG), stage
        assert import_failures_on_the_device(document['figures']['stages'][stage].get('modules', [])) == ''
    return document['figures'], output(result)


MEASURED_WRONG = 'exit 1: a figure above its ceiling (MEASUREMENT ERROR), recorded as such'


def session_table(tmp_path: Path, figures: dict) -> str:
    """The GPU session's figures as the docs render them, its lines joined (a list item's wrapped lines)."""
    (tmp_path / 'docs' / 'results').mkdir(parents=True, exist_ok=True)
    document = {'study': 'gpu_session', 'source': 'a smoke call', 'commit': 'abc1234', 'date': '2026-12-07',
                'machine': '2 CPU cores', 'torch': '2.15.0', 'figures': figures}
    (tmp_path / 'docs' / 'results' / 'smoke.json').write_text(json.dumps(document))
    return ' '.join(gpu_session_figures(DataFiles(tmp_path), 'smoke').split())


@pytest.mark.slow
def test_the_gpu_sessions_loop_benchmark_runs_on_a_cpu_at_smoke_sizes(tmp_path):
    session, _ = smoke_call(tmp_path, ['loop_benchmark'])
    assert session['calls'] == [['loop_benchmark']] and session['smoke']
    (loop,) = session['loop_benchmark']['models']
    assert loop['loop']['img_s'] > 0 and loop['loop']['serial_img_s'] > 0 and loop['train_cls']['img_s'] > 0
    assert loop['model_step_img_s'] > 0
    # a smoke window is one batch: on a busy machine a figure may exceed its ceiling, and is then recorded as such
    assert session['stages']['loop_benchmark']['status'] == (MEASURED_WRONG if loop['measurement_errors'] else 'done')
    assert '- the whole loop against its step (DeiT-S, the workers decoding): loop ' in session_table(tmp_path,
                                                                                                      session)


@pytest.mark.slow
@pytest.mark.parametrize('stage, model, row', [
    ('deit_loop', 'deit_tiny_patch16_224', '- the whole loop against its eager step (DeiT-S): --decode cpu, 1 workers'),
    ('lvvit_loop', 'lvvit_t', '- the same for LV-ViT-S with token labeling, eager: --decode cpu, 1 workers')])
def test_the_gpu_sessions_loops_against_their_steps_run_on_a_cpu_at_smoke_sizes(tmp_path, stage, model, row):
    session, _ = smoke_call(tmp_path, [stage])
    figures = session[stage]['models'][model]
    eager = figures['eager']
    assert eager['loop_img_s'] > 0 and eager['step_img_s'] > 0 and eager['tflop_s'] > 0
    assert eager['loop_of_step'] == pytest.approx(eager['loop_img_s'] / eager['step_img_s'])
    assert 0 <= eager['data_wait'] <= 1
    assert 'compiled' not in figures and session[stage]['decode'] == 'cpu'  # GPU only
    table = session_table(tmp_path, session)
    assert f'{row}: loop ' in table
    assert 'the compiled loop against its compiled step (DeiT-S)' in table.split('Not measured')[1]


@pytest.mark.slow
def test_the_gpu_sessions_dense_steps_run_on_a_cpu_at_smoke_sizes(tmp_path):
    session, _ = smoke_call(tmp_path, ['dense_steps'])
    dense = session['dense_steps']['configs']
    assert [step['task'] for step in dense.values()] == ['semantic', 'instances', 'depth']
    for step in dense.values():  # each config's own pipeline at x0.125: UperNet's 512 crop is 64, LSJ's 1024 128
        assert step['img_s'] > 0 and step['it_s'] == pytest.approx(step['img_s'] / 2) and step['batch_size'] == 2
    assert dense['upernet_lvvit_s']['largest_image'] == [64, 64] and dense['depth_lvvit_s']['largest_image'] == [60, 60]
    assert max(dense['maskrcnn_lvvit_s']['largest_image']) == 128
    table = session_table(tmp_path, session)
    assert "- the dense training steps (LV-ViT-S, fp32, each config's per-GPU batch): `upernet_lvvit_s` " in table
    assert 'it/s of 2, up to 64x64); `maskrcnn_lvvit_s` ' in table


@pytest.mark.slow
def test_the_gpu_sessions_window_comparison_runs_on_a_cpu_at_smoke_sizes(tmp_path):
    """Mask R-CNN with window attention against global attention, each in a fresh process."""
    session, _ = smoke_call(tmp_path, ['dense_windows'])
    windows = session['dense_windows']
    assert windows['global']['config'].endswith('maskrcnn_lvvit_s.py')
    assert windows['windows']['config'].endswith('maskrcnn_lvvit_s_windowed.py')
    assert windows['ratios']['windows']['time'] == pytest.approx(windows['global']['img_s'] /
                                                                 windows['windows']['img_s'])
    assert windows['ratios']['windows']['memory'] > 0 and windows['windows']['peak_process_gib'] > 0
    assert windows['ratios'].keys() == {'windows', 'windows_without_rel_pos'}
    table = session_table(tmp_path, {**session, 'dense_steps': {'configs': {}}})
    assert 'Mask R-CNN with window attention against global attention: x' in table


@pytest.mark.slow
def test_a_second_gpu_session_call_merges_into_the_first(tmp_path):
    """Two calls, as two device calls run them: the second's file holds the first's figures and both calls; on a CPU
    the decoding stage times the workers' decoding alone."""
    first, _ = smoke_call(tmp_path, ['label_generation'])
    labels = first['label_generation']
    assert labels['fp32_img_s'] > 0 and labels['bf16_img_s'] > 0
    both, log = smoke_call(tmp_path, ['decoding'], '--merge', tmp_path / 'label_generation.json')
    assert both['calls'] == [['label_generation'], ['decoding']] and both['label_generation'] == labels
    merged = json.loads((tmp_path / 'decoding.json').read_text())
    assert merged['source'].startswith('python tools/measure_gpu.py --stages label_generation --smoke')  # the first
    assert both['decoding']['cpu_img_s'] > 0 and 'gpu_img_s' not in both['decoding']
    assert 'decoding: nvJPEG is skipped on a CPU' in log
    table = session_table(tmp_path, both)
    assert 'Not measured in this session: ' in table and 'nvJPEG decoding' in table.split('Not measured')[1]


@pytest.mark.slow
@pytest.mark.parametrize('stage, row', [
    ('sync_canary', 'the sync canary (the sync-debug test of the loop with `--decode gpu`, eager and compiled)'),
    ('gpu_tests', 'the GPU suite (`pytest -m gpu`)')])
def test_the_gpu_sessions_pytest_stages_run_on_a_cpu_each_test_a_skip(tmp_path, stage, row):
    """The sync canary and the GPU suite: pytest runs, each outcome recorded (on a CPU every test is a skip)."""
    session, _ = smoke_call(tmp_path, [stage])
    tests = session[stage]
    assert set(tests['outcomes'].values()) == {'SKIPPED'} and tests['failed'] == tests['passed'] == 0
    if stage == 'sync_canary':  # its two tests alone
        assert sorted(tests['outcomes']) == sorted(test.split('::')[1] for test in gpu_plan.SYNC_CANARY)
    assert tests['skipped'] == len(tests['outcomes']) >= 2
    assert f'- {row}: 0 passed, 0 failed of 0, {tests["skipped"]} skipped in ' in session_table(tmp_path, session)


def test_stages_are_named_and_run_in_the_order_of_value():
    parse = gpu_session.build_parser().parse_args
    assert parse(['--out', 'x.json']).stages == list(gpu_plan.DEFAULT_STAGES)
    assert parse(['--stages', 'gpu_tests,deit_loop', '--out', 'x.json']).stages == ['deit_loop', 'gpu_tests']
    with pytest.raises(SystemExit):
        parse(['--stages', 'deit_loop,steps', '--out', 'x.json'])


def test_a_gpu_session_refuses_an_earlier_file_of_another_device_or_commit(tmp_path):
    earlier = tmp_path / 'gpu.json'
    earlier.write_text(json.dumps(envelope({'smoke': True}, study='gpu_session',
                                           machine='NVIDIA H100 80GB HBM3, 16 CPU cores')))
    result = run_tool('measure_gpu.py', ['--smoke', '--device', 'cpu', '--merge', earlier, '--out',
                                         tmp_path / 'out.json'])
    assert result.returncode == 2
    assert output(result).strip().splitlines()[-1].startswith(f"error: {earlier} holds figures of machine 'h100'")
    assert not (tmp_path / 'out.json').exists()

    earlier.write_text(json.dumps({'device': 'NVIDIA H100 80GB HBM3', 'commit': 'abc1234', 'smoke': False}))
    result = run_tool('measure_gpu.py', ['--smoke', '--device', 'cpu', '--merge', earlier, '--out',
                                         tmp_path / 'out.json'])
    assert result.returncode == 2 and f'error: {earlier}: not a results file' in output(result)
    assert not (tmp_path / 'out.json').exists()

    earlier.write_text(json.dumps(envelope({'models': []}, study='loop')))
    result = run_tool('measure_gpu.py', ['--smoke', '--device', 'cpu', '--merge', earlier, '--out',
                                         tmp_path / 'out.json'])
    assert result.returncode == 2 and "not a GPU session's results (its study is loop)" in output(result)

    other = tmp_path / 'other.json'  # an existing --out that is not the file merged: never overwritten
    other.write_text('{"kept": true}')
    result = run_tool('measure_gpu.py', ['--smoke', '--device', 'cpu', '--merge', earlier, '--out', other])
    assert result.returncode == 2 and f'--out {other} exists' in output(result)
    assert other.read_text() == '{"kept": true}'


def test_a_gpu_session_stopped_before_its_benchmark_document_renders_the_loop_from_its_progress_lines(tmp_path):
    progress = {'input pipeline, batched path, 0 workers': 300.0, 'input pipeline, batched path, 15 workers': 3000.0,
                'model step StepOptions(fused_optimizer=True) amp bf16': 5000.0,
                'whole loop, batched path, overlapped': 2500.0, 'whole loop, batched path, serial': 2000.0}
    figures = {'loop_benchmark_progress': progress, 'loop_from_progress': gpu_session.loop_from_progress(progress)}
    session = envelope(figures, study='gpu_session', machine='NVIDIA H200, 16 CPU cores')
    (tmp_path / 'docs' / 'results').mkdir(parents=True)
    (tmp_path / 'docs' / 'results' / 'cut.json').write_text(json.dumps(session))
    items = re.split(r'\n(?=- )', gpu_session_figures(DataFiles(tmp_path), 'cut'))  # a list item each
    row = ' '.join(next(item for item in items if item.startswith('- the whole loop against its step')).split())
    assert "loop 2,500 img/s against its step's 5,000: **x0.50**" in row
    assert 'serial loop 2,000 img/s (overlap x1.25)' in row and 'bound by the input pipeline (3,000 img/s' in row

    progress['input pipeline, batched path, 15 workers'] = 6000.0  # a pipeline faster than the step
    figures['loop_from_progress'] = gpu_session.loop_from_progress(progress)
    (tmp_path / 'docs' / 'results' / 'cut.json').write_text(json.dumps(session))
    assert 'bound by the model step' in gpu_session_figures(DataFiles(tmp_path), 'cut')
