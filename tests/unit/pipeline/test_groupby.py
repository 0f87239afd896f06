"""Groupby in a pipeline file (etl.pipeline.groupby): where it may stand, its parameters, what each aggregation
accepts, the output's columns, types, passthrough columns and cardinalities, and the transforms that refuse it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml

from etl.errors import ConfigError, SpecError
from etl.pipeline import Pipeline

SCHEMA = {
    "name": "events",
    "columns": [
        {"name": "label", "role": "label", "dtype": "float64"},
        {"name": "user", "role": "categorical", "dtype": "int64"},
        {"name": "item", "role": "categorical", "dtype": "string"},
        {"name": "genres", "role": "list", "dtype": "string", "separator": "|"},
        {"name": "price", "role": "dense", "dtype": "float64"},
        {"name": "ts", "role": "passthrough", "dtype": "int64"},
        {"name": "session", "role": "passthrough", "dtype": "string"},
        {"name": "note", "role": "passthrough", "dtype": "string"},
        {"name": "weight", "role": "passthrough", "dtype": "float64"},
        {"name": "comment", "role": "drop"},
    ],
}
IDS = [{"op": "Decode", "columns": ["user", "item", "genres"]}, {"op": "Hash", "columns": ["user", "item", "genres"], "num_buckets": 1000}]


def pipeline(tmp_path: Path, groupby: dict[str, Any] | None, ops: list[dict[str, Any]] | None = None, after: list[dict[str, Any]] | None = None,
             schema: dict[str, Any] | None = None) -> Pipeline:  # fmt: skip
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema or SCHEMA))
    gb = [] if groupby is None else [{"op": "Groupby", **groupby}]
    doc = {"name": "events", "schema": "schema.yaml", "ops": [*(IDS if ops is None else ops), *gb, *(after or [])]}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return Pipeline.from_file(tmp_path / "p.yaml")


BASE = {"by": ["session"], "sort_by": ["ts"], "aggs": {"item": ["list", "count", "last"]}, "max_len": 5}


def test_the_output_columns_types_and_cardinalities(tmp_path: Path) -> None:
    aggs = {"note": ["list", "first"], "weight": ["sum", "last"], "price": ["mean", "max", "first"], "genres": ["last", "count"],
            "item": ["list", "count", "first"], "user": ["last"], "label": ["sum"]}  # fmt: skip
    p = pipeline(tmp_path, {**BASE, "by": ["session", "user"], "aggs": aggs, "label": "max"})
    # by columns, the label, then each aggregated column in output order (schema, then created), its aggs as listed
    assert p.output_columns == p.groupby.outputs == ["session", "user", "label", "label_sum", "user_last", "item_list", "item_count", "item_first",
                                                     "genres_last", "genres_count", "price_mean", "price_max", "price_first", "note_list",
                                                     "note_first", "weight_sum", "weight_last"]  # fmt: skip
    assert p.event_columns == ["label", "user", "item", "genres", "price", "ts", "session", "note", "weight"]
    schema = p.output_schema()
    ids = pa.int32()
    assert {f.name: f.type for f in schema} == {
        "session": pa.string(), "user": ids, "label": pa.float32(), "label_sum": pa.float32(), "user_last": ids, "item_list": pa.list_(ids),
        "item_count": pa.float32(), "item_first": ids, "genres_last": pa.list_(ids), "genres_count": pa.float32(), "price_mean": pa.float32(),
        "price_max": pa.float32(), "price_first": pa.float32(), "note_list": pa.list_(pa.string()), "note_first": pa.string(),
        "weight_sum": pa.float32(), "weight_last": pa.float64(),
    }  # fmt: skip
    assert not schema.field("item_list").nullable and not schema.field("user_last").nullable and schema.field("note_first").nullable
    # the aggregates that keep a passthrough column's values are passthrough: written, not in loader batches
    assert p.passthrough == ["ts", "session", "note", "weight", "note_list", "note_first", "weight_last"]
    assert p.cardinalities() == {"user": 1002, "user_last": 1002, "item_list": 1002, "item_first": 1002, "genres_last": 1002}


def test_a_pipeline_without_groupby_keeps_its_output(tmp_path: Path) -> None:
    p = pipeline(tmp_path, None)
    assert p.groupby is None and p.output_columns == p.event_columns
    assert p.passthrough == ["ts", "session", "note", "weight"]


@pytest.mark.parametrize(
    ("groupby", "field", "fragment"),
    [
        ({**BASE, "key": "x"}, "ops[2] (Groupby).key", "unknown parameter of Groupby (it has by, sort_by, aggs, max_len, min_len, label)"),
        ({**BASE, "by": []}, "ops[2] (Groupby).by", "expected a non-empty list of column names"),
        ({**BASE, "by": "session"}, "ops[2] (Groupby).by", "expected a non-empty list of column names"),
        ({**BASE, "sort_by": "ts"}, "ops[2] (Groupby).sort_by", "expected a list of column names"),
        ({**BASE, "sort_by": ["session"]}, "ops[2] (Groupby)", "column 'session' is named twice among by and sort_by"),
        ({**BASE, "aggs": []}, "ops[2] (Groupby).aggs", "expected a mapping of column → list of aggregations"),
        ({**BASE, "aggs": {"item": ["median"]}}, "ops[2] (Groupby).aggs.item", "expected a list of distinct aggregations among list, count"),
        ({**BASE, "aggs": {"item": ["last", "last"]}}, "ops[2] (Groupby).aggs.item", "distinct aggregations"),
        ({**BASE, "aggs": {"item": "list"}}, "ops[2] (Groupby).aggs.item", "expected a list of distinct aggregations"),
        ({k: v for k, v in BASE.items() if k != "max_len"}, "ops[2] (Groupby).max_len", "required with a list aggregation"),
        ({**BASE, "max_len": 0}, "ops[2] (Groupby).max_len", "expected an integer in [1, 65,536]"),
        ({**BASE, "max_len": True}, "ops[2] (Groupby).max_len", "expected an integer"),
        ({**BASE, "aggs": {"item": ["count"]}}, "ops[2] (Groupby).max_len", "it goes with a list aggregation"),
        ({**BASE, "min_len": 0}, "ops[2] (Groupby).min_len", "expected an integer >= 1"),
        ({**BASE, "label": "list"}, "ops[2] (Groupby).label", "expected one of first, last, sum, mean, min, max"),
        ({**BASE, "by": ["nope"]}, "ops[2] (Groupby)", "Groupby.by: no schema column named 'nope'"),
        ({**BASE, "by": ["comment"]}, "ops[2] (Groupby)", "no schema column named 'comment' (the schema drops it: role drop)"),
        ({**BASE, "by": ["genres"]}, "ops[2] (Groupby)", "Groupby.by: column 'genres' is a list; a group key is int64 or text"),
        ({**BASE, "by": ["price"]}, "ops[2] (Groupby)", "Groupby.by: column 'price' is float64; a group key is int64 or text"),
        ({**BASE, "sort_by": ["genres"]}, "ops[2] (Groupby)", "Groupby.sort_by: column 'genres' is a list; events are ordered by single values"),
        ({**BASE, "aggs": {"nope": ["count"]}, "max_len": None}, "ops[2] (Groupby)", "Groupby.aggs: no column named 'nope'"),
        ({**BASE, "aggs": {"genres": ["list"]}}, "ops[2] (Groupby)", "'genres' is a list column (lists of lists are not made)"),
        ({**BASE, "aggs": {"item": ["sum"]}, "max_len": None}, "ops[2] (Groupby)", "Groupby.aggs.item: sum takes numbers"),
        ({**BASE, "aggs": {"note": ["mean"]}, "max_len": None}, "ops[2] (Groupby)", "mean takes numbers (label, dense, passthrough int64 or float64"),
        ({**BASE, "aggs": {"ts": ["first"], "ts_first": ["count"]}, "max_len": None}, "ops[2] (Groupby)", "no column named 'ts_first'"),
    ],
)
def test_bad_parameters_name_the_file_and_the_field(tmp_path: Path, groupby: dict[str, Any], field: str, fragment: str) -> None:
    groupby = {k: v for k, v in groupby.items() if v is not None}
    with pytest.raises(SpecError) as e:
        pipeline(tmp_path, groupby)
    assert e.value.field == field and fragment in e.value.problem, e.value


def test_where_it_may_stand_and_the_kinds_it_takes(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"ops\[2\] \(Groupby\)'.*Groupby must be the last op"):
        pipeline(tmp_path, BASE, after=[{"op": "Normalize", "columns": ["price"]}])
    raw = [{"op": "Decode", "columns": ["user", "genres"]}, {"op": "Hash", "columns": ["user", "genres"], "num_buckets": 10}]
    with pytest.raises(SpecError, match="Groupby.aggs.item: column 'item' holds raw values: turn it into ids first"):
        pipeline(tmp_path, BASE, ops=raw)
    with pytest.raises(SpecError, match="Groupby.by: column 'item' is written to the output and holds raw values"):
        pipeline(tmp_path, {**BASE, "by": ["item"], "aggs": {"user": ["count"]}, "max_len": None} | {}, ops=raw)
    # a categorical column only counted needs no ids; one the output holds does
    p = pipeline(tmp_path, {"by": ["session"], "aggs": {"item": ["count"]}}, ops=raw)
    assert p.output_columns == ["session", "label", "item_count"]
    with pytest.raises(SpecError, match="Groupby: output column 'user_last' would take the name of a column of the events"):
        schema = {**SCHEMA, "columns": [*SCHEMA["columns"], {"name": "user_last", "role": "passthrough", "dtype": "int64"}]}
        pipeline(tmp_path, {"by": ["session"], "aggs": {"user": ["last"]}}, schema=schema)
    with pytest.raises(SpecError, match="Groupby.label aggregates the label column, and the schema has none"):
        unlabelled = {**SCHEMA, "columns": [c for c in SCHEMA["columns"] if c["name"] != "label"]}
        pipeline(tmp_path, {**BASE, "label": "sum"}, schema=unlabelled)
    with pytest.raises(SpecError, match="Groupby groups the events the ops transform: write it as the last entry of ops"):
        (tmp_path / "s.yaml").write_text(yaml.safe_dump({"schema": "schema.yaml", "stages": [{"stage": "Groupby", **BASE}], "ops": IDS}))
        Pipeline.from_file(tmp_path / "s.yaml")


def test_the_transforms_of_one_batch_refuse_it(tmp_path: Path) -> None:
    p = pipeline(tmp_path, BASE)
    assert p.is_fitted
    rows = {"label": [1.0], "user": [3], "item": ["a"], "genres": [["x"]], "price": [1.0], "ts": [1], "session": ["s"], "note": [None],
            "weight": [1.0]}  # fmt: skip
    with pytest.raises(ConfigError, match="ends with Groupby, which makes one row per group of events"):
        p.transform_table(rows)
    p.save(tmp_path / "artifacts")  # nothing fitted: its pipeline document says what it is
    loaded = Pipeline.load(tmp_path / "artifacts")
    assert loaded.output_columns == p.output_columns and loaded.output_schema() == p.output_schema()
