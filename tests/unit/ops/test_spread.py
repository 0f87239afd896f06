"""etl.ops.spread: Normalize's statistics of a column, the NaN/infinity refusal, and the collapse warning: raised
where one extreme value makes most normalized values one number, exact in its message, the same whatever the batches
and their order, and silent on ordinary columns."""

from __future__ import annotations

import random

import numpy as np
import pytest

from etl.backends import cpu
from etl.batch import Batch, Column
from etl.errors import FitError
from etl.ops.dense import Normalize
from etl.ops.spread import Spread

BULK = [float(v) for v in range(1, 51)]


def fitted(values: list[float], parts: int = 1, seed: int = 0) -> Normalize:
    """Normalize fitted on ``values`` cut into ``parts`` batches, each gathered apart and merged in a shuffled order."""
    op = Normalize(["x"])
    chunks = np.array_split(np.array(values, np.float64), parts)
    spreads = []
    for chunk in chunks:
        stats = op.new_stats(cpu)
        op.partial_fit(stats, Batch({"x": Column(chunk)}, len(chunk)), cpu)
        spreads.append(op.partials(stats, cpu)["x"])
    random.Random(seed).shuffle(spreads)
    merged = spreads[0]
    for s in spreads[1:]:
        merged = op.merge(merged, s)
    op.finalize_partials({"x": merged}, cpu)
    return op


def test_one_outlier_collapses_fifty_values_into_one():
    op = fitted(BULK + [1e39])
    assert op.fit_warnings() == [
        "Normalize: column 'x': normalized values collapse: std 1.39e+38 is dominated by max 1e+39; 50 of 51 non-zero values "
        "are normalized into one value (-0.1414214) (Clamp or Log1p before Normalize)"
    ]
    out = op.transform(Batch({"x": Column(np.array(BULK + [1e39]))}, 51), cpu)["x"].values.astype(np.float32)
    assert len(set(out[:50].tolist())) == 1  # what the warning says


def test_an_outlier_below_and_outliers_on_both_sides():
    assert "dominated by min -1e+39; 50 of 51 non-zero values are normalized into one value (0.1414214)" in fitted([-1e39] + BULK).warnings["x"]
    both = fitted([1e39, -1e39] + BULK).warnings["x"]  # values near 0: distinct float32 numbers, all within 1e-36 of 0
    assert "50 of 52 non-zero values are normalized into [-" in both and "e-37]" in both


def test_the_warning_is_the_same_in_any_order():
    """Batches gathered in any order, merged in any order (worker threads, cluster tasks): the same bits."""
    values = BULK * 40 + [1e39, 3e38] + [0.0] * 17
    random.Random(3).shuffle(values)
    for parts in (1, 7, len(values)):
        expected = fitted(values, parts)
        for seed in (1, 2, 3):
            op = fitted(values, parts, seed)
            assert op.warnings == expected.warnings and op.mean == expected.mean and op.std == expected.std
        assert "2,000 of 2,002 non-zero values" in expected.warnings["x"]  # zeros are not counted


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(BULK, id="ordinary"),
        pytest.param(BULK + [1e3], id="a moderate outlier"),
        pytest.param([5.0] * 10, id="constant"),
        pytest.param([0.0] * 10 + [1.0], id="mostly zeros"),
        pytest.param([1e8 + 0.1, 1e8 + 0.2, 1e8 + 0.3], id="large offset, small spread"),
        pytest.param((1.5e9 + np.arange(2000) * 997.0).tolist(), id="timestamps"),
        pytest.param(np.random.default_rng(5).lognormal(3, 3, 5000).tolist(), id="heavy tail"),
        pytest.param([1e39, 1e39, -1e39], id="only outliers"),
    ],
)
def test_ordinary_columns_have_no_warning(values):
    op = fitted(values, 3)
    assert op.fit_warnings() == [] and "warnings" not in op.state()[0]


def test_more_than_half_must_collapse():
    # the 50 small values collapse; 51 more spread from 1e37 to 1e39 keep their differences
    spread_out = np.geomspace(1e37, 1e39, 51).tolist()
    assert fitted(BULK + spread_out).fit_warnings() == []
    assert fitted(BULK + spread_out[:49]).fit_warnings() != []


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_or_infinite_values_are_refused_by_name(bad):
    with pytest.raises(FitError, match=r"Normalize: column 'x': 1 of 51 values to fit are NaN or infinite \(invalid input: FillMissing"):
        fitted(BULK + [bad], 2)


def test_overflowing_values_are_refused_as_before():
    with pytest.raises(FitError, match="mean or std beyond the float64 range"):
        fitted([1e308, 1e308])


def test_spread_merge_is_exact():
    a, b = Spread(), Spread()
    a.add((2, 3.0, 0.5), (np.eye(1, 4096, 1023, np.int64)[0] * 2, 1.0, 2.0))
    b.add((1, 8.0, 0.0), (np.eye(1, 4096, 1026, np.int64)[0], 8.0, 8.0))
    m = a.merged(b)
    assert m.moments == [(1, 8.0, 0.0), (2, 3.0, 0.5)] and m.low == 1.0 and m.high == 8.0
    assert m.counts[1023] == 2 and m.counts[1026] == 1 and m.counts.sum() == 3
    assert a.counts.sum() == 2  # merged makes a new spread
