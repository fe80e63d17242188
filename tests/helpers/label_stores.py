"""Two token-label stores of the same images compared: the same annotation up to how it was computed."""
from pathlib import Path

import numpy as np


def read_store(root: Path) -> tuple[np.ndarray, np.ndarray]:
    """A store's (scores as float32, class indices), every row."""
    return np.load(root / 'scores.npy').astype(np.float32), np.load(root / 'classes.npy')


def assert_same_annotation(reference: Path, other: Path, tolerance: float, agreement: float) -> None:
    """`other` holds `reference`'s top-k up to a computation `tolerance` (a fraction of the largest score).

    Scores: every stored score within the tolerance of the reference's at its rank (sorting moves no value by
    more than the largest change), plus fp16 rounding. Classes: the same at every rank whose reference score is
    more than twice the tolerance away from the ranks above and below (no error within the tolerance can reorder
    those; the last rank's neighbour below is not stored, so it is not checked), and at `agreement` of all
    (position, rank) pairs."""
    assert (other / 'paths.txt').read_text() == (reference / 'paths.txt').read_text()
    scores, classes = read_store(reference)
    other_scores, other_classes = read_store(other)
    atol = tolerance * np.abs(scores).max()
    np.testing.assert_allclose(other_scores, scores, atol=atol, rtol=2 ** -10)
    gap_above = np.concatenate([np.full_like(scores[..., :1], np.inf), -np.diff(scores, axis=-1)], axis=-1)
    gap_below = np.concatenate([-np.diff(scores, axis=-1), np.zeros_like(scores[..., :1])], axis=-1)
    clear = (gap_above > 2 * atol) & (gap_below > 2 * atol)
    assert clear.mean() > 0.3, f'only {clear.mean():.0%} of the ranks are clear of ties: the check says little'
    assert (other_classes == classes)[clear].all()
    assert (other_classes == classes).mean() >= agreement
