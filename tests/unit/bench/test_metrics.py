"""etl.bench.metrics: AUC and log loss against hand-computed cases and a brute-force pair count."""

from __future__ import annotations

import math

import numpy as np
import pytest

from etl.bench.metrics import auc, log_loss


def pairs_auc(y: np.ndarray, s: np.ndarray) -> float:
    """Every (positive, negative) pair: 1 when the positive scores higher, 1/2 on a tie."""
    pos, neg = s[y == 1], s[y == 0]
    return float(np.mean([(a > b) + 0.5 * (a == b) for a in pos for b in neg]))


def test_auc_by_hand() -> None:
    assert auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8])) == 0.75
    assert auc(np.array([1, 0]), np.array([0.5, 0.5])) == 0.5
    assert auc(np.array([0, 1]), np.array([0.9, 0.1])) == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_auc_against_every_pair(seed: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 200)
    s = rng.integers(0, 20, 200) / 20  # many ties
    assert math.isclose(auc(y, s), pairs_auc(y, s), rel_tol=1e-12)


def test_auc_needs_both_classes() -> None:
    with pytest.raises(ValueError, match="both classes: 3 positives, 0 negatives"):
        auc(np.ones(3), np.arange(3))


def test_log_loss() -> None:
    assert math.isclose(log_loss(np.array([1, 0]), np.array([0.8, 0.3])), -(math.log(0.8) + math.log(0.7)) / 2)
    assert log_loss(np.array([1]), np.array([0.0])) == pytest.approx(-math.log(1e-7))
