"""TargetEncode's statistics: the accumulator counts every (key, fold) exactly through its table's growth, merging
is exact in any order and grouping, sums too large for exactness are refused, and the encodings follow the
documented formulas (checked against Python's own arithmetic on the same sums)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from etl.ops.target_stats import (
    MAX_ABS_UNITS,
    UNITS,
    FoldStats,
    FoldSums,
    full_encodings,
    merge_stats,
    out_of_fold_encodings,
    target_units,
)


def counted(keys: np.ndarray, folds: np.ndarray, target: np.ndarray, kfold: int, present: np.ndarray | None = None) -> FoldStats:
    acc = FoldSums(kfold)
    present = np.ones(len(keys), np.bool_) if present is None else present
    acc.add(keys, folds, target_units(np.where(present, target, 0.0)), present)
    return acc.stats()


def test_units_round_to_two_to_the_minus_twenty() -> None:
    assert target_units(np.array([0.0, 1.0, -0.5, 4.5, 2.0**-21, 3 * 2.0**-21, 0.1])).tolist() == [
        0, UNITS, -UNITS // 2, 9 * UNITS // 2, 0, 2, round(0.1 * UNITS)]  # fmt: skip


def test_every_key_and_fold_is_counted_through_the_growth_of_the_table() -> None:
    rng = np.random.default_rng(1)
    n = 50_000
    keys = rng.integers(0, 2**64, 9_000, dtype=np.uint64)[rng.integers(0, 9_000, n)]
    folds = rng.integers(0, 4, n)
    target = rng.integers(0, 11, n) / 2
    present = rng.random(n) > 0.1
    s = counted(keys, folds, target, 4, present)
    want: dict[tuple[int, int], list[float]] = {}
    for k, f, t, p in zip(keys.tolist(), folds.tolist(), target.tolist(), present.tolist()):
        if p:
            w = want.setdefault((k, f), [0, 0.0])
            w[0] += 1
            w[1] += t
    assert list(zip(s.keys.tolist(), s.folds.tolist())) == sorted(want)
    assert s.counts.tolist() == [want[k][0] for k in sorted(want)]
    assert (s.units / UNITS).tolist() == [want[k][1] for k in sorted(want)]
    assert s.fold_counts.tolist() == [int(((folds == f) & present).sum()) for f in range(4)]
    assert (s.fold_units / UNITS).tolist() == [float(target[(folds == f) & present].sum()) for f in range(4)]


def test_merging_is_the_same_in_any_order_and_grouping() -> None:
    rng = np.random.default_rng(2)
    n = 6_000
    keys = rng.integers(0, 300, n).astype(np.uint64)
    folds = rng.integers(0, 3, n)
    target = rng.standard_normal(n) * 100  # not multiples of 2**-20: rounded, still exact sums
    whole = counted(keys, folds, target, 3)
    parts = [counted(keys[r], folds[r], target[r], 3) for r in np.array_split(np.arange(n), 5)]
    for order in itertools.islice(itertools.permutations(parts), 0, None, 17):
        merged = order[0]
        for p in order[1:]:
            merged = merge_stats(p, merged)
        for field in ("keys", "folds", "counts", "units", "fold_counts", "fold_units"):
            np.testing.assert_array_equal(getattr(merged, field), getattr(whole, field), err_msg=field)
    grouped = merge_stats(merge_stats(parts[0], parts[1]), merge_stats(merge_stats(parts[2], parts[3]), parts[4]))
    np.testing.assert_array_equal(grouped.units, whole.units)
    empty = FoldStats.empty(3)
    np.testing.assert_array_equal(merge_stats(empty, whole).units, whole.units)


def test_magnitudes_too_large_for_exact_sums_are_refused() -> None:
    acc = FoldSums(2)
    acc.add(np.array([1], np.uint64), np.array([0]), target_units(np.array([3.0])), np.ones(1, np.bool_))
    n = 3_000  # each 2**51 units: their sum would pass 2**62
    with pytest.raises(OverflowError, match="too large for exact sums"):
        acc.add(np.arange(n, dtype=np.uint64), np.zeros(n, np.int64), target_units(np.full(n, 2.0**31)), np.ones(n, np.bool_))
    assert acc.stats().counts.tolist() == [1], "nothing of the refused batch is counted"
    big = FoldStats.empty(2)
    big.abs_units = MAX_ABS_UNITS
    with pytest.raises(OverflowError, match="too large"):
        merge_stats(big, counted(np.array([1], np.uint64), np.array([0]), np.array([1.0]), 2))
    with pytest.raises(ValueError, match="do not merge"):
        merge_stats(FoldStats.empty(2), FoldStats.empty(3))


def test_encodings_follow_the_documented_formulas() -> None:
    keys = np.array([5, 5, 5, 9, 9, 7], np.uint64)
    folds = np.array([0, 1, 1, 0, 2, 2])
    target = np.array([1.0, 0.0, 1.0, 1.0, 0.5, 0.0])
    s = counted(keys, folds, target, 3)
    m = 3.0
    cats, full = full_encodings(s, m)
    assert cats.tolist() == [5, 7, 9]
    prior = 3.5 / 6
    assert full.tolist() == [prior, prior, (2 + m * prior) / (3 + m), (0 + m * prior) / (1 + m), (1.5 + m * prior) / (2 + m)]
    oof = out_of_fold_encodings(s, m).reshape(5, 3)
    fold_n, fold_s = [2, 2, 2], [2.0, 1.0, 0.5]
    p_f = [(3.5 - fold_s[f]) / (6 - fold_n[f]) for f in range(3)]
    assert oof[0].tolist() == p_f and oof[1].tolist() == p_f
    per = {5: {0: (1, 1.0), 1: (2, 1.0)}, 7: {2: (1, 0.0)}, 9: {0: (1, 1.0), 2: (1, 0.5)}}
    for e, k in enumerate([5, 7, 9]):
        n_c, s_c = sum(c for c, _ in per[k].values()), sum(x for _, x in per[k].values())
        for f in range(3):
            n_cf, s_cf = per[k].get(f, (0, 0.0))
            assert oof[2 + e, f] == ((s_c - s_cf) + m * p_f[f]) / ((n_c - n_cf) + m), (k, f)


def test_without_smoothing_a_category_seen_only_in_its_fold_gets_the_folds_prior() -> None:
    s = counted(np.array([1, 2, 2], np.uint64), np.array([0, 0, 1]), np.array([1.0, 0.0, 1.0]), 2)
    oof = out_of_fold_encodings(s, 0.0).reshape(4, 2)
    p_f = [1.0 / 1, 1.0 / 2]  # outside fold 0: one row (1.0); outside fold 1: two rows (1.0, 0.0)
    assert oof[2].tolist() == [p_f[0], 1.0]  # key 1: only in fold 0, so nothing of it outside fold 0 (the prior); fold 1 sees its 1.0
    assert oof[3].tolist() == [1.0, 0.0]  # key 2: fold 0 sees fold 1's 1.0, fold 1 sees fold 0's 0.0
    empty = FoldStats.empty(2)
    _, full = full_encodings(empty, 0.0)
    assert full.tolist() == [0.0, 0.0] and out_of_fold_encodings(empty, 0.0).tolist() == [0.0] * 4
