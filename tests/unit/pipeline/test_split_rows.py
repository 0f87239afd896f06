"""Placing rows in splits (etl.pipeline.split_rows): time bounds compared exactly, positions looked up, and the
Split stage passing on one split's rows of a row group, or naming a row it cannot place."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from etl.errors import RowError
from etl.ops.base import InvalidRows
from etl.pipeline.split import LastSplit
from etl.pipeline.split_rows import TEST, TRAIN, VALID, LatestRoles, SplitStage, TimeRoles, position_codes
from etl.pipeline.stages import RowGroupAt
from etl.schema import parse_schema

SCHEMA = parse_schema({"name": "s", "columns": [{"name": "ts", "role": "passthrough", "dtype": "int64"},
                                                {"name": "score", "role": "dense", "dtype": "float64"}]}, "s.yaml")  # fmt: skip
NO_POSITION = np.zeros(0, np.int64)


def test_time_bounds() -> None:
    table = pa.table({"ts": pa.array([-5, 99, 100, 150, 199, 200, 2**62], pa.int64())})
    roles = TimeRoles(SCHEMA, "ts", 100, 200).roles(table, NO_POSITION, NO_POSITION)
    assert roles.tolist() == [TRAIN, TRAIN, VALID, VALID, VALID, TEST, TEST]
    assert TimeRoles(SCHEMA, "ts", 100, None).roles(table, NO_POSITION, NO_POSITION).tolist() == [TRAIN, TRAIN] + [TEST] * 5
    assert TimeRoles(SCHEMA, "ts", 100, 100).roles(table, NO_POSITION, NO_POSITION).tolist() == [TRAIN, TRAIN] + [TEST] * 5
    # bounds beyond the int64 range, exactly
    assert TimeRoles(SCHEMA, "ts", 2**70, None).roles(table, NO_POSITION, NO_POSITION).tolist() == [TRAIN] * 7
    assert TimeRoles(SCHEMA, "ts", -(2**70), None).roles(table, NO_POSITION, NO_POSITION).tolist() == [TEST] * 7
    scores = pa.table({"score": [0.5, 1.0, 1.5]})
    assert TimeRoles(SCHEMA, "score", 1, 1.5).roles(scores, NO_POSITION, NO_POSITION).tolist() == [TRAIN, VALID, TEST]


@pytest.mark.parametrize("table", [pa.table({"ts": pa.array([1, None, 3], pa.int64())}), pa.table({"score": [1.0, float("nan"), 2.0]})])
def test_a_row_without_a_time_has_no_split(table: pa.Table) -> None:
    with pytest.raises(InvalidRows) as e:
        TimeRoles(SCHEMA, table.column_names[0], 2, None).roles(table, NO_POSITION, NO_POSITION)
    assert e.value.mask.tolist() == [False, True, False] and "the split's time is missing" in e.value.reason


def test_latest_roles_by_position() -> None:
    codes = position_codes(np.array([0, 2, 2]), np.array([7, 0, 5]))
    assert codes.tolist() == sorted(codes.tolist())
    roles = LatestRoles(LastSplit("u", "t", (), 1, 1), codes, np.array([TEST, VALID, TEST], np.int8))
    got = roles.roles(None, np.array([0, 0, 2, 2, 2, 1]), np.array([7, 8, 0, 5, 6, 7]))
    assert got.tolist() == [TEST, TRAIN, VALID, TEST, TRAIN, TRAIN]
    empty = LatestRoles(LastSplit("u", "t", (), 1, 1), np.zeros(0, np.int64), np.zeros(0, np.int8))
    assert empty.roles(None, np.array([0, 1]), np.array([0, 0])).tolist() == [TRAIN, TRAIN]


def test_the_split_stage_passes_on_its_rows() -> None:
    table = pa.table({"ts": pa.array([5, 1, 9, 4, 7], pa.int64()), "other": list("abcde")})
    roles = TimeRoles(SCHEMA, "ts", 4, 7)
    at = RowGroupAt("a.parquet", 3, 1000)
    rows = np.array([0, 1, 2, 3, 4], np.int64)
    assert {role: SplitStage(roles, role, {"a.parquet": 0}).select(table, rows, at).tolist() for role in ("train", "valid", "test")} == {
        "train": [1], "valid": [0, 3], "test": [2, 4]}  # fmt: skip
    assert SplitStage(roles, "valid", {"a.parquet": 0}).select(table, np.array([3, 2, 0], np.int64), at).tolist() == [3, 0]
    codes = position_codes(np.array([1, 1]), np.array([1001, 1004]))
    latest = LatestRoles(LastSplit("u", "ts", (), 1, 1), codes, np.array([VALID, TEST], np.int8))
    stage = SplitStage(latest, "train", {"a.parquet": 0, "b.parquet": 1})
    assert stage.columns == [] and stage.select(table, rows, RowGroupAt("b.parquet", 0, 1000)).tolist() == [0, 2, 3]
    assert stage.select(table, rows, at).tolist() == [0, 1, 2, 3, 4]  # the same rows of another shard
    with pytest.raises(ValueError, match="is not a row group of this run's shards"):
        stage.select(table, rows, RowGroupAt("c.parquet", 0, 0))
    with pytest.raises(ValueError, match="is not a row group of this run's shards"):
        stage.select(table, rows)


def test_the_split_stage_names_a_row_it_cannot_place() -> None:
    table = pa.table({"ts": pa.array([5, 1, None], pa.int64())})
    with pytest.raises(RowError) as e:
        SplitStage(TimeRoles(SCHEMA, "ts", 4, None), "train", {"a.parquet": 0}).select(table, np.array([0, 2]), RowGroupAt("a.parquet", 3, 1000))
    assert (e.value.path, e.value.row_group, e.value.row, e.value.column) == ("a.parquet", 3, 1002, "ts")
