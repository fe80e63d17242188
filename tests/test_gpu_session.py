"""The GPU session's plan and its guards (tools/measure_gpu.py, classification/studies/gpu_plan.py and
gpu_session.py): the default stages fit two device calls of one session, a stage is killed at its own limit and the
next one runs, `--commit` is the source's commit whatever the device copy's git says. The smoke runs of the stages
are in test_results_pages.py."""
from __future__ import annotations

import argparse
import json
import re

import pytest

from backbones.common.errors import UsageError
from classification.studies import gpu_plan, gpu_session
from helpers.commands import ROOT

CALL = re.compile(r'^call (\d+), predicted (\d+) s \((.*)\):\n +python3 tools/measure_gpu.py --stages (\S+) '
                  r'--budget (\d+) ', re.MULTILINE)


def test_the_default_stages_fit_two_calls_of_a_session_the_canary_first(capsys):
    predicted = gpu_plan.call_predictions(list(gpu_plan.DEFAULT_STAGES), gpu_plan.GPU)
    assert list(predicted)[0] == 'sync_canary' and sum(predicted.values()) <= 950
    assert gpu_session.main(['--plan', '900']) == 0
    printed = capsys.readouterr().out
    calls = CALL.findall(printed)
    assert [number for number, *_ in calls] == ['1', '2']
    assert all(int(seconds) <= int(budget) <= gpu_plan.MAX_CALL for _, seconds, _, _, budget in calls)
    placed = [stage for *_, stages, _ in calls for stage in stages.split(',')]
    assert placed == list(gpu_plan.DEFAULT_STAGES) and 'not fitting: none' in printed
    # the device time: the machine's start, then each call's budget and what it spends beside it
    spent = gpu_plan.MACHINE_START + sum(int(budget) + gpu_plan.CALL_OVERHEAD for *_, budget in calls)
    assert spent <= 900
    assert printed.count('--merge .gpu/gpu.json') == 1  # the second call's
    assert printed.startswith('900 s of device time') and 'pycocotools==' in printed  # the wheels to prepare
    speed = (ROOT / 'docs' / 'speed.md').read_text()  # the page shows the plan as the tool prints it
    assert f'```text\n{printed}```' in speed


def test_a_plan_names_the_stages_that_fit_no_call_and_packs_each_call_within_its_budget():
    calls, unfitted = gpu_plan.session_plan(900, list(gpu_plan.STAGE_ORDER))
    assert unfitted and 'gpu_tests' in unfitted and calls[0].stages[0] == 'sync_canary'
    for call in calls:
        stages = gpu_plan.call_predictions(list(call.stages), gpu_plan.GPU)
        assert call.predicted == sum(stages.values()) + gpu_plan.RESERVE <= call.budget <= gpu_plan.MAX_CALL
    placed = [stage for call in calls for stage in call.stages]
    assert sorted(placed + unfitted) == sorted(gpu_plan.STAGE_ORDER)
    assert gpu_plan.session_plan(100, ['deit_loop']) == ([], ['deit_loop'])  # the machine's start and no room


def test_stages_of_one_call_share_its_data_built_by_the_first_that_needs_it():
    alone = gpu_plan.predicted_seconds('decoding', gpu_plan.GPU)
    after = gpu_plan.call_predictions(['deit_loop', 'decoding'], gpu_plan.GPU)['decoding']
    assert alone - after == gpu_plan.SETUP_SECONDS['data']


def test_a_stage_is_limited_to_its_own_multiple_of_its_prediction_where_the_call_has_more():
    assert gpu_session.stage_limit(100.0, 500.0, smoke=False) == (150.0, True)
    assert gpu_session.stage_limit(100.0, 120.0, smoke=False) == (120.0, False)
    assert gpu_session.stage_limit(100.0, 500.0, smoke=True) == (500.0, False)  # a CPU's lengths are not predicted


def test_a_stage_past_its_limit_is_killed_recorded_as_timed_out_and_the_next_stage_runs(tmp_path, monkeypatch):
    """label_generation predicted at 2 s: its process (the imports alone take longer) is killed at 3 s."""
    ran = []
    monkeypatch.setattr(gpu_session, 'call_predictions', lambda stages, sizes: {'label_generation': 2.0,
                                                                                 'decoding': 1.0})
    monkeypatch.setitem(gpu_session.STAGES, 'decoding', lambda results, args, limit: ran.append(limit) or 'done')
    args = argparse.Namespace(device='cpu', commit='abc1234', smoke=False, sizes=gpu_plan.SMOKE, seconds=None,
                              out=str(tmp_path / 'gpu.json'), merge=None, stages=['label_generation', 'decoding'],
                              budget=100.0)
    gpu_session.run_stages(args, None)
    stages = json.loads((tmp_path / 'gpu.json').read_text())['figures']['stages']
    assert stages['label_generation']['status'].startswith('timed out: killed at 3 s, 1.5x its predicted 2 s')
    assert stages['label_generation']['seconds'] >= 3.0 and 'label_generation' not in stages['decoding']
    assert stages['decoding']['status'] == 'done' and ran == [1.5]


def test_the_commit_given_is_recorded_with_a_warning_where_the_copys_git_disagrees_or_is_unreadable(monkeypatch,
                                                                                                  caplog):
    for checked in ('1234abc', None):
        monkeypatch.setattr(gpu_session, 'checkout_commit', lambda: checked)
        caplog.clear()
        with caplog.at_level('WARNING', logger='vit_dense'):
            document = gpu_session.session_document('cpu', 'abc1234', True, None)
        assert document['commit'] == 'abc1234'
        assert f"--commit abc1234: this copy's git says {checked or 'nothing readable'}" in caplog.text
    monkeypatch.setattr(gpu_session, 'checkout_commit', lambda: 'abc1234f')  # a longer abbreviation of the same
    caplog.clear()
    assert gpu_session.session_document('cpu', 'abc1234', True, None)['commit'] == 'abc1234'
    assert '--commit' not in caplog.text
    monkeypatch.setattr(gpu_session, 'checkout_commit', lambda: None)
    with pytest.raises(UsageError, match='give --commit'):
        gpu_session.session_document('cpu', None, True, None)
