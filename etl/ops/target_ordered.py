"""TargetEncode's ``mode: ordered`` (``etl.ops.target``): each row's value from the rows strictly before it in the
stream, as the Loader gives them (CatBoost's ordered target statistics), kept as a streaming state
(``etl.ops.stream``) per encoded column.

The state: per category (its key, as in ``etl.ops.target``) the rows with a target seen so far (``count``) and the
sum of their target units (``units``: targets counted to 2**-20, ``etl.ops.target_stats``), and over every such
row, the scalars ``rows`` (N) and ``total_units`` (S, in units). Each epoch of a loader starts it empty
(``per_epoch``): a row never meets its own target, not even one an earlier epoch saw. For each row, in the loader's
row order (within a batch too), with ``m = smoothing``:

- its value is ``(s_c + m * P) / (n_c + m)``, with ``n_c``, ``s_c`` its category's count and target sum so far,
  and ``P = S / N`` the mean target of every row so far (0 before the first); ``P`` when ``n_c + m`` is 0 (no
  smoothing, category not seen yet). Computed in float64 from the exact sums, written as float32;
- then, when its target is present, the row counts: its category's and the overall count and sum take it.

The state grows with the categories seen (32-byte slots of a hash table, at most half full); each batch's undo
record is its rows' keys and target units (17 bytes a row). Its export is the arrays ``key`` (uint64, ascending in
canonical order), ``count`` and ``units`` (int64) and the scalars; ``check`` takes a state only when each key
appears once with a count >= 1 and the entries add up to the scalars exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numba as nb
import numpy as np

from etl.backends.cpu import fmix64
from etl.ops.base import InvalidState
from etl.ops.stream import Carried, StateArrays, StreamSpec, StreamState, StreamStep
from etl.ops.target_stats import UNITS, checked_magnitude, target_units

#: The arrays of a state with their dtypes, and its scalars.
STATE_ARRAYS = {"key": np.dtype(np.uint64), "count": np.dtype(np.int64), "units": np.dtype(np.int64)}
STATE_SCALARS = ("rows", "total_units")

_jit = nb.njit(nogil=True, cache=True)


# One (capacity, 3) int64 table: [key bits, count, units] per slot, count 0: an empty slot (a category takes a slot
# with its first counted row), linear probing from fmix64(key).


@_jit
def _find(tab, k):
    mask = np.uint64(len(tab) - 1)
    j = np.int64(fmix64(k) & mask)
    while tab[j, 1] != 0 and np.uint64(tab[j, 0]) != k:
        j = (j + 1) & np.int64(mask)
    return j


@_jit
def _advance(tab, keys, units, present, smoothing, totals, out, start, size):
    """Rows ``start..``: each its value into ``out``, then (target ``present``) its count into ``tab`` and
    ``totals`` [rows, units]; stops before a row that would take a slot in a half-full table. Returns (row reached,
    categories in the table)."""
    limit = len(tab) // 2
    for i in range(start, len(keys)):
        j = _find(tab, keys[i])
        n_c, s_c = tab[j, 1], tab[j, 2]
        prior = totals[1] / UNITS / totals[0] if totals[0] > 0 else 0.0
        denominator = n_c + smoothing
        out[i] = (s_c / UNITS + smoothing * prior) / denominator if denominator > 0 else prior
        if not present[i]:
            continue
        if n_c == 0:
            if size >= limit:
                return i, size
            tab[j, 0] = np.int64(keys[i])
            size += 1
        tab[j, 1] = n_c + 1
        tab[j, 2] = s_c + units[i]
        totals[0] += 1
        totals[1] += units[i]
    return len(keys), size


@_jit
def _insert(tab, keys, counts, units):
    for i in range(len(keys)):
        j = _find(tab, keys[i])
        tab[j, 0] = np.int64(keys[i])
        tab[j, 1] = counts[i]
        tab[j, 2] = units[i]


@dataclass(frozen=True)
class RowsTaken:
    """What one ``advance`` changed: the keys and target units of its rows that counted."""

    keys: np.ndarray
    units: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.units.nbytes


class OrderedTargetStream(StreamState):
    """One encoded column's running statistics as a streaming state (see the module docstring). ``keys`` makes the
    category key of each row from the carried inputs; ``target`` names the carried target column."""

    def __init__(self, spec: StreamSpec, keys: Callable[[Mapping[str, Carried]], np.ndarray], target: str, smoothing: float):
        self.spec, self._keys, self.target, self.smoothing = spec, keys, target, float(smoothing)
        self._empty()

    def _empty(self, categories: int = 0) -> None:
        cap = 1024
        while cap < 2 * categories + 2:
            cap *= 2
        self.table = np.zeros((cap, 3), np.int64)
        self.size = 0
        self.totals = np.zeros(2, np.int64)  # rows, units
        self.abs_units = 0.0  # the target magnitudes taken, in units (a bound: int64 sums stay exact below 2**62)

    def advance(self, inputs: Mapping[str, Carried]) -> StreamStep:
        keys = np.ascontiguousarray(self._keys(inputs), np.uint64)
        values, valid = inputs[self.target]
        present = np.asarray(valid, np.bool_)
        units = target_units(np.where(present, values, 0.0))
        self.abs_units = checked_magnitude(self.abs_units, units)
        out = np.empty(len(keys), np.float64)
        i = 0
        while i < len(keys):
            i, self.size = _advance(self.table, keys, units, present, self.smoothing, self.totals, out, i, self.size)
            if i < len(keys):
                self._grow()
        return StreamStep({self.spec.outputs[0]: out}, None, RowsTaken(keys[present], units[present]))

    def export(self, canonical: bool = True, undo: Sequence[Any] = ()) -> StateArrays:
        used = self.table[self.table[:, 1] != 0]
        keys, counts, units = used[:, 0].view(np.uint64).copy(), used[:, 1].copy(), used[:, 2].copy()
        rows, total = int(self.totals[0]), int(self.totals[1])
        if undo:
            order = np.argsort(keys)
            keys, counts, units = keys[order], counts[order], units[order]
            taken_keys = np.concatenate([u.keys for u in undo])
            taken_units = np.concatenate([u.units for u in undo])
            at = np.searchsorted(keys, taken_keys)
            np.subtract.at(counts, at, 1)
            np.subtract.at(units, at, taken_units)
            kept = counts > 0
            keys, counts, units = keys[kept], counts[kept], units[kept]
            rows, total = rows - len(taken_keys), total - int(taken_units.sum())
        state: StateArrays = {"rows": rows, "total_units": total, "key": keys, "count": counts, "units": units}
        return self.canonical(state) if canonical else state

    def canonical(self, state: StateArrays) -> StateArrays:
        order = np.argsort(np.asarray(state["key"]), kind="stable")
        return {k: v[order] if isinstance(v, np.ndarray) else v for k, v in state.items()}

    def check(self, state: StateArrays) -> None:
        _checked(state)

    def restore(self, state: StateArrays) -> None:
        keys, counts, units, rows, total = _checked(state)
        self._empty(len(keys))
        _insert(self.table, keys, counts, units)
        self.size = len(keys)
        self.totals[:] = rows, total
        self.abs_units = checked_magnitude(0.0, units)

    def _grow(self) -> None:
        """Double the table (the state kept)."""
        self.restore(self.export(canonical=False))


def _checked(state: StateArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """The arrays and scalars of a state, checked (``InvalidState`` naming the problem): each key once, counts >= 1,
    and the entries adding up to the scalars."""
    try:
        rows, total = int(state["rows"]), int(state["total_units"])
        keys, counts, units = (np.asarray(state[k]) for k in ("key", "count", "units"))
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidState(f"ordered target statistics: malformed state: {e}") from None
    if not len(keys) == len(counts) == len(units):
        raise InvalidState("ordered target statistics: key, count and units differ in length")
    keys, counts, units = keys.astype(np.uint64), counts.astype(np.int64), units.astype(np.int64)
    ordered = np.sort(keys)
    if len(keys) and (ordered[1:] == ordered[:-1]).any():
        raise InvalidState("ordered target statistics: a key appears more than once")
    if len(counts) and counts.min() < 1:
        raise InvalidState("ordered target statistics: a count below 1")
    if int(counts.sum()) != rows or int(units.sum()) != total:
        raise InvalidState(f"ordered target statistics: the entries add up to {int(counts.sum())} rows and {int(units.sum())} units, "
                           f"the state says {rows} and {total}")  # fmt: skip
    return keys, counts, units, rows, total
