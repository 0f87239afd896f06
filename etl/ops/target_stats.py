"""The statistics of ``TargetEncode`` (``etl.ops.target``): the target's count and sum per (category, fold), as an
accumulator, as plain data that merges in any order, and the encodings they give.

Exact sums. A target value ``t`` is counted as ``units(t) = round(t * 2**20)`` (to the nearest integer, ties to
even), an int64: 0/1 labels, ratings in halves and integers are exact, any other value is taken to 2**-20. Sums of
units are integers, so a sum is the same whatever the order or grouping of the rows: the statistics, and the
encodings computed from them, are the same bits on any number of workers, threads or Dask partitions. A target
beyond ``MAX_TARGET`` in magnitude is invalid input (``TargetEncode.check_sources``); a sum of units beyond
``MAX_SUM_UNITS`` (2**53: where a float64 stops holding every integer; a target sum of about 8.6e9) is refused at
finalize (``FitError``), so that the float64 sums kept in the fitted tables are exact.

- ``FoldSums``: the accumulator of one encoded column: a hash table of (category key, fold) → (count, units), a
  numba kernel over each batch, with the per-fold totals.
- ``FoldStats``: the same as plain data (numpy arrays, ints): entries sorted by key then fold. ``merge_stats`` sums
  equal entries: associative and commutative.
- ``full_encodings`` and ``out_of_fold_encodings``: what a fitted column computes from its ``FoldStats`` (see
  ``TargetEncode`` for the formulas): the full-statistics encoding of each category, and its out-of-fold encoding
  per fold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from etl.backends.cpu import fmix64

#: Units of the target per 1 (a target is counted as the nearest multiple of 1 / UNITS).
UNITS = 1 << 20
#: The largest target magnitude taken (beyond it, the row is invalid).
MAX_TARGET = float(1 << 31)
#: The largest magnitude of a sum of units (2**53: every integer up to it is a float64).
MAX_SUM_UNITS = 1 << 53
#: The largest sum of target magnitudes, in units, an accumulator takes (int64 arithmetic never wraps below it).
MAX_ABS_UNITS = 1 << 62

_jit = nb.njit(nogil=True, cache=True)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


#: Why statistics are refused when the target magnitudes sum beyond ``MAX_ABS_UNITS``.
TOO_LARGE = "the target magnitudes sum beyond 2**42: too large for exact sums"


def checked_magnitude(before: float, units: np.ndarray) -> float:
    """``before`` plus the magnitudes of ``units`` (summed in float64: no overflow, and exact enough for a bound 2**62
    far below int64's end); ``OverflowError`` when beyond ``MAX_ABS_UNITS``."""
    total = before + float(np.abs(units).sum(dtype=np.float64))
    if total > MAX_ABS_UNITS:
        raise OverflowError(TOO_LARGE)
    return total


def target_units(values: np.ndarray) -> np.ndarray:
    """The int64 units of float target values (each ``|t| <= MAX_TARGET``): ``round(t * 2**20)``, ties to even."""
    return np.rint(np.asarray(values, np.float64) * UNITS).astype(np.int64)


# ---------------------------------------------------------------- the accumulator (numba)
#
# One (capacity, 4) uint64 table, a power-of-two number of slots of [key, fold + 1, count, units] (fold + 1 = 0: an
# empty slot; units as the uint64 bits of the int64 sum, whose additions wrap alike), linear probing from
# fmix64(key ^ fold * golden).


@_jit
def _add(tab, keys, folds, units, present, totals, start, size):
    """Add rows ``start..`` (those ``present``) to ``tab`` and ``totals`` ([folds, 2]: count, units) until the end or
    until the table is half full; returns (row reached, entries in the table)."""
    mask = np.uint64(len(tab) - 1)
    limit = len(tab) // 2
    for i in range(start, len(keys)):
        if size >= limit:
            return i, size
        if not present[i]:
            continue
        k = keys[i]
        f = np.uint64(folds[i] + 1)
        j = np.int64(fmix64(k ^ (f * _GOLDEN)) & mask)
        while tab[j, 1] != 0 and (tab[j, 0] != k or tab[j, 1] != f):
            j = (j + 1) & np.int64(mask)
        if tab[j, 1] == 0:
            tab[j, 0] = k
            tab[j, 1] = f
            size += 1
        u = units[i]
        tab[j, 2] += np.uint64(1)
        tab[j, 3] += np.uint64(u)
        fi = folds[i]
        totals[fi, 0] += 1
        totals[fi, 1] += u
    return len(keys), size


@_jit
def _rehash(old, new):
    mask = np.uint64(len(new) - 1)
    for i in range(len(old)):
        if old[i, 1] != 0:
            j = np.int64(fmix64(old[i, 0] ^ (old[i, 1] * _GOLDEN)) & mask)
            while new[j, 1] != 0:
                j = (j + 1) & np.int64(mask)
            new[j] = old[i]


class FoldSums:
    """The count and the sum of target units of every (category key, fold) seen, over batches, in memory
    proportional to the distinct pairs (32-byte slots, load factor at most 1/2), and the per-fold totals."""

    def __init__(self, kfold: int) -> None:
        self.kfold = kfold
        self.table = np.zeros((1024, 4), np.uint64)
        self.size = 0
        self.totals = np.zeros((kfold, 2), np.int64)  # per fold: rows, units
        self.abs_units = 0.0  # the target magnitudes taken, in units (a bound: int64 sums stay exact below MAX_ABS_UNITS)

    def add(self, keys: np.ndarray, folds: np.ndarray, units: np.ndarray, present: np.ndarray) -> None:
        """Count the rows ``present`` (a bool mask): category ``keys`` (uint64), ``folds`` (int64 in [0, kfold)),
        target ``units`` (int64, ``target_units``). ``OverflowError`` (nothing added) when the target magnitudes
        would sum beyond ``MAX_ABS_UNITS``."""
        self.abs_units = checked_magnitude(self.abs_units, units[present])
        i = 0
        while i < len(keys):
            i, self.size = _add(self.table, keys, folds, units, present, self.totals, i, self.size)
            if i < len(keys):
                new = np.zeros((2 * len(self.table), 4), np.uint64)
                _rehash(self.table, new)
                self.table = new

    def stats(self) -> FoldStats:
        """The statistics as plain data (entries by key, then fold)."""
        used = self.table[self.table[:, 1] != 0]
        return FoldStats.of(used[:, 0].copy(), (used[:, 1] - np.uint64(1)).astype(np.int64), used[:, 2].astype(np.int64),
                            used[:, 3].view(np.int64).copy(), self.totals[:, 0].copy(), self.totals[:, 1].copy(), self.abs_units)  # fmt: skip


# ---------------------------------------------------------------- plain data


@dataclass
class FoldStats:
    """What some rows contribute to one encoded column: distinct (``keys`` uint64, ``folds`` int64) entries in
    ascending (key, fold) order with their ``counts`` (int64, >= 1) and ``units`` (int64 sums of target units); the
    rows and units of each fold (``fold_counts``, ``fold_units``: [kfold] int64, every row with a target), and the
    sum of the target magnitudes in units (``abs_units``, a float64 bound: it keeps the int64 sums exact)."""

    keys: np.ndarray
    folds: np.ndarray
    counts: np.ndarray
    units: np.ndarray
    fold_counts: np.ndarray
    fold_units: np.ndarray
    abs_units: float = 0.0

    @classmethod
    def of(cls, keys: np.ndarray, folds: np.ndarray, counts: np.ndarray, units: np.ndarray, fold_counts: np.ndarray,
           fold_units: np.ndarray, abs_units: float) -> FoldStats:  # fmt: skip
        """Statistics from distinct entries in any order (sorted here)."""
        order = np.lexsort((folds, keys))
        return cls(keys[order], folds[order], counts[order], units[order], fold_counts, fold_units, abs_units)

    @classmethod
    def empty(cls, kfold: int) -> FoldStats:
        z = np.zeros(0, np.int64)
        return cls(np.zeros(0, np.uint64), z, z, z, np.zeros(kfold, np.int64), np.zeros(kfold, np.int64), 0.0)

    @property
    def kfold(self) -> int:
        return len(self.fold_counts)

    def widest_sum(self) -> int:
        """The largest magnitude among the entries' and the folds' sums of units (0 when none)."""
        entries = int(np.abs(self.units).max()) if len(self.units) else 0
        return max(entries, int(np.abs(self.fold_units).max()) if len(self.fold_units) else 0)


def merge_stats(a: FoldStats, b: FoldStats) -> FoldStats:
    """The statistics of the union of the rows of ``a`` and ``b`` (same kfold): equal entries summed.
    ``OverflowError`` when the target magnitudes sum beyond ``MAX_ABS_UNITS``."""
    if a.kfold != b.kfold:
        raise ValueError(f"statistics of {a.kfold} and {b.kfold} folds do not merge")
    abs_units = a.abs_units + b.abs_units
    if abs_units > MAX_ABS_UNITS:
        raise OverflowError(TOO_LARGE)
    keys = np.concatenate([a.keys, b.keys])
    folds = np.concatenate([a.folds, b.folds])
    order = np.lexsort((folds, keys))
    keys, folds = keys[order], folds[order]
    starts = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]) | (folds[1:] != folds[:-1])]) if len(keys) else np.zeros(0, np.int64)
    counts = np.concatenate([a.counts, b.counts])[order]
    units = np.concatenate([a.units, b.units])[order]
    if len(keys):
        counts, units = np.add.reduceat(counts, starts), np.add.reduceat(units, starts)
    return FoldStats(keys[starts], folds[starts], counts, units, a.fold_counts + b.fold_counts, a.fold_units + b.fold_units, abs_units)


# ---------------------------------------------------------------- encodings


def priors(stats: FoldStats) -> tuple[float, np.ndarray]:
    """The prior ``P = S / N`` (S, N: the target sum and the rows over every fold; 0 when N is 0) and each fold's
    ``P_f = (S - S_f) / (N - N_f)`` (float64 [kfold]; 0 when no row lies outside fold f)."""
    total_count, total_units = int(stats.fold_counts.sum()), int(stats.fold_units.sum())
    prior = total_units / UNITS / total_count if total_count else 0.0
    outside_count = total_count - stats.fold_counts
    outside_units = total_units - stats.fold_units
    per_fold = np.zeros(stats.kfold, np.float64)
    some = outside_count > 0
    per_fold[some] = outside_units[some] / UNITS / outside_count[some]
    return prior, per_fold


def full_encodings(stats: FoldStats, smoothing: float) -> tuple[np.ndarray, np.ndarray]:
    """The categories of ``stats`` (ascending keys) and the table of their full-statistics encodings (float64
    [2 + n]): rows 0 and 1 the prior P (an unseen category), then category c's ``(S_c + smoothing * P) / (N_c +
    smoothing)``."""
    keys, starts, _ = _categories(stats)
    count_c, units_c = _per_category(stats.counts, starts), _per_category(stats.units, starts)
    prior, _ = priors(stats)
    m = float(smoothing)
    table = np.empty(2 + len(keys), np.float64)
    table[:2] = prior
    table[2:] = (units_c / UNITS + m * prior) / (count_c + m)
    return keys, table


def out_of_fold_encodings(stats: FoldStats, smoothing: float) -> np.ndarray:
    """The out-of-fold encodings (float64 [(2 + n) * kfold], n the categories of ``full_encodings`` in its order):
    row ``e * kfold + f`` for category entry e (2 + its position) and a training row of fold f; entries 0 and 1 hold
    the fold's prior ``P_f``. With ``n_cf = N_c - N_cf`` and ``s_cf = S_c - S_cf``: ``(s_cf + smoothing * P_f) /
    (n_cf + smoothing)``, or ``P_f`` when ``n_cf + smoothing`` is 0."""
    k, m = stats.kfold, float(smoothing)
    keys, starts, entry = _categories(stats)
    n = len(keys)
    rest_count = np.repeat(_per_category(stats.counts, starts)[:, None], k, axis=1)
    rest_units = np.repeat(_per_category(stats.units, starts)[:, None], k, axis=1)
    rest_count[entry, stats.folds] -= stats.counts
    rest_units[entry, stats.folds] -= stats.units
    _, per_fold = priors(stats)
    prior_f = np.broadcast_to(per_fold, (n, k))
    denominator = rest_count + m
    seen = denominator > 0
    encoded = prior_f.copy()
    encoded[seen] = (rest_units[seen] / UNITS + m * prior_f[seen]) / denominator[seen]
    out = np.empty((2 + n, k), np.float64)
    out[:2] = per_fold
    out[2:] = encoded
    return out.reshape(-1)


def _categories(stats: FoldStats) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct keys of ``stats`` (its entries are sorted by key), the first entry of each, and each entry's
    category position."""
    if not len(stats.keys):
        return stats.keys, np.zeros(0, np.int64), np.zeros(0, np.int64)
    first = np.r_[True, stats.keys[1:] != stats.keys[:-1]]
    return stats.keys[first], np.flatnonzero(first), np.cumsum(first) - 1


def _per_category(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The sums (int64, exact) of the runs of ``values`` beginning at ``starts``."""
    return np.add.reduceat(values, starts) if len(starts) else np.zeros(0, np.int64)
