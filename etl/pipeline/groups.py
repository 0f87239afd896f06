"""The rows of ``Groupby`` (``etl.pipeline.groupby``): its key's hash, the groups of a sorted run of events, and
their aggregates.

``etl preprocess`` (``etl.preprocess.keyed_groupby``) uses them in this order: ``key_hashes`` of each row group as
read (the exchange partitions the rows by it), ``new_groups`` over a sorted partition (where each group starts),
then, over the events the ops leave (``Pipeline.check_labels`` rejects those without their key), ``Groups.of``
their group numbers, ``invalid`` (groups whose float aggregates overflow float32) and ``aggregate`` (the output rows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.backends import cpu
from etl.batch import Batch, Column, Strings, gather_ranges
from etl.io.arrow import from_numpy
from etl.ops.counts import key_hashes as mix
from etl.pipeline.groupby import NUMERIC, Aggregate, Groupby

#: The largest float32.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def key_hashes(batch: Batch, by: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's group key hash (uint64; 0 where a ``by`` value is missing) and whether it has its key (every
    ``by`` value present), from the columns as read (``batch``). Rows with equal ``by`` values (integers equal,
    texts of the same bytes) have equal hashes."""
    hashes = np.zeros(batch.num_rows, np.uint64)
    usable = np.ones(batch.num_rows, np.bool_)
    for c in by:
        col = batch[c]
        if isinstance(col.values, Strings):
            words = cpu.decode_string(col.values, col.valid)
        else:
            words = np.asarray(col.values, np.int64).view(np.uint64)
        hashes = mix(hashes ^ words)
        if col.valid is not None:
            usable &= np.asarray(col.valid, np.bool_)
    return np.where(usable, hashes, np.uint64(0)), usable


def new_groups(table: pa.Table, by: list[str]) -> np.ndarray:
    """Per row of ``table`` (rows sorted so that equal ``by`` values are together), whether it starts a group:
    the first row, and every row whose ``by`` values differ from the row before's (a missing value differs from a
    present one)."""
    n = table.num_rows
    new = np.zeros(n, np.bool_)
    if not n:
        return new
    new[0] = True
    for c in by:
        arr = table.column(c).combine_chunks()
        later, earlier = arr.slice(1), arr.slice(0, n - 1)
        differ = pc.fill_null(pc.not_equal(later, earlier), False).to_numpy(zero_copy_only=False)
        present = [np.asarray(a.is_valid().to_numpy(zero_copy_only=False), np.bool_) for a in (later, earlier)]
        new[1:] |= np.asarray(differ, np.bool_) | (present[0] != present[1])
    return new


@dataclass(frozen=True)
class Groups:
    """The groups of a run of events sorted by group: where each one's events start (``starts``, int64) and how
    many it has (``counts``, int64, each >= 1)."""

    starts: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, group: np.ndarray) -> Groups:
        """The groups of events whose group numbers are ``group`` (non-decreasing)."""
        first = np.ones(len(group), np.bool_)
        first[1:] = group[1:] != group[:-1]
        starts = np.flatnonzero(first).astype(np.int64)
        return cls(starts, np.diff(np.append(starts, len(group))).astype(np.int64))

    def take(self, keep: np.ndarray) -> Groups:
        """The groups where ``keep`` (bool per group) holds."""
        return Groups(self.starts[keep], self.counts[keep])

    def rows(self, keep: np.ndarray) -> np.ndarray:
        """The positions of the events of the groups where ``keep`` holds, in order."""
        return gather_ranges(self.starts[keep], self.counts[keep])[0]


def numeric(col: Column, groups: Groups, agg: str) -> tuple[np.ndarray, np.ndarray]:
    """``agg`` (sum, mean, min or max) of each group's values of ``col`` (numbers), in float64, leaving missing
    values out; and whether the group has a value."""
    values = np.asarray(col.values, np.float64)
    present = np.ones(len(values), np.bool_) if col.valid is None else np.asarray(col.valid, np.bool_)
    have = _reduce(np.add, present.astype(np.int64), groups)
    with np.errstate(over="ignore", invalid="ignore"):
        if agg in ("sum", "mean"):
            out = _reduce(np.add, np.where(present, values, 0.0), groups)
            if agg == "mean":
                out = out / np.maximum(have, 1)
        elif agg == "min":
            out = _reduce(np.minimum, np.where(present, values, np.inf), groups)
        else:
            out = _reduce(np.maximum, np.where(present, values, -np.inf), groups)
    return out, have > 0


def _reduce(ufunc: np.ufunc, values: np.ndarray, groups: Groups) -> np.ndarray:
    """``ufunc`` over each group's values (its ``counts`` values from its start, in order)."""
    if not len(groups.starts):
        return np.zeros(0, values.dtype)
    bounds = np.empty(2 * len(groups.starts), np.int64)
    bounds[0::2], bounds[1::2] = groups.starts, groups.starts + groups.counts
    padded = np.append(values, values[:1])  # a group may end at the last value: its end bound is then a valid index
    return ufunc.reduceat(padded, bounds)[0::2]


def invalid(groupby: Groupby, events: Batch, groups: Groups) -> list[tuple[np.ndarray, Aggregate]]:
    """The groups whose float aggregates float32 cannot hold (NaN, infinite, beyond its range): per aggregate (in
    output order) with such groups, a mask over the groups of those not found by an aggregate before."""
    found = []
    seen = np.zeros(len(groups.starts), np.bool_)
    for a in [*groupby.labels, *groupby.aggregates]:
        if a.agg not in NUMERIC:
            continue
        values, valid = numeric(events[a.column], groups, a.agg)
        bad = valid & ~(np.abs(values) <= FLOAT32_MAX) & ~seen
        if bad.any():
            found.append((bad, a))
            seen |= bad
    return found


def aggregate(groupby: Groupby, events: Batch, groups: Groups, schema: pa.Schema, to_arrow: Callable[[Batch, pa.Schema], pa.Table],
              field: Callable[[str], pa.Field]) -> pa.Table:  # fmt: skip
    """The output rows of ``groups`` of ``events`` (sorted by group, each group's in order), typed by ``schema``
    (the output's); ``to_arrow`` and ``field`` type event columns as the output would (``Pipeline.to_arrow`` and
    the output field of a column)."""

    def typed(column: str, rows: np.ndarray) -> pa.Array:
        """The values of ``column`` at event positions ``rows``, typed as the output types that column."""
        one = Batch({column: events[column].take(rows)}, len(rows))
        return to_arrow(one, pa.schema([field(column)])).column(0).combine_chunks()

    last = groups.starts + groups.counts - 1
    arrays: list[pa.Array] = [typed(c, groups.starts) for c in groupby.by]
    for a in [*groupby.labels, *groupby.aggregates]:
        f = schema.field(a.name)
        if a.agg == "list":
            kept = np.minimum(groups.counts, groupby.max_len or 0)
            rows, offsets = gather_ranges(last + 1 - kept, kept)
            arrays.append(pa.ListArray.from_arrays(from_numpy(offsets, pa.int32()), typed(a.column, rows), type=f.type))
        elif a.agg in ("first", "last"):
            arrays.append(typed(a.column, groups.starts if a.agg == "first" else last))
        elif a.agg == "count":
            arrays.append(from_numpy(groups.counts, pa.float32()))
        else:
            values, valid = numeric(events[a.column], groups, a.agg)
            arrays.append(from_numpy(values, pa.float32(), None if valid.all() else valid))
    return pa.Table.from_arrays(arrays, schema=schema)
