"""etl.io.memory.arrow_table: rows held in memory typed for the schema; None is missing in every column, list
columns included; numbers are cast only when no value changes; text is never parsed into numbers."""

from __future__ import annotations

import pyarrow as pa
import pytest

from etl.errors import InputError
from etl.io.memory import arrow_table
from etl.io.parquet import batch_from_arrow
from etl.schema import load_schema
from tests.conftest import REPO

MOVIELENS = load_schema(REPO / "schemas/movielens.yaml")


def test_columns_of_none_take_the_raw_types() -> None:
    t = arrow_table({"userId": [None], "movieId": [3], "rating": [None], "timestamp": [None], "genres": [None]}, MOVIELENS)
    assert t.schema.field("userId").type == pa.int64() and t.schema.field("genres").type == pa.list_(pa.field("element", pa.string()))
    b = batch_from_arrow(t, MOVIELENS)
    assert b["userId"].valid.tolist() == [False] and b["movieId"].values.tolist() == [3]
    assert b["genres"].offsets.tolist() == [0, 0]  # a null list is an empty list


def test_lists_of_lists_and_record_batches() -> None:
    rows = {"userId": [1, 2], "movieId": [3, 4], "rating": [4.5, 1], "timestamp": [10, None], "genres": [[], ["Drama", None]]}
    t = arrow_table(rows, MOVIELENS)
    assert t.column("genres").to_pylist() == [[], ["Drama", None]] and t.column("rating").to_pylist() == [4.5, 1.0]
    assert arrow_table(pa.RecordBatch.from_pydict(rows), MOVIELENS).column("genres").to_pylist() == [[], ["Drama", None]]


@pytest.mark.parametrize("column, values, message", [
    ("timestamp", ["10"], "expected int64 values, found string"),
    ("timestamp", [1.25], "expected int64 values, found double, and they cannot be read as int64"),
    ("userId", [[1]], "expected int64 values, found list"),
    ("genres", ["Drama|Comedy"], "expected list<string> values, found string"),
])  # fmt: skip
def test_values_the_raw_type_cannot_hold_name_the_column(column: str, values: list, message: str) -> None:
    rows = {"userId": [1], "movieId": [3], "rating": [4.5], "timestamp": [10], "genres": [["Drama"]]}
    with pytest.raises(InputError, match=f"<table>, column '{column}': {message}"):
        arrow_table({**rows, column: values}, MOVIELENS)


def test_a_column_arrow_cannot_read_is_named() -> None:
    with pytest.raises(InputError, match="column 'userId': values Arrow cannot read as one column"):
        arrow_table({"userId": [1, "a"]}, MOVIELENS)
