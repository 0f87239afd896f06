"""The Filter stage: its conditions over every raw column type (nulls, NaN, widths, string layouts), and the
errors of a bad condition."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from etl.errors import SpecError
from etl.pipeline.filter import Filter
from etl.schema import parse_schema

SCHEMA = parse_schema(
    {
        "name": "t",
        "columns": [
            {"name": "label", "role": "label", "dtype": "int64"},
            {"name": "n", "role": "dense", "dtype": "int64"},
            {"name": "x", "role": "dense", "dtype": "float64"},
            {"name": "c", "role": "categorical", "dtype": "string", "encoding": "string"},
            {"name": "k", "role": "categorical", "dtype": "int64", "encoding": "int"},
            {"name": "tags", "role": "list", "dtype": "string", "encoding": "string", "separator": "|"},
        ],
    },
    "schema.yaml",
)


def keep(where: dict, table: pa.Table) -> list[int]:
    """The positions of the rows of ``table`` that ``Filter(where)`` keeps."""
    f = Filter.parse({"where": where}, SCHEMA, "p.yaml", "stages[0] (Filter)")
    return f.select(table, np.arange(table.num_rows, dtype=np.int64)).tolist()


def expected(values: list, test) -> list[int]:
    """The positions where ``test`` holds on a non-null value (a null never matches a comparison)."""
    return [i for i, v in enumerate(values) if v is not None and test(v)]


INTS = {"int64": [5, -3, None, 0, 2**40, None, 7], "int32": [5, -3, None, 0, 2**30, None, 7], "int8": [5, -3, None, 0, 127, None, -128],
        "uint16": [5, 3, None, 0, 2**16 - 1, None, 7]}  # fmt: skip


@pytest.mark.parametrize("arrow_type", [pa.int64(), pa.int32(), pa.int8(), pa.uint16()])
@pytest.mark.parametrize("op,test", [("==", lambda v: v == 0), ("!=", lambda v: v != 0), ("<", lambda v: v < 0), ("<=", lambda v: v <= 0),
                                     (">", lambda v: v > 0), (">=", lambda v: v >= 0)])  # fmt: skip
def test_integer_comparisons_skip_nulls_whatever_the_width(arrow_type: pa.DataType, op: str, test) -> None:
    values = INTS[str(arrow_type)]
    table = pa.table({"n": pa.array(values, arrow_type)})
    assert keep({"column": "n", "op": op, "value": 0}, table) == expected(values, test)
    assert keep({"column": "n", "op": op, "value": 2**70}, table) == expected(values, lambda v: test(v - 2**70))


def test_unsigned_64_bit_keys_compare_exactly() -> None:
    values = [2**64 - 1, 2**63, 5, None]
    table = pa.table({"k": pa.array(values, pa.uint64())})
    assert keep({"column": "k", "op": ">", "value": 2**63 - 1}, table) == [0, 1]
    assert keep({"column": "k", "op": "==", "value": 2**64 - 1}, table) == [0]
    assert keep({"column": "k", "op": ">", "value": -1}, table) == [0, 1, 2]
    assert keep({"column": "k", "op": "in", "value": [2**64 - 1, -4, 5]}, table) == [0, 2]


def test_floats_treat_nan_as_a_value_and_null_as_missing() -> None:
    values = [1.5, math.nan, None, -2.0, 3.0]
    table = pa.table({"x": pa.array(values, pa.float64())})
    assert keep({"column": "x", "op": ">", "value": 1}, table) == [0, 4]
    assert keep({"column": "x", "op": "!=", "value": 1.5}, table) == [1, 3, 4]  # NaN matches !=, null does not
    assert keep({"column": "x", "op": "not_in", "value": [3.0]}, table) == [0, 1, 3]
    assert keep({"column": "x", "op": "is_null"}, table) == [2]
    assert keep({"column": "x", "op": "not_null"}, table) == [0, 1, 3, 4]


def test_a_float_column_stored_as_integers_compares_with_fractions() -> None:
    table = pa.table({"x": pa.array([1, 2, None, 3], pa.int64())})
    assert keep({"column": "x", "op": "<", "value": 2.5}, table) == [0, 1]
    assert keep({"column": "x", "op": "in", "value": [2.0, 2.5, 3]}, table) == [1, 3]


@pytest.mark.parametrize("arrow_type", [pa.string(), pa.large_string(), pa.string_view(), pa.binary(), pa.binary_view()])
def test_strings_compare_by_utf8_bytes_in_every_layout(arrow_type: pa.DataType) -> None:
    values = ["b", "a", None, "é", "ab", "b"]
    raw = [None if v is None else (v.encode() if pa.types.is_binary(arrow_type) or pa.types.is_binary_view(arrow_type) else v)
           for v in values]  # fmt: skip
    table = pa.table({"c": pa.array(raw, arrow_type)})
    assert keep({"column": "c", "op": "==", "value": "b"}, table) == [0, 5]
    assert keep({"column": "c", "op": ">=", "value": "ab"}, table) == expected(values, lambda v: v.encode() >= b"ab")
    assert keep({"column": "c", "op": "in", "value": ["a", "é"]}, table) == [1, 3]
    assert keep({"column": "c", "op": "not_in", "value": ["a", "é"]}, table) == [0, 4, 5]
    assert keep({"column": "c", "op": "!=", "value": "b"}, table) == [1, 3, 4]


def test_dictionary_columns_and_several_chunks_are_read_as_their_values() -> None:
    table = pa.table({"c": pa.chunked_array([pa.array(["x", None]).dictionary_encode(), pa.array(["y", "x"]).dictionary_encode()])})
    assert keep({"column": "c", "op": "==", "value": "x"}, table) == [0, 3]


def test_list_columns_take_the_null_tests() -> None:
    table = pa.table({"tags": pa.array([["a"], None, []], pa.list_(pa.string()))})
    assert keep({"column": "tags", "op": "is_null"}, table) == [1]
    assert keep({"column": "tags", "op": "not_null"}, table) == [0, 2]
    with pytest.raises(SpecError, match="list column"):
        keep({"column": "tags", "op": "==", "value": "a"}, table)


def test_all_any_not_combine_the_booleans_of_their_parts() -> None:
    n = [1, None, 3, -1, 5]
    c = ["a", "b", None, "a", "b"]
    table = pa.table({"n": pa.array(n, pa.int64()), "c": pa.array(c)})
    gt0 = {"column": "n", "op": ">", "value": 0}
    is_a = {"column": "c", "op": "==", "value": "a"}
    assert keep({"all": [gt0, is_a]}, table) == [0]
    assert keep({"any": [gt0, is_a]}, table) == [0, 2, 3, 4]
    assert keep({"not": gt0}, table) == [1, 3]  # the null of n: not (a comparison that is false)
    assert keep({"all": [{"not": is_a}, {"any": [gt0, {"column": "n", "op": "is_null"}]}]}, table) == [1, 2, 4]


def test_select_keeps_the_order_of_the_rows_given_and_may_keep_none() -> None:
    table = pa.table({"n": pa.array([4, 1, 9, 0], pa.int64())})
    f = Filter.parse({"where": {"column": "n", "op": ">", "value": 0}}, SCHEMA, "p.yaml", "stages[0]")
    assert f.select(table, np.array([2, 3, 0], np.int64)).tolist() == [2, 0]
    assert f.select(table, np.array([3], np.int64)).tolist() == []
    assert f.select(table.slice(0, 0), np.zeros(0, np.int64)).tolist() == []
    assert f.columns == ["n"]


@pytest.mark.parametrize(
    "params,field,message",
    [
        ({}, "stages[0] (Filter).where", "missing"),
        ({"where": {"column": "n", "op": ">", "value": 0}, "limit": 3}, "stages[0] (Filter).limit", "unknown parameter"),
        ({"where": {"column": "nope", "op": ">", "value": 0}}, "stages[0] (Filter).where.column", "no column named 'nope'"),
        ({"where": {"column": "n", "op": "~", "value": 0}}, "stages[0] (Filter).where.op", "unknown operator '~'"),
        ({"where": {"column": "n", "op": ">", "value": "0"}}, "stages[0] (Filter).where.value", "'0' is not an integer, the type of column 'n'"),
        ({"where": {"column": "n", "op": ">", "value": 1.5}}, "stages[0] (Filter).where.value", "1.5 is not an integer"),
        ({"where": {"column": "x", "op": ">", "value": True}}, "stages[0] (Filter).where.value", "True is not a number"),
        ({"where": {"column": "c", "op": "==", "value": 3}}, "stages[0] (Filter).where.value", "3 is not a string"),
        ({"where": {"column": "c", "op": "in", "value": []}}, "stages[0] (Filter).where.value", "non-empty list"),
        ({"where": {"column": "c", "op": "in", "value": ["a", 1]}}, "stages[0] (Filter).where.value", "1 is not a string"),
        ({"where": {"column": "c", "op": "=="}}, "stages[0] (Filter).where.value", "missing"),
        ({"where": {"column": "c", "op": "is_null", "value": 1}}, "stages[0] (Filter).where.value", "takes no value"),
        ({"where": {"all": []}}, "stages[0] (Filter).where.all", "non-empty list"),
        ({"where": {"any": [{"column": "n", "op": ">", "value": "x"}]}}, "stages[0] (Filter).where.any[0].value", "not an integer"),
        ({"where": {"not": {"column": "c"}, "all": []}}, "stages[0] (Filter).where", "stands alone"),
        ({"where": "n > 0"}, "stages[0] (Filter).where", "expected a condition mapping"),
        ({"where": {"column": "n", "op": ">", "value": 0, "or": 1}}, "stages[0] (Filter).where.or", "unknown key"),
    ],
)
def test_a_bad_condition_names_the_file_the_stage_and_the_field(params: dict, field: str, message: str) -> None:
    with pytest.raises(SpecError) as e:
        Filter.parse(params, SCHEMA, "p.yaml", "stages[0] (Filter)")
    text = str(e.value)
    assert text.startswith(f"p.yaml: field '{field}': ") and message in text and "\n" not in text
