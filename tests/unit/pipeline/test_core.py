"""Pipelines: spec validation, column-kind flow, transform with quarantine or raise, serving, output types,
host/device parts."""

from __future__ import annotations

import datetime
import math
import shutil
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from etl.backends import hashing
from etl.errors import InputError, RowError, SpecError
from etl.io.parquet import batch_from_arrow, open_shard
from etl.ops import Categorify, Clamp, Decode, FillMissing, FirstX, Hash, Log1p, Normalize
from etl.pipeline import Pipeline
from etl.schema import ColumnSpec
from tests.unit.pipeline.conftest import (
    BAD_ROWS,
    CATS,
    CRITEO_SCHEMA,
    DENSE,
    DLRM,
    EXTRA_BAD,
    PIPELINES,
    ref_criteo_rows,
    ref_criteo_vocabs,
    transform_file,
    write_pipeline,
)

# ---------------------------------------------------------------- from_file


def test_from_file_criteo():
    p = Pipeline.from_file(PIPELINES / "criteo.yaml")
    assert p.name == "criteo" and not p.is_fitted
    assert [type(o) for o in p.ops] == [FillMissing, Clamp, Log1p, Decode, Categorify]
    assert p.ops[4].freq_threshold == 3 and p.ops[4].oov_buckets == 1 and p.ops[4].columns == CATS
    assert p.ops[0].columns == DENSE and p.ops[1].lo == 0 and p.ops[1].hi is None
    assert p.output_columns == ["label"] + DENSE + CATS
    assert p.ops[3].specs["C1"].encoding == "hex" and p.ops[3].specs["C1"].width == 8


def test_from_file_criteo_hash_needs_no_fit():
    p = Pipeline.from_file(PIPELINES / "criteo_hash.yaml")
    assert [type(o) for o in p.ops] == [FillMissing, Clamp, Log1p, Decode, Hash]
    assert p.is_fitted
    assert p.cardinalities() == {c: 40_000_002 for c in CATS}
    sch = p.output_schema()
    assert sch.names == ["label"] + DENSE + CATS
    assert all(sch.field(c).type == pa.float32() for c in ["label"] + DENSE)
    assert all(sch.field(c).type == pa.int32() for c in CATS)


def test_from_file_movielens():
    p = Pipeline.from_file(PIPELINES / "movielens.yaml")
    assert [type(o) for o in p.ops] == [Decode, Categorify, FirstX, Categorify, Normalize]
    assert p.output_columns == ["userId", "movieId", "rating", "timestamp", "genres"]
    assert not p.is_fitted


def test_criteo_hash_transform_vs_reference(criteo):
    paths, tables, _ = criteo
    p = Pipeline.from_file(PIPELINES / "criteo_hash.yaml")
    t = tables[3]
    out = p.to_arrow(p.transform(batch_from_arrow(t, p.schema)).batch)
    for c in CATS:
        want = [1 if s is None else 2 + hashing.reduce(hashing.hash64(int(s, 16), 0), 40_000_000) for s in t.column(c).to_pylist()]
        assert out.column(c).to_pylist() == want
    for c in DENSE:
        want = [float(np.float32(math.log1p(max(0 if x is None else x, 0)))) for x in t.column(c).to_pylist()]
        assert out.column(c).to_pylist() == want


# ---------------------------------------------------------------- SpecError


def with_op(i, op):
    ops = [dict(o) for o in DLRM]
    ops[i] = op
    return ops


SPEC_CASES = {
    "unknown op": (with_op(2, {"op": "Log2", "columns": "@dense"}), "ops[2].op", "Log2"),
    "missing columns": (with_op(1, {"op": "Clamp", "min": 0}), "ops[1] (Clamp).columns", "missing"),
    "unknown column": (with_op(3, {"op": "Decode", "columns": CATS + ["C99"]}), "ops[3] (Decode).columns", "C99"),
    "unknown role": (with_op(0, {"op": "FillMissing", "columns": "@sparse"}), "ops[0] (FillMissing).columns", "sparse"),
    "bad selector": (with_op(0, {"op": "FillMissing", "columns": [1]}), "ops[0] (FillMissing).columns", "1"),
    "categorical never ids": (with_op(4, {"op": "Hash", "columns": CATS[:4] + CATS[5:], "num_buckets": 10}), "ops", "C5"),
    "never decoded": (DLRM[:3], "ops", "C1"),
    "hash before decode": (DLRM[:3] + [DLRM[4], DLRM[3]], "ops[3] (Hash).columns", "Decode"),
    "categorify before decode": (DLRM[:3] + [{"op": "Categorify", "columns": "@categorical"}], "ops[3] (Categorify).columns", "Decode"),
    "decode twice": (DLRM + [{"op": "Decode", "columns": ["C1"]}], "ops[5] (Decode).columns", "C1"),
    "clamp on categorical": (DLRM + [{"op": "Clamp", "columns": ["C2"], "min": 0}], "ops[5] (Clamp).columns", "C2"),
    "unknown parameter": (with_op(1, {"op": "Clamp", "columns": "@dense", "minimum": 0}), "ops[1] (Clamp).minimum", "did you mean 'min'?"),
    "bad parameter value": (with_op(4, {"op": "Hash", "columns": "@categorical", "num_buckets": 0}), "ops[4] (Hash)", "buckets"),
    "bad threshold": (with_op(4, {"op": "Categorify", "columns": "@categorical", "freq_threshold": 0}), "ops[4] (Categorify)", "freq_threshold"),
    "clamp min above max": (with_op(1, {"op": "Clamp", "columns": "@dense", "min": 5, "max": 1}), "ops[1] (Clamp)", "max"),
    "op not a mapping": (with_op(1, "Clamp"), "ops[1]", "op"),
    "empty ops": ([], "ops", "non-empty"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(SPEC_CASES))
def test_spec_errors_name_the_field(case, tmp_path):
    ops, field, word = SPEC_CASES[case]
    p = write_pipeline(tmp_path, ops)
    with pytest.raises(SpecError) as ei:
        Pipeline.from_file(p)
    e = ei.value
    assert e.field == field, str(e)
    assert e.path == str(p)
    assert f"{p}: field '{field}'" in str(e)
    assert word in e.problem


def test_spec_error_missing_schema_field(tmp_path):
    p = tmp_path / "pipe.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "ops": DLRM}))
    with pytest.raises(SpecError) as ei:
        Pipeline.from_file(p)
    assert ei.value.field == "schema"


def test_spec_error_schema_file_missing(tmp_path):
    p = write_pipeline(tmp_path, DLRM, schema="nope/schema.yaml")
    with pytest.raises(SpecError) as ei:
        Pipeline.from_file(p)
    assert ei.value.field == "<file>" and "nope" in ei.value.path


def test_spec_error_invalid_yaml_and_missing_file(tmp_path):
    p = tmp_path / "pipe.yaml"
    p.write_text("name: t\nops: [ {op: Clamp\n")
    with pytest.raises(SpecError) as ei:
        Pipeline.from_file(p)
    assert ei.value.field == "<file>" and "invalid YAML" in str(ei.value)
    with pytest.raises(SpecError) as ei:
        Pipeline.from_file(tmp_path / "absent.yaml")
    assert ei.value.field == "<file>" and "absent.yaml" in str(ei.value)


def test_schema_relative_to_pipeline_file(tmp_path):
    (tmp_path / "schemas").mkdir()
    shutil.copy(CRITEO_SCHEMA, tmp_path / "schemas" / "c.yaml")
    (tmp_path / "pipes").mkdir()
    p = tmp_path / "pipes" / "p.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "schema": "../schemas/c.yaml", "ops": DLRM}))
    assert Pipeline.from_file(p).schema.names[:2] == ["label", "I1"]


# ---------------------------------------------------------------- transform


def test_output_schema_and_to_arrow_types(fitted, criteo):
    pipe, _ = fitted
    sch = pipe.output_schema()
    assert sch.names == ["label"] + DENSE + CATS
    for c in ["label"] + DENSE:
        assert sch.field(c).type == pa.float32()
    for c in CATS:
        assert sch.field(c).type == pa.int32() and not sch.field(c).nullable
    t = pipe.to_arrow(transform_file(pipe, criteo[0][0])[0].batch)
    assert t.schema == sch
    assert t.num_rows == 60
    assert all(t.column(c).null_count == 0 for c in t.column_names)


# ---------------------------------------------------------------- invalid rows


def test_quarantine_drops_exactly_bad_rows(fitted, bad_shard, criteo):
    pipe, _ = fitted
    path, table, good = bad_shard
    results = transform_file(pipe, path, on_error="quarantine")
    rejected = [(int(r), rej.column) for t in results for rej in t.rejected for r in rej.rows]
    assert sorted(r for r, _ in rejected) == sorted(BAD_ROWS)  # each bad row listed once
    for r, col in rejected:
        assert col in (BAD_ROWS[r][0], EXTRA_BAD.get(r, (None,))[0])
    assert dict(rejected)[74] == "label"
    assert sum(t.num_rejected for t in results) == len(BAD_ROWS)
    row_ids = np.concatenate([t.batch.row_ids for t in results]).tolist()
    assert row_ids == good
    got = pa.concat_tables([pipe.to_arrow(t.batch) for t in results])
    ref = ref_criteo_rows(table.take(good), ref_criteo_vocabs(criteo[1]))
    for c in pipe.output_columns:
        assert got.column(c).to_pylist() == ref[c], c
    reasons = {rej.column: rej.reason for t in results for rej in t.rejected}
    assert "8 hex digits" in reasons["C3"] and "label" in reasons["label"]


def test_raise_names_file_row_group_row_column(fitted, bad_shard):
    pipe, _ = fitted
    path, _, _ = bad_shard
    shard = open_shard(path, pipe.schema)
    # labels are checked first; then the first bad value in op column order (C1..C26), then row order
    expected = {0: (5, "C3", "zz123456"), 1: (74, "label", "label is missing"), 2: (120, "C1", "68fd1e6g")}
    for rg, (row, col, value) in expected.items():
        with pytest.raises(RowError) as ei:
            pipe.transform(shard.read(rg))
        e = ei.value
        assert (e.path, e.row_group, e.row, e.column) == (str(path), rg, row, col)
        msg = str(e)
        assert str(path) in msg and f"row group {rg}" in msg and f"row {row}" in msg and f"'{col}'" in msg
        assert value in msg


def test_raise_missing_label(fitted, bad_shard):
    pipe, _ = fitted
    path, table, _ = bad_shard
    b = batch_from_arrow(table.slice(74, 1), pipe.schema, str(path), 1, 74)
    with pytest.raises(RowError) as ei:
        pipe.transform(b)
    assert ei.value.column == "label" and ei.value.row == 74 and "missing" in str(ei.value)


def test_transform_on_error_validation(fitted, criteo):
    pipe, _ = fitted
    b = batch_from_arrow(criteo[1][0].slice(0, 3), pipe.schema)
    with pytest.raises(ValueError, match="on_error"):
        pipe.transform(b, on_error="skip")


def test_nan_dense_quarantined(tmp_path):
    schema = tmp_path / "s.yaml"
    schema.write_text(yaml.safe_dump({"name": "f", "columns": [
        {"name": "y", "role": "label", "dtype": "float64"},
        {"name": "x", "role": "dense", "dtype": "float64"},
        {"name": "c", "role": "categorical", "dtype": "string", "encoding": "hex"},
    ]}))  # fmt: skip
    p = write_pipeline(tmp_path, [{"op": "FillMissing", "columns": ["x"]}, {"op": "Decode", "columns": ["c"]},
                                  {"op": "Hash", "columns": ["c"], "num_buckets": 7}], schema=str(schema))  # fmt: skip
    pipe = Pipeline.from_file(p)
    t = pa.table({"y": [1.0, 0.0, float("nan"), 1.0, 0.0], "x": [1.0, float("nan"), 2.0, None, float("inf")],
                  "c": ["a", "b", "c", None, "e"]})  # fmt: skip
    res = pipe.transform(batch_from_arrow(t, pipe.schema, "mem", 0, 10), on_error="quarantine")
    rej = {rj.column: sorted(rj.rows.tolist()) for rj in res.rejected}
    assert rej == {"x": [11, 14], "y": [12]}
    assert res.batch.row_ids.tolist() == [10, 13]
    out = pipe.to_arrow(res.batch)
    assert out.column("x").to_pylist() == [1.0, 0.0]
    assert out.column("c").to_pylist() == [2 + hashing.reduce(hashing.hash64(0xA, 0), 7), 1]
    with pytest.raises(RowError) as ei:
        pipe.transform(batch_from_arrow(t, pipe.schema, "mem", 0, 10))
    assert ei.value.row == 12 and ei.value.column == "y"  # labels are checked before any op


# ---------------------------------------------------------------- serving path


def test_serving_single_in_memory_table(fitted, criteo):
    pipe, art = fitted
    loaded = Pipeline.load(art)
    _, tables, _ = criteo
    t = tables[2].slice(100, 37)
    t = pa.table({c: t.column(c) for c in reversed(t.column_names)})  # column order does not matter
    res = loaded.transform(batch_from_arrow(t, loaded.schema))
    assert res.rejected == []
    out = loaded.to_arrow(res.batch)
    assert out.schema == pipe.output_schema() and out.num_rows == 37
    assert loaded.transform_table(t).equals(out)
    ref = ref_criteo_rows(tables[2].slice(100, 37), ref_criteo_vocabs(tables))
    for c in loaded.output_columns:
        assert out.column(c).to_pylist() == ref[c], c


def test_serving_unseen_keys_go_to_oov(fitted, criteo):
    pipe, _ = fitted
    t = criteo[1][0].slice(0, 2)
    cols = {c: t.column(c) for c in t.column_names}
    cols["C5"] = pa.array(["DEADBEEF", None])
    res = pipe.transform(batch_from_arrow(pa.table(cols), pipe.schema))
    assert pipe.to_arrow(res.batch).column("C5").to_pylist() == [2, 1]
    cols["C5"] = pa.array(["DEADBEEF", "xyz"])
    with pytest.raises(RowError, match=r"<table>, row group 0, row 1, column 'C5'"):
        pipe.transform_table(pa.table(cols))


def _rows(table: pa.Table) -> dict[str, list]:
    return {c: table.column(c).to_pylist() for c in table.column_names}


def test_serving_accepts_a_dict_of_lists_and_dataframes(fitted, criteo):
    """The same rows as an Arrow table, a dict of lists, a polars and a pandas DataFrame: the same output, equal to
    the plain-Python reference."""
    pipe, _ = fitted
    _, tables, _ = criteo
    raw = tables[0].slice(3, 25)
    want = pipe.transform_table(raw)
    ref = ref_criteo_rows(raw, ref_criteo_vocabs(tables))
    assert _rows(want) == {c: ref[c] for c in pipe.output_columns}
    assert pipe.transform_table(_rows(raw)).equals(want)
    pl = pytest.importorskip("polars")
    assert pipe.transform_table(pl.from_arrow(raw)).equals(want)
    pytest.importorskip("pandas")
    assert pipe.transform_table(raw.to_pandas()).equals(want)  # I columns with missing values become float64 + NaN


def test_serving_one_row_of_missing_values(fitted):
    """A one-row request whose values are None: Arrow types such columns null; they are missing values."""
    pipe, _ = fitted
    row = {c: [None] for c in DENSE + CATS}
    row["I2"], row["C3"] = [7], [None]
    out = pipe.transform_table(row)
    assert out.column_names == pipe.output_columns[1:]  # no label given: no label column
    assert out.schema == pa.schema([f for f in pipe.output_schema() if f.name != "label"])
    got = out.to_pylist()[0]
    assert got["I2"] == np.float32(math.log1p(7)) and all(got[c] == 0.0 for c in DENSE if c != "I2")  # FillMissing 0
    assert all(got[c] == 1 for c in CATS)  # 1 = missing
    pl = pytest.importorskip("polars")
    assert pipe.transform_table(pl.DataFrame(row)).equals(out)
    pd = pytest.importorskip("pandas")
    assert pipe.transform_table(pd.DataFrame(row)).equals(out)


def test_serving_with_a_label_keeps_it_and_checks_it(fitted):
    pipe, _ = fitted
    row = {"label": [1], **{c: [None] for c in DENSE + CATS}}
    assert pipe.transform_table(row).column("label").to_pylist() == [1.0]
    with pytest.raises(RowError, match="label is missing"):
        pipe.transform_table({**row, "label": [None]})


def test_serving_input_errors_name_the_column(fitted):
    pipe, _ = fitted
    row = {c: [None] for c in DENSE + CATS}
    with pytest.raises(InputError, match="<table>, column 'C7': column missing"):
        pipe.transform_table({k: v for k, v in row.items() if k != "C7"})
    with pytest.raises(InputError, match="column 'I4': expected int64 values, found string"):
        pipe.transform_table({**row, "I4": ["12"]})
    with pytest.raises(InputError, match="column 'I4'"):
        pipe.transform_table({**row, "I4": [1.5]})  # not a whole number: not read as int64
    assert pipe.transform_table({**row, "I4": [2.0]}).column("I4").to_pylist() == [np.float32(math.log1p(2))]
    with pytest.raises(InputError, match="columns of different lengths"):
        pipe.transform_table({**row, "I4": [1, 2]})
    with pytest.raises(TypeError, match="expected a pyarrow Table"):
        pipe.transform_table([1, 2, 3])


def test_serving_without_the_label_needs_it_when_an_op_reads_it(tmp_path):
    schema = tmp_path / "s.yaml"
    schema.write_text(yaml.safe_dump({"name": "s", "columns": [{"name": "y", "role": "label", "dtype": "float64"},
                                                               {"name": "c", "role": "categorical", "dtype": "int64"}]}))  # fmt: skip
    ops = [{"op": "FillMissing", "columns": ["y"], "value": 0}, {"op": "Decode", "columns": ["c"]},
           {"op": "Hash", "columns": ["c"], "num_buckets": 5}]  # fmt: skip
    pipe = Pipeline.from_file(write_pipeline(tmp_path, ops, schema=str(schema)))
    with pytest.raises(InputError, match="column 'y': column missing"):
        pipe.transform_table({"c": [3]})


# ---------------------------------------------------------------- host / device parts


def test_split_puts_the_ops_on_raw_values_on_the_host():
    host, device = Pipeline.from_file(PIPELINES / "criteo.yaml").split()
    assert [op.name for op in host] == ["Decode"]
    assert [op.name for op in device] == ["FillMissing", "Clamp", "Log1p", "Categorify"]
    host, device = Pipeline.from_file(PIPELINES / "movielens.yaml").split()
    assert [op.name for op in host] == ["Decode"]
    assert [op.name for op in device] == ["Categorify", "FirstX", "Categorify", "Normalize"]  # FirstX on keys


def test_host_part_then_device_part_is_the_whole_transform(fitted, criteo):
    pipe, _ = fitted
    b = batch_from_arrow(criteo[1][0], pipe.schema)
    whole = pipe.to_arrow(pipe.transform(b).batch)
    parts = pipe.to_arrow(pipe.transform(pipe.transform(b, part="host").batch, part="device").batch)
    assert parts.equals(whole)
    with pytest.raises(ValueError, match="part"):
        pipe.transform(b, part="gpu")


# ---------------------------------------------------------------- DateParts in a pipeline

CLICKS_SCHEMA = {
    "name": "clicks",
    "columns": [
        {"name": "label", "role": "label", "dtype": "float64"},
        {"name": "ts", "role": "dense", "dtype": "int64"},
        {"name": "hour", "role": "categorical", "dtype": "int64", "encoding": "int"},
        {"name": "day", "role": "categorical", "dtype": "string", "encoding": "string"},
    ],
}
CLICKS_OPS = [
    {"op": "DateParts", "columns": ["hour"], "format": "%y%m%d%H", "parts": ["hour", "weekday"]},
    {"op": "DateParts", "columns": ["day"], "format": "%Y-%m-%d", "parts": ["month"]},
    {"op": "DateParts", "columns": ["ts"], "format": "unix", "parts": ["year"]},
    {"op": "Normalize", "columns": "@dense"},
    {"op": "Decode", "columns": "@categorical"},
    {"op": "Categorify", "columns": "@categorical"},
]


def clicks_pipeline(tmp_path, ops=None, path: str = "pipe.yaml"):
    (tmp_path / "clicks.yaml").write_text(yaml.safe_dump(CLICKS_SCHEMA))
    p = tmp_path / path
    p.write_text(yaml.safe_dump({"name": "clicks", "schema": "clicks.yaml", "ops": CLICKS_OPS if ops is None else ops}))
    return p


def clicks_table() -> pa.Table:
    rng = np.random.default_rng(5)
    days = [datetime.date(2014, 10, 21) + datetime.timedelta(days=int(d)) for d in rng.integers(0, 60, 200)]
    return pa.table({
        "label": pa.array(rng.integers(0, 2, 200), pa.float64()),
        "ts": pa.array(rng.integers(1_400_000_000, 1_500_000_000, 200), pa.int64()),
        "hour": pa.array([None if i % 17 == 3 else int(d.strftime("%y%m%d")) * 100 + i % 24 for i, d in enumerate(days)], pa.int64()),
        "day": pa.array([None if i % 13 == 5 else d.isoformat() for i, d in enumerate(days)], pa.string()),
    })  # fmt: skip


def test_dateparts_columns_are_selected_by_role_and_output_after_the_schema_columns(tmp_path):
    p = Pipeline.from_file(clicks_pipeline(tmp_path, [CLICKS_OPS[1]] + CLICKS_OPS[4:]))
    assert p.ops[1].columns == ["hour", "day", "day_month"] and p.ops[2].columns == p.ops[1].columns
    ops = [{"op": "Decode", "columns": "@categorical"}, CLICKS_OPS[0]] + CLICKS_OPS[4:]
    with pytest.raises(SpecError, match="'hour' is written by an earlier op"):  # DateParts reads hour as declared
        Pipeline.from_file(clicks_pipeline(tmp_path, ops))
    p = Pipeline.from_file(clicks_pipeline(tmp_path))
    assert p.ops[4].columns == ["hour", "day", "hour_hour", "hour_weekday", "day_month", "ts_year"]
    assert p.output_columns == ["label", "ts", "hour", "day", "hour_hour", "hour_weekday", "day_month", "ts_year"]
    assert p.ops[5].specs["hour_hour"] == ColumnSpec("hour_hour", "categorical", "int64", "int")
    host, device = p.split()
    assert [op.name for op in host] == ["DateParts", "DateParts", "DateParts", "Decode"]
    assert [op.name for op in device] == ["Normalize", "Categorify"]


DATEPARTS_SPEC_CASES = {
    "unsupported directive": ({**CLICKS_OPS[0], "format": "%Y%j"}, "ops[0] (DateParts)", "%j"),
    "part the format lacks": ({**CLICKS_OPS[0], "parts": ["minute"]}, "ops[0] (DateParts)", "minute"),
    "int column, text format": ({**CLICKS_OPS[0], "format": "%y-%m-%d %H"}, "ops[0] (DateParts)", "literal text"),
    "float column": ({**CLICKS_OPS[0], "columns": ["label"], "format": "unix"}, "ops[0] (DateParts)", "int64"),
    "no format": ({"op": "DateParts", "columns": ["hour"], "parts": ["hour"]}, "ops[0] (DateParts)", "format"),
    "name taken": ({**CLICKS_OPS[0], "columns": ["day"], "format": "%Y-%m-%d", "parts": ["hour"]}, "ops[0] (DateParts)", "already"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(DATEPARTS_SPEC_CASES))
def test_dateparts_spec_errors_name_the_field(case, tmp_path):
    op, field, word = DATEPARTS_SPEC_CASES[case]
    ops = [op] + CLICKS_OPS[3:]
    if case == "name taken":  # day_hour would be a schema column
        CLICKS = {**CLICKS_SCHEMA, "columns": CLICKS_SCHEMA["columns"] + [{"name": "day_hour", "role": "dense", "dtype": "int64"}]}
        (tmp_path / "clicks.yaml").write_text(yaml.safe_dump(CLICKS))
        p = tmp_path / "pipe.yaml"
        p.write_text(yaml.safe_dump({"name": "clicks", "schema": "clicks.yaml", "ops": [{**op, "parts": ["month"]}] + ops[1:]}))
        Pipeline.from_file(p)  # day_month is free
        p.write_text(yaml.safe_dump({"name": "clicks", "schema": "clicks.yaml", "ops": [{**op, "format": "unix"}] + ops[1:]}))
    else:
        p = clicks_pipeline(tmp_path, ops)
    with pytest.raises(SpecError) as ei:
        Pipeline.from_file(p)
    assert ei.value.field.startswith(field) and word in ei.value.problem, str(ei.value)


def test_dateparts_columns_must_end_as_ids(tmp_path):
    ops = CLICKS_OPS[:4] + [{"op": "Decode", "columns": ["hour", "day"]}, {"op": "Categorify", "columns": ["hour", "day"]}]
    with pytest.raises(SpecError, match="'hour_hour' is not turned into ids"):
        Pipeline.from_file(clicks_pipeline(tmp_path, ops))
    ops = CLICKS_OPS + [{"op": "Decode", "columns": ["hour_hour"]}]  # Decode leaves keys alone, not ids
    with pytest.raises(SpecError, match="'hour_hour' holds ids values"):
        Pipeline.from_file(clicks_pipeline(tmp_path, ops))


def test_dateparts_fit_transform_artifacts_against_datetime(tmp_path):
    table = clicks_table()
    shard = tmp_path / "clicks.parquet"
    pq.write_table(table, shard, row_group_size=70)
    p = Pipeline.from_file(clicks_pipeline(tmp_path))
    p.fit([shard], workers=2)
    out = p.to_arrow(p.transform(batch_from_arrow(table, p.schema, str(shard))).batch)
    assert out.schema.names == p.output_columns and all(out.schema.field(c).type == pa.int32() for c in p.output_columns[2:])

    hours = [None if h is None else datetime.datetime.strptime(f"{h:08d}", "%y%m%d%H") for h in table.column("hour").to_pylist()]
    days = [None if d is None else datetime.datetime.strptime(d, "%Y-%m-%d") for d in table.column("day").to_pylist()]
    for name, values in (("hour_hour", [None if h is None else h.hour for h in hours]),
                         ("hour_weekday", [None if h is None else h.weekday() for h in hours]),
                         ("day_month", [None if d is None else d.month for d in days]),
                         ("ts_year", [datetime.datetime.fromtimestamp(t, datetime.UTC).year for t in table.column("ts").to_pylist()])):  # fmt: skip
        counts = Counter(v for v in values if v is not None)
        vocab = {v: 3 + i for i, v in enumerate(sorted(counts, key=lambda v: (-counts[v], v)))}  # 2: OOV
        assert out.column(name).to_pylist() == [1 if v is None else vocab[v] for v in values], name
        fitted = p.ops[5].vocab[name].to_pydict()
        assert fitted["raw"] == [str(v) for v in vocab] and fitted["key"] == list(vocab)
    assert out.column("hour").to_pylist()[:3] != out.column("hour_hour").to_pylist()[:3]  # the source column as well

    p.save(tmp_path / "art")
    loaded = Pipeline.load(tmp_path / "art")
    assert loaded.output_columns == p.output_columns
    assert loaded.to_arrow(loaded.transform(batch_from_arrow(table, loaded.schema)).batch).equals(out)
    halves = p.transform(p.transform(batch_from_arrow(table, p.schema), part="host").batch, part="device").batch
    assert p.to_arrow(halves).equals(out)


def test_dateparts_invalid_dates_raise_or_are_quarantined(tmp_path):
    table = clicks_table()
    day = table.column("day").to_pylist()
    day[7], day[150] = "2014-02-30", "2014-10-21T00"
    table = table.set_column(3, "day", pa.array(day, pa.string()))
    p = Pipeline.from_file(clicks_pipeline(tmp_path))
    shard = tmp_path / "clicks.parquet"
    pq.write_table(table, shard, row_group_size=70)
    with pytest.raises(RowError) as ei:
        p.fit([shard])
    e = ei.value
    assert (e.path, e.row_group, e.row, e.column) == (str(shard), 0, 7, "day")
    assert str(e).endswith("column 'day': not a date in format '%Y-%m-%d': '2014-02-30'")
    p.fit([shard], on_error="quarantine")
    results = transform_file(p, shard, on_error="quarantine")
    rejected = [(int(r), rej.column, rej.reason) for t in results for rej in t.rejected for r in rej.rows]
    assert rejected == [(7, "day", "not a date in format '%Y-%m-%d'"), (150, "day", "not a date in format '%Y-%m-%d'")]
    assert sum(t.batch.num_rows for t in results) == 198
# ---------------------------------------------------------------- selectors and passthrough columns

SELECTOR_SCHEMA = {"name": "s", "columns": [
    {"name": "id", "role": "passthrough", "dtype": "string"},
    {"name": "y", "role": "label", "dtype": "int64"},
    {"name": "note", "role": "drop"},
    {"name": "a", "role": "categorical", "dtype": "string", "encoding": "hex"},
    {"name": "b", "role": "categorical", "dtype": "int64"},
    {"name": "c", "role": "categorical", "dtype": "string"},
    {"name": "w", "role": "passthrough", "dtype": "float64"},
    {"name": "n", "role": "passthrough", "dtype": "int64"},
    {"name": "d", "role": "dense", "dtype": "float64"},
]}  # fmt: skip


def selector_pipeline(ops: list[dict]) -> Pipeline:
    from etl.schema import parse_schema

    return Pipeline({"name": "s", "ops": ops}, parse_schema(SELECTOR_SCHEMA, "s.yaml"), "s.yaml")


def test_role_selector_with_exclude():
    p = selector_pipeline([
        {"op": "Decode", "columns": "@categorical"},
        {"op": "Categorify", "columns": {"role": "categorical", "exclude": ["b"]}},
        {"op": "Hash", "columns": ["b"], "num_buckets": 10},
        {"op": "FillMissing", "columns": {"role": "dense"}, "value": 0},
    ])  # fmt: skip
    assert p.ops[1].columns == ["a", "c"] and p.ops[2].columns == ["b"] and p.ops[3].columns == ["d"]
    assert p.output_columns == ["id", "y", "a", "b", "c", "w", "n", "d"]  # passthrough columns kept in schema order
    assert p.passthrough == ["id", "w", "n"] and p.input_columns == ["y", "a", "b", "c", "d"]


DECODED = [{"op": "Decode", "columns": "@categorical"}, {"op": "Hash", "columns": "@categorical", "num_buckets": 10}]
COLS = "ops[0] (Decode).columns"
FILL = "ops[2] (FillMissing).columns"


def decode(columns) -> list[dict]:
    return [{"op": "Decode", "columns": columns}]


def fill(columns) -> list[dict]:
    return DECODED + [{"op": "FillMissing", "columns": columns, "value": 0}]


CROSS = [DECODED[0], {"op": "HashedCross", "columns": ["a", "b"], "num_buckets": 5, "name": "n"}, DECODED[1]]
SELECTOR_CASES = {
    "exclude another role's column": (decode({"role": "categorical", "exclude": ["d"]}), f"{COLS}.exclude", "'d' is not a column of role"),
    "exclude every column": (decode({"role": "categorical", "exclude": ["a", "b", "c"]}), f"{COLS}.exclude", "every column"),
    "exclude not a list": (decode({"role": "categorical", "exclude": "a"}), f"{COLS}.exclude", "list"),
    "unknown selector field": (decode({"role": "categorical", "except": ["a"]}), f"{COLS}.except", "role and exclude"),
    "selector without role": (decode({"exclude": ["a"]}), f"{COLS}.role", "role"),
    "passthrough by role": (fill("@passthrough"), FILL, "passthrough"),
    "passthrough by role selector": (fill({"role": "passthrough"}), FILL, "passthrough"),
    "passthrough by name": (fill(["w"]), FILL, "passthrough column"),
    "dropped column by name": (fill(["note"]), FILL, "role drop"),
    "dropped role": (fill("@drop"), FILL, "not read"),
    "writes a passthrough column": (CROSS, "ops[1] (HashedCross)", "passthrough"),
}


@pytest.mark.parametrize("case", sorted(SELECTOR_CASES))
def test_selector_errors(case):
    ops, field, word = SELECTOR_CASES[case]
    with pytest.raises(SpecError) as ei:
        selector_pipeline(ops)
    assert ei.value.field == field and word in ei.value.problem, str(ei.value)


def test_unknown_ops_and_parameters_point_to_the_pipeline_docs():
    for op in ({"op": "Log2", "columns": "@dense"}, {"op": "FillMissing", "columns": "@dense", "fill": 0}):
        with pytest.raises(SpecError, match="pipelines/README.md"):
            selector_pipeline(DECODED + [op])


def test_passthrough_columns_are_copied_unchanged():
    p = selector_pipeline(DECODED + [{"op": "FillMissing", "columns": "@dense", "value": 0}])
    raw = pa.table({
        "id": pa.array(["10000169349117863715", None, "x" * 30, "", "7"], pa.string()),
        "y": pa.array([1, 0, None, 1, 0], pa.int64()),  # row 2: no label → quarantined
        "a": pa.array(["ff", "zz", "01", None, "2"]),  # row 1: malformed hex → quarantined
        "b": pa.array([1, 2, 3, 4, 5], pa.int64()),
        "c": pa.array(["p", "q", "r", "s", "t"]),
        "w": pa.array([float("nan"), 1.5, 2.0, None, float("inf")], pa.float64()),  # never checked: not transformed
        "n": pa.array([-(2**63), 2**63 - 1, 0, None, 5], pa.int64()),
        "d": pa.array([0.5, None, 1.0, 2.0, None], pa.float64()),
    })  # fmt: skip
    t = p.transform(batch_from_arrow(raw, p.schema, "raw.parquet"), on_error="quarantine")
    assert sorted(int(r) for rej in t.rejected for r in rej.rows) == [1, 2]
    out = p.to_arrow(t.batch)
    schema = p.output_schema()
    assert [schema.field(c).type for c in ("id", "w", "n")] == [pa.string(), pa.float64(), pa.int64()]
    kept = [0, 3, 4]
    for c in ("id", "w", "n"):
        want = [raw.column(c)[i].as_py() for i in kept]
        got = out.column(c).to_pylist()
        assert [str(v) for v in got] == [str(v) for v in want], c  # str: nan == nan
    assert out.column("d").to_pylist() == [0.5, 2.0, 0.0]
    assert p.transform_table(raw.slice(3, 2)).column("id").to_pylist() == ["", "7"]


def test_passthrough_text_from_string_views():
    p = selector_pipeline(DECODED)
    raw = pa.table({"id": pa.array(["short", None, "a much longer value than twelve bytes"], pa.string_view()),
                    "y": [1, 0, 1], "a": ["1", "2", "3"], "b": [1, 2, 3], "c": ["x", "y", "z"],
                    "w": [1.0, 2.0, 3.0], "n": [1, 2, 3], "d": [1.0, 2.0, 3.0]})  # fmt: skip
    out = p.to_arrow(p.transform(batch_from_arrow(raw, p.schema)).batch)
    assert out.column("id").to_pylist() == ["short", None, "a much longer value than twelve bytes"]
    inline = pa.table({**{c: raw.column(c) for c in raw.column_names}, "id": pa.array(["ab", "", None], pa.string_view())})
    assert p.to_arrow(p.transform(batch_from_arrow(inline, p.schema)).batch).column("id").to_pylist() == ["ab", "", None]
