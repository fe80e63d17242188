"""Figures over seeds: the paired comparison's interval against SciPy's paired t-test, and its wording."""
import json

import numpy as np
import pytest
from scipy.stats import ttest_rel

from classification.studies.statistics import describe_difference, mean_std, paired_difference


@pytest.mark.parametrize('seed', range(4))
def test_paired_interval_is_scipys_paired_t_test_interval(seed):
    rng = np.random.default_rng(seed)
    baseline = rng.normal(70, 5, 3 + seed)
    values = baseline + rng.normal(1.0, 2.0, len(baseline))
    mine = paired_difference(values.tolist(), baseline.tolist())
    reference = ttest_rel(values, baseline).confidence_interval(0.95)
    assert mine['mean'] == pytest.approx(np.mean(values - baseline))
    assert (mine['low'], mine['high']) == (pytest.approx(reference.low), pytest.approx(reference.high))
    assert mine['within_noise'] == (reference.low <= 0 <= reference.high) and mine['n'] == len(values)
    assert json.loads(json.dumps(mine)) == mine  # plain numbers: results.json holds them


def test_the_wording_says_within_noise_only_where_the_interval_holds_zero():
    ahead = paired_difference([80.0, 81.0, 82.0], [70.0, 70.5, 71.0])  # +10.5 +- a little
    noisy = paired_difference([80.0, 60.0, 75.0], [70.0, 70.0, 70.0])  # differences 10, -10, 5
    assert not ahead['within_noise'] and noisy['within_noise']
    assert describe_difference(ahead).startswith('+10.5 [+') and 'noise' not in describe_difference(ahead)
    assert describe_difference(noisy).endswith('(within noise)')
    single = paired_difference([80.0], [70.0])
    assert single['low'] is None and describe_difference(single) == '+10.0 (one seed: no interval)'
    with pytest.raises(ValueError, match='as many values'):
        paired_difference([1.0, 2.0], [1.0])
    assert mean_std([1.0, 3.0]) == {'mean': 2.0, 'std': pytest.approx(2 ** 0.5), 'n': 2}
