"""The fitted state of ``TargetEncode`` (``etl.ops.target``) as JSON + Parquet, and the check that a saved one is a
state its fit could have written.

Per encoded column: a table of ``STATS_SCHEMA`` (key uint64, fold int32, count int64, sum float64), an entry per
(category, fold) seen, in (key, fold) order; and in the JSON state, under ``folds``, each fold's rows and target sum
(``{column: {count: [...], sum: [...]}}``). Sums are exact multiples of 2**-20 (``etl.ops.target_stats``). Every row
of the fit counts in exactly one category of each encoded column, so the entries of each fold add up to the fold's
totals exactly: the check on load that ties the table to its JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from etl.io.arrow import from_numpy, to_numpy
from etl.ops.base import InvalidState
from etl.ops.target_stats import MAX_SUM_UNITS, UNITS, FoldStats

#: The columns and types of a fitted table.
STATS_SCHEMA = pa.schema([("key", pa.uint64()), ("fold", pa.int32()), ("count", pa.int64()), ("sum", pa.float64())])


def saved_state(stats: dict[str, FoldStats]) -> tuple[dict[str, Any], dict[str, pa.Table]]:
    """The JSON state and the tables (by encoded column) of fitted ``stats``."""
    totals = {name: {"count": s.fold_counts.tolist(), "sum": (s.fold_units / UNITS).tolist()} for name, s in stats.items()}
    tables = {}
    for name, s in stats.items():
        arrays = [from_numpy(s.keys, pa.uint64()), from_numpy(s.folds.astype(np.int32)), from_numpy(s.counts), from_numpy(s.units / UNITS)]
        tables[name] = pa.Table.from_arrays(arrays, schema=STATS_SCHEMA)
    return {"folds": totals}, tables


def loaded_state(doc: dict[str, Any], tables: dict[str, pa.Table], names: list[str], kfold: int) -> dict[str, FoldStats]:
    """The statistics of the encoded columns ``names`` (``kfold`` folds) from a saved state: ``InvalidState`` naming
    the column's table when the table is at fault, none when the JSON is."""
    folds = doc.get("folds")
    if not isinstance(folds, dict):
        raise InvalidState(f"TargetEncode: field 'folds' is {folds!r:.100}, expected each column's fold totals")
    stats = {}
    for name in names:
        if name not in tables:
            raise InvalidState(f"TargetEncode: no statistics for column '{name}'")
        fold_counts, fold_units = _totals(name, folds.get(name), kfold)
        stats[name] = _checked(name, tables[name], fold_counts, fold_units)
    return stats


def _checked(name: str, t: pa.Table, fold_counts: np.ndarray, fold_units: np.ndarray) -> FoldStats:
    """The statistics of table ``t`` of column ``name``; ``InvalidState`` unless the table has the columns and
    types, no missing value, entries in (key, fold) order each once, folds in [0, kfold), counts >= 1, sums that are
    multiples of 2**-20 within 2**33, and the entries of each fold add up to the fold's totals."""

    def bad(problem: str) -> InvalidState:
        return InvalidState(f"TargetEncode: statistics of '{name}': {problem}", table=name)

    kfold = len(fold_counts)
    if not t.schema.equals(STATS_SCHEMA):
        found, expected = ([f"{f.name}: {f.type}" for f in schema] for schema in (t.schema, STATS_SCHEMA))
        raise bad(f"columns {found}, expected {expected}")
    if any(t.column(c).null_count for c in STATS_SCHEMA.names):
        raise bad("missing values")
    keys, folds, counts, sums = (to_numpy(t.column(c)) for c in STATS_SCHEMA.names)
    folds = folds.astype(np.int64)
    if len(folds) and (folds.min() < 0 or folds.max() >= kfold):
        raise bad(f"a fold outside [0, {kfold})")
    if len(counts) and counts.min() < 1:
        raise bad("a count below 1")
    if not ((keys[:-1] < keys[1:]) | ((keys[:-1] == keys[1:]) & (folds[:-1] < folds[1:]))).all():
        raise bad("entries not ordered by key then fold, each once")
    units = _units(sums, bad)
    if not (np.array_equal(_fold_sums(folds, counts, kfold), fold_counts) and np.array_equal(_fold_sums(folds, units, kfold), fold_units)):
        raise bad("the entries of a fold do not add up to the fold's totals")
    return FoldStats(keys, folds, counts, units, fold_counts, fold_units, 0.0)


def _totals(name: str, totals: Any, kfold: int) -> tuple[np.ndarray, np.ndarray]:
    """The fold totals of column ``name`` in the JSON state: ``kfold`` row counts (integers >= 0) and target sums as
    units (``InvalidState`` naming no table otherwise: the JSON state is at fault)."""

    def bad(problem: str) -> InvalidState:
        return InvalidState(f"TargetEncode: fold totals of '{name}': {problem}")

    if not isinstance(totals, dict) or set(totals) != {"count", "sum"}:
        raise bad(f"{totals!r:.100}, expected {{count: [...], sum: [...]}}")
    count, total = totals["count"], totals["sum"]
    if not isinstance(count, list) or len(count) != kfold or not all(type(c) is int and c >= 0 for c in count):
        raise bad(f"counts {count!r:.100}, expected {kfold} integers >= 0")
    if not isinstance(total, list) or len(total) != kfold or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in total):
        raise bad(f"sums {total!r:.100}, expected {kfold} numbers")
    return np.array(count, np.int64), _units(np.array(total, np.float64), bad)


def _units(sums: np.ndarray, bad: Callable[[str], InvalidState]) -> np.ndarray:
    """Float64 target sums as exact int64 units (``bad`` unless each is a finite multiple of 2**-20 within 2**33)."""
    scaled = sums * UNITS
    with np.errstate(invalid="ignore"):
        ok = np.abs(scaled) <= MAX_SUM_UNITS
    if not ok.all() or not (np.rint(scaled) == scaled).all():
        raise bad("a target sum that is not a multiple of 2**-20 within ±2**33")
    return scaled.astype(np.int64)


def _fold_sums(folds: np.ndarray, values: np.ndarray, kfold: int) -> np.ndarray:
    """The int64 sums of ``values`` by fold (exact)."""
    out = np.zeros(kfold, np.int64)
    np.add.at(out, folds, values)
    return out
