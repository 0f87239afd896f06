"""Pipelines: spec validation, column-kind flow, transform with quarantine or raise, serving, output types,
host/device parts."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pyarrow as pa
import pytest
import yaml

from etl.backends import hashing
from etl.errors import InputError, RowError, SpecError
from etl.io.parquet import batch_from_arrow, open_shard
from etl.ops import Categorify, Clamp, Decode, FillMissing, FirstX, Hash, Log1p, Normalize
from etl.pipeline import Pipeline
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
    "unknown parameter": (with_op(1, {"op": "Clamp", "columns": "@dense", "minimum": 0}), "ops[1] (Clamp)", "minimum"),
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
