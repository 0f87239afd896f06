"""etl.ops.history: History's parameters, its place in a pipeline (columns it reads, the output it writes, its
cardinalities), how it reads keys and times, and the transforms that refuse it (one batch at a time)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from etl.batch import Batch, Column
from etl.errors import ConfigError, SpecError
from etl.io.parquet import column_from_arrow
from etl.ops import InvalidRows
from etl.ops.counts import key_hashes
from etl.ops.history import KEY_HASH, RAW_KEY, RAW_TIME, History, parse_ttl
from etl.pipeline import Pipeline
from etl.schema import ColumnSpec, parse_schema

SCHEMA = {
    "name": "events",
    "columns": [
        {"name": "label", "role": "label", "dtype": "int64"},
        {"name": "user", "role": "categorical", "dtype": "string", "encoding": "hex"},
        {"name": "item", "role": "categorical", "dtype": "int64"},
        {"name": "genres", "role": "list", "dtype": "string", "separator": "|"},
        {"name": "ts", "role": "dense", "dtype": "int64"},
        {"name": "price", "role": "dense", "dtype": "float64"},
        {"name": "session", "role": "passthrough", "dtype": "string"},
        {"name": "event_time", "role": "passthrough", "dtype": "int64"},
    ],
}
DECODE = [{"op": "Decode", "columns": ["user", "item", "genres"]}, {"op": "Hash", "columns": ["user", "genres"], "num_buckets": 100},
          {"op": "Hash", "columns": ["item"], "num_buckets": 2**31}]  # fmt: skip


def pipeline(*ops: dict[str, Any]) -> Pipeline:
    return Pipeline({"name": "events", "ops": [*DECODE, *ops]}, parse_schema(SCHEMA))


def history(**params: Any) -> dict[str, Any]:
    return {"op": "History", "columns": ["item"], "key": "user", "time": "ts", "max_len": 3, **params}


def test_outputs_follow_the_listed_columns() -> None:
    p = pipeline(history(columns=["item", "user"], prefix="h_"))
    assert p.output_columns[-3:] == ["h_item", "h_user", "h_len"]
    cards = p.cardinalities()
    assert (cards["h_item"], cards["h_user"], cards["h_len"]) == (2**31 + 2, 102, 4)
    schema = p.output_schema()
    assert schema.field("h_item").type == pa.list_(pa.int64()) and schema.field("h_user").type == pa.list_(pa.int32())
    assert schema.field("h_len").type == pa.int32() and not schema.field("h_len").nullable


def test_lists_of_numbers_and_of_passthrough_values() -> None:
    p = pipeline(history(columns=["item", "price", "ts", "event_time"], prefix="h_"))
    op = p.ops[-1]
    assert isinstance(op, History)
    assert (op.columns, op.passthrough, op.numbers) == (["item", "price", "ts"], ["event_time"], ["price", "ts"])
    assert op.source_columns() == ["user", "ts", "event_time"] and op.value_lists == ["h_price", "h_ts", "h_event_time"]
    schema = p.output_schema()
    assert [schema.field(f"h_{c}").type for c in ("item", "price", "ts", "event_time")] == [pa.list_(pa.int64()), *[pa.list_(pa.float32())] * 2,
                                                                                             pa.list_(pa.int64())]  # fmt: skip
    assert "h_price" not in p.cardinalities() and "h_event_time" not in p.cardinalities()
    with pytest.raises(ConfigError, match=r"^column 'h_price' \(History of 'price'\) holds lists of numbers"):
        op.check_loadable()
    bucketized = pipeline({"op": "Bucketize", "columns": ["price"], "boundaries": [1.0, 2.0]}, history(columns=["price"]))
    assert bucketized.output_schema().field("hist_price").type == pa.list_(pa.int32())  # ids by then: a list of ids


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"max_len": None}, "max_len is required"),
        ({"max_len": 0}, "max_len must be an integer"),
        ({"max_len": True}, "max_len must be an integer"),
        ({"key": None}, "key must be a column name"),
        ({"time": "ts", "key": "ts"}, "named twice"),
        ({"tiebreak": "session"}, "tiebreak must be a list"),
        ({"tiebreak": ["ts"]}, "named twice"),
        ({"prefix": ""}, "prefix"),
        ({"prefix": "a/b"}, "prefix"),
        ({"ttl": 0}, "ttl must be an integer"),
        ({"ttl": "3 days"}, "duration such as"),
        ({"ttl": "3d"}, "give time_unit"),
        ({"ttl": 5, "time_unit": "s"}, "goes with a duration"),
        ({"time_unit": "s"}, "goes with a ttl"),
        ({"ttl": "1ms", "time_unit": "s"}, "not a whole number"),
        ({"time_unit": "day", "ttl": "1d"}, "time_unit must be one of"),
        ({"min_len": 4}, "min_len must be an integer in"),
        ({"on_short": "drop"}, "goes with min_len"),
        ({"min_len": 1, "on_short": "keep"}, "on_short must be one of"),
        ({"max_keys": 0}, "max_keys"),
        ({"columns": ["genres"]}, "list column"),
        ({"time": "price"}, "the time is an int64 column"),
        ({"key": "price"}, "float64"),
        ({"key": "genres"}, "a list"),
        ({"tiebreak": ["genres"]}, "tiebreak: column 'genres' is a list"),
        ({"key": "nope"}, "no schema column named 'nope'"),
        ({"tiebreak": ["h"]}, "no schema column named 'h'"),
        ({"columns": ["session"]}, "passthrough column 'session' is string; a history lists passthrough values of int64 columns only"),
        ({"prefix": "it", "columns": ["em"]}, "no column named 'em'"),
    ],
)
def test_bad_parameters_name_the_field(params: dict[str, Any], problem: str) -> None:
    with pytest.raises(SpecError, match=problem):
        pipeline(history(**params))


def test_created_columns_must_not_exist() -> None:
    schema = parse_schema({**SCHEMA, "columns": [*SCHEMA["columns"], {"name": "item_len", "role": "dense", "dtype": "int64"}]})
    with pytest.raises(SpecError, match="creates column 'item_len'"):
        Pipeline({"name": "e", "ops": [*DECODE, history(prefix="item_", columns=["user"])]}, schema)


def test_passthrough_key_and_time_are_read_as_declared() -> None:
    p = pipeline(history(key="session", time="event_time", tiebreak=["price", "label"]))
    op = p.ops[-1]
    assert isinstance(op, History) and op.source_columns() == ["session", "event_time", "price", "label"]


def test_ttl_durations() -> None:
    assert parse_ttl("30d", "s") == 30 * 86400
    assert parse_ttl("500ms", "us") == 500_000
    assert parse_ttl("2w", "ms") == 14 * 86400 * 1000
    assert parse_ttl("250us", "ns") == 250_000 and parse_ttl("10ns", "ns") == 10 and parse_ttl("7000us", "ms") == 7
    with pytest.raises(ValueError, match="not a whole number of ms"):
        parse_ttl("1500us", "ms")
    assert parse_ttl(90, None) == 90 and parse_ttl(None, None) is None


def bound(**params: Any) -> History:
    op = History(["item"], **{"key": "user", "time": "ts", "max_len": 3, **params})
    specs = {c["name"]: ColumnSpec(c["name"], c["role"], c["dtype"], c.get("encoding"), None, c.get("separator")) for c in SCHEMA["columns"]}
    op.bind(specs)
    return op


def test_keys_are_equal_as_decode_reads_them() -> None:
    op = bound()
    col = column_from_arrow(pa.array(["0a", "A", "00000000000A", None, "xyz", "b"]), op.source_specs["user"])
    hashes, usable, malformed = op.key_hashes(col)
    assert usable.tolist() == [True, True, True, False, False, True]
    assert malformed.tolist() == [False, False, False, False, True, False]
    assert hashes[0] == hashes[1] == hashes[2] == key_hashes(np.array([10], np.uint64))[0] and hashes[5] != hashes[0]
    by_int = History(["item"], key="event_time", time="ts", max_len=1)
    by_int.bind({"event_time": ColumnSpec("event_time", "passthrough", "int64"), "ts": ColumnSpec("ts", "dense", "int64")})
    ints = column_from_arrow(pa.array([-1, 2**62]), by_int.source_specs["event_time"])
    assert by_int.key_hashes(ints)[0].tolist() == key_hashes(np.array([2**64 - 1, 2**62], np.uint64)).tolist()
    text = History(["item"], key="session", time="ts", max_len=1)
    text.bind({"session": ColumnSpec("session", "passthrough", "string"), "ts": ColumnSpec("ts", "dense", "int64")})
    h = text.key_hashes(column_from_arrow(pa.array(["a", "a", "b"]), text.source_specs["session"]))[0]
    assert h[0] == h[1] != h[2]


def checked(op: History, users: list, times: list) -> InvalidRows | None:
    user = column_from_arrow(pa.array(users, pa.string()), op.source_specs["user"])
    ts = column_from_arrow(pa.array(times, pa.int64()), op.source_specs["ts"])
    batch = Batch({"user": user, "ts": ts}, len(users))
    try:
        op.check_sources(batch)
    except InvalidRows as e:
        return e
    return None


def test_rows_without_a_usable_key_or_time_are_invalid() -> None:
    op = bound()
    assert checked(op, ["a", "b"], [1, 2]) is None
    e = checked(op, ["a", None, "zz"], [1, 2, None])
    assert e is not None and (e.column, e.reason, e.mask.tolist()) == ("user", "the key is missing", [False, True, False])
    e = checked(op, ["a", "zz"], [1, None])
    assert e is not None and e.reason.startswith("malformed key") and e.mask.tolist() == [False, True]
    e = checked(op, ["a", "b"], [None, 2])
    assert e is not None and (e.column, e.reason) == ("ts", "the time is missing")


def test_with_sources_keeps_the_columns_as_read() -> None:
    op = bound()
    user = Column(np.array([1, 2], np.uint64))
    batch = Batch({"user": user, "ts": Column(np.array([5, 6]))}, 2)
    out = op.with_sources(batch, np.array([7, 8], np.uint64), np.array([True, True]))
    assert out[RAW_KEY] is user and out[RAW_TIME] is batch["ts"] and out[KEY_HASH].valid is None


def test_one_batch_transforms_refuse_it(tmp_path: Path) -> None:
    p = pipeline(history())
    row = {"label": [1], "user": ["0a"], "item": [5], "genres": [["x"]], "ts": [1], "price": [1.0], "session": ["s"], "event_time": [1]}
    with pytest.raises(ConfigError, match="etl preprocess"):
        p.transform_table(row)
    # the loader on raw shards runs it as a streaming state: tests/unit/loader/test_stream_history.py


def test_durations_take_the_unit_of_the_time_column() -> None:
    specs = {"item": ColumnSpec("item", "categorical", "int64", "int"), "user": ColumnSpec("user", "categorical", "int64", "int"),
             "ts": ColumnSpec("ts", "passthrough", "int64", unit="ms")}  # fmt: skip
    op = History(["item"], key="user", time="ts", max_len=2, ttl="2s", allowed_lateness="1m")
    op.bind(specs)
    assert (op.ttl, op.allowed_lateness, op.time_unit) == (2000, 60_000, "ms")
    same = History(["item"], key="user", time="ts", max_len=2, ttl="2s", time_unit="ms")
    same.bind(specs)
    assert same.ttl == 2000
    with pytest.raises(ValueError, match="time_unit 's': the time column 'ts' counts ms"):
        History(["item"], key="user", time="ts", max_len=2, ttl="2s", time_unit="s").bind(specs)
    with pytest.raises(ValueError, match="give time_unit"):
        plain = {**specs, "ts": ColumnSpec("ts", "passthrough", "int64")}  # no unit
        History(["item"], key="user", time="ts", max_len=2, ttl=5, allowed_lateness="1m").bind(plain)
