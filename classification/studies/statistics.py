"""Figures over seeds: mean and standard deviation, and the paired comparison of two settings run with the same
seeds (same initialisation and data order), with Student's t interval of the mean difference."""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from scipy.stats import t as student_t

CONFIDENCE = 0.95


def mean_std(values: Sequence[float]) -> dict:
    """{'mean', 'std' (sample standard deviation; 0 for one value), 'n'}."""
    return {'mean': statistics.fmean(values), 'std': statistics.stdev(values) if len(values) > 1 else 0.0,
            'n': len(values)}


def paired_difference(values: Sequence[float], baseline: Sequence[float], confidence: float = CONFIDENCE) -> dict:
    """The mean of values[i] - baseline[i] over pairs (the same seed) and its `confidence` t interval ('low',
    'high'; None with fewer than two pairs); 'within_noise' when the interval holds 0 (or cannot be computed)."""
    if len(values) != len(baseline) or not values:
        raise ValueError(f'a paired comparison needs as many values as baseline values, got {len(values)} and '
                         f'{len(baseline)}')
    differences = [a - b for a, b in zip(values, baseline)]
    mean, n = statistics.fmean(differences), len(differences)
    if n < 2:
        return {'mean': mean, 'low': None, 'high': None, 'n': n, 'within_noise': True}
    half = float(student_t.ppf((1 + confidence) / 2, n - 1)) * statistics.stdev(differences) / math.sqrt(n)
    low, high = mean - half, mean + half
    return {'mean': mean, 'low': low, 'high': high, 'n': n, 'within_noise': low <= 0 <= high}


def describe_interval(difference: dict) -> str:
    """'+3.1 [+1.2, +5.0]': the mean difference and its interval ('+3.1' alone for a single pair)."""
    text = f'{difference["mean"]:+.1f}'
    return text if difference['low'] is None else text + f' [{difference["low"]:+.1f}, {difference["high"]:+.1f}]'


def describe_difference(difference: dict) -> str:
    """'+3.1 [+1.2, +5.0]', with '(within noise)' where the interval holds 0; a single pair has no interval."""
    if difference['low'] is None:
        return describe_interval(difference) + ' (one seed: no interval)'
    return describe_interval(difference) + (' (within noise)' if difference['within_noise'] else '')
