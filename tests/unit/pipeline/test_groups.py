"""Groupby's rows (etl.pipeline.groups): the key hash of several columns, where groups start in a sorted run, and
each aggregation against plain Python on small hand-made groups (missing values, groups dropped between others)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from etl.batch import Batch, Column
from etl.io.parquet import batch_from_arrow
from etl.pipeline.groupby import Aggregate, Groupby
from etl.pipeline.groups import Groups, aggregate, invalid, key_hashes, new_groups, numeric
from etl.schema import ColumnSpec, Schema

SCHEMA = Schema("t", (ColumnSpec("s", "passthrough", "string"), ColumnSpec("k", "passthrough", "int64")))


def test_equal_keys_have_equal_hashes_and_a_missing_value_none() -> None:
    t = pa.table({"s": ["a", "b", "a", None, "a", "ab"], "k": pa.array([1, 1, 1, 1, None, 1], pa.int64())})
    hashes, usable = key_hashes(batch_from_arrow(t, SCHEMA, "<t>"), ["s", "k"])
    assert usable.tolist() == [True, True, True, False, False, True]
    assert hashes[0] == hashes[2] and len({hashes[0], hashes[1], hashes[5]}) == 3 and hashes[3] == hashes[4] == 0
    one, _ = key_hashes(batch_from_arrow(t, SCHEMA, "<t>"), ["s"])
    assert one[0] == one[2] == one[4] and one[0] != hashes[0]  # the key of two columns is not that of one
    swapped = pa.table({"s": ["1"], "k": pa.array([1], pa.int64())})
    a, _ = key_hashes(batch_from_arrow(swapped, SCHEMA, "<t>"), ["s", "k"])
    b, _ = key_hashes(batch_from_arrow(swapped, SCHEMA, "<t>"), ["k", "s"])
    assert a[0] != b[0]


def test_new_groups_start_where_a_key_value_changes() -> None:
    t = pa.table({"s": [None, None, "a", "a", "a", "b", "b"], "k": pa.array([1, 1, 1, 1, 2, 2, None], pa.int64())})
    assert new_groups(t, ["s", "k"]).tolist() == [True, False, True, False, True, True, True]
    assert new_groups(t, ["s"]).tolist() == [True, False, True, False, False, True, False]
    assert new_groups(t.slice(0, 0), ["s"]).tolist() == []


def test_groups_of_group_numbers() -> None:
    g = Groups.of(np.array([0, 0, 2, 2, 2, 5]))
    assert (g.starts.tolist(), g.counts.tolist()) == ([0, 2, 5], [2, 3, 1])
    keep = np.array([True, False, True])
    assert g.rows(keep).tolist() == [0, 1, 5]
    assert g.take(keep).starts.tolist() == [0, 5]


def test_numeric_aggregates_leave_missing_values_out_and_keep_to_their_group() -> None:
    values = np.array([1.0, 2.0, 100.0, 100.0, 4.0, 0.0, -3.0])
    col = Column(values, np.array([True, True, True, True, False, False, True]))
    groups = Groups(np.array([0, 4, 6]), np.array([2, 2, 1]))  # the events 2..3 belong to a group dropped between
    assert numeric(col, groups, "sum")[0].tolist() == [3.0, 0.0, -3.0]
    assert numeric(col, groups, "sum")[1].tolist() == [True, False, True]  # the second group has no value
    assert numeric(col, groups, "mean")[0].tolist() == [1.5, 0.0, -3.0]
    assert numeric(col, groups, "min")[0][[0, 2]].tolist() == [1.0, -3.0] and numeric(col, groups, "max")[0][[0, 2]].tolist() == [2.0, -3.0]
    assert [a.size for a in numeric(col, Groups(np.zeros(0, np.int64), np.zeros(0, np.int64)), "max")] == [0, 0]


def grouped(aggs: dict[str, list[str]], label: str | None = None, max_len: int | None = 2) -> Groupby:
    g = Groupby(["s"], [], aggs, max_len, 1, label)
    g.labels = [Aggregate("y", label or "last", "y")]
    g.aggregates = [Aggregate(c, a, f"{c}_{a}") for c, names in aggs.items() for a in names]
    return g


def test_aggregate_against_plain_python() -> None:
    w = Column(np.array([1.5, np.nan, 2.5, 1.0]), np.array([True, False, True, True]))
    events = Batch({"s": Column(np.array([7, 7, 7, 9], np.int64)), "y": Column(np.array([1.0, 0.0, 1.0, 0.0])),
                    "i": Column(np.array([3, 4, 5, 6], np.int32)), "w": w}, 4)  # fmt: skip
    g = grouped({"i": ["list", "count", "first", "last"], "w": ["sum", "mean", "first"]}, label="sum")
    fields = {"s": pa.field("s", pa.int64()), "y": pa.field("y", pa.float32()), "i": pa.field("i", pa.int32(), nullable=False),
              "w": pa.field("w", pa.float32())}  # fmt: skip
    schema = g.output_schema(fields.__getitem__)

    def to_arrow(batch: Batch, s: pa.Schema) -> pa.Table:
        col = batch[s.names[0]]
        return pa.table({s.names[0]: pa.array(col.values, s.field(0).type, mask=None if col.valid is None else ~col.valid)})

    out = aggregate(g, events, Groups(np.array([0, 3]), np.array([3, 1])), schema, to_arrow, fields.__getitem__)
    assert out.to_pylist() == [
        {"s": 7, "y": 2.0, "i_list": [4, 5], "i_count": 3.0, "i_first": 3, "i_last": 5, "w_sum": 4.0, "w_mean": 2.0, "w_first": 1.5},
        {"s": 9, "y": 0.0, "i_list": [6], "i_count": 1.0, "i_first": 6, "i_last": 6, "w_sum": 1.0, "w_mean": 1.0, "w_first": 1.0},
    ]
    assert out.schema == schema


def test_invalid_groups_are_those_float32_cannot_hold() -> None:
    events = Batch({"y": Column(np.array([1.0, 1.0, 1.0, 1.0])), "w": Column(np.array([3e38, 3e38, 1.0, np.nan])),
                    "v": Column(np.array([1e39, 0.0, 0.0, 0.0]))}, 4)  # fmt: skip
    g = grouped({"w": ["sum", "max"], "v": ["min"]}, max_len=None)
    found = invalid(g, events, Groups(np.array([0, 2, 3]), np.array([2, 1, 1])))
    assert [(bad.tolist(), a.name) for bad, a in found] == [([True, False, True], "w_sum")]  # inf, then NaN; each group once
    assert invalid(g, events, Groups(np.array([2]), np.array([1]))) == []
