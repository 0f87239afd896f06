"""Bad input through the CLI: exit 2, one line naming file / row group / row / column, no traceback; or, with
--on-error quarantine, the bad rows set aside with exact row accounting."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, criteo_table, run_etl

CRITEO = REPO / "pipelines/criteo.yaml"


def write(table: pa.Table, path: Path, row_group_size: int = 100) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def replace(table: pa.Table, name: str, values: list) -> pa.Table:
    i = table.column_names.index(name)
    return table.set_column(i, name, pa.array(values, table.schema.field(name).type))


def expect_user_error(tmp_path: Path, inputs: Path, *fragments: str) -> str:
    proc = run_etl("preprocess", "--pipeline", CRITEO, "--input", inputs, "--out", tmp_path / "out", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    line = " ".join(proc.stderr.split())  # the message is one line, possibly wrapped by the terminal width
    for f in fragments:
        assert f in line, (f, proc.stderr)
    return line


def test_missing_path(tmp_path: Path) -> None:
    expect_user_error(tmp_path, tmp_path / "nope", str(tmp_path / "nope"), "no such file")


def test_not_parquet(tmp_path: Path) -> None:
    p = tmp_path / "in" / "a.parquet"
    p.parent.mkdir()
    p.write_text("label\tI1\n1\t2\n")
    expect_user_error(tmp_path, p.parent, "a.parquet", "not a readable Parquet file")


def test_truncated_parquet(tmp_path: Path) -> None:
    p = write(criteo_table(500), tmp_path / "in" / "a.parquet")
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    expect_user_error(tmp_path, p.parent, "a.parquet", "not a readable Parquet file")


def test_missing_column(tmp_path: Path) -> None:
    p = write(criteo_table(200).drop_columns(["C5"]), tmp_path / "in" / "a.parquet")
    expect_user_error(tmp_path, p.parent, "a.parquet", "column 'C5'", "column missing")


def test_wrong_dtype(tmp_path: Path) -> None:
    t = criteo_table(200)
    t = t.set_column(t.column_names.index("C1"), "C1", pa.array(np.arange(200)))
    p = write(t, tmp_path / "in" / "a.parquet")
    expect_user_error(tmp_path, p.parent, "a.parquet", "column 'C1'", "expected string values, found int64")


@pytest.mark.parametrize("bad", ["zz123456", "123456789", "1234567", ""])
def test_malformed_hex(tmp_path: Path, bad: str) -> None:
    t = criteo_table(300)
    values = t.column("C3").to_pylist()
    values[250] = bad
    p = write(replace(t, "C3", values), tmp_path / "in" / "a.parquet")
    expect_user_error(tmp_path, p.parent, "a.parquet", "row group 2", "row 250", "column 'C3'", "malformed value", repr(bad))


def test_nonfinite_dense(tmp_path: Path) -> None:
    schema = tmp_path / "s.yaml"
    schema.write_text("name: f\ncolumns:\n  - {name: y, role: label, dtype: float64}\n  - {name: x, role: dense, dtype: float64}\n")
    pipe = tmp_path / "p.yaml"
    pipe.write_text(f"schema: {schema}\nops:\n  - {{op: FillMissing, columns: '@dense'}}\n  - {{op: Log1p, columns: '@dense'}}\n")
    for bad in (float("nan"), float("inf")):
        p = write(pa.table({"y": [1.0, 0.0, 1.0], "x": [1.0, bad, None]}), tmp_path / "in" / "a.parquet")
        proc = run_etl("preprocess", "--pipeline", pipe, "--input", p.parent, "--out", tmp_path / "out", check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        line = " ".join(proc.stderr.split())
        assert "row 1" in line and "column 'x'" in line and "NaN or infinite" in line


def test_empty_shard_and_zero_row_group_are_valid(tmp_path: Path) -> None:
    t = criteo_table(150)
    inp = tmp_path / "in"
    write(t.slice(0, 0), inp / "a.parquet")
    with pq.ParquetWriter(inp / "b.parquet", t.schema) as w:
        w.write_table(t.slice(0, 100))
        w.write_table(t.slice(0, 0))
        w.write_table(t.slice(100, 50))
    out = tmp_path / "out"
    proc = run_etl("preprocess", "--pipeline", CRITEO, "--input", inp, "--out", out)
    assert "150 in = 150 out + 0 quarantined" in proc.stdout
    files = json.loads((out / "manifest.json").read_text())["files"]
    assert [(f["rows_in"], f["rows_out"]) for f in files] == [(0, 0), (150, 150)]
    assert pq.read_table(out / "part-00000.parquet").num_rows == 0


def test_quarantine_accounts_for_every_row(tmp_path: Path) -> None:
    t = criteo_table(400)
    c3, c7 = t.column("C3").to_pylist(), t.column("C7").to_pylist()
    c3[5], c3[390], c7[5], c7[17] = "zz123456", "123456789", "xyz", "0x123456"
    bad_rows = {5, 17, 390}
    p = write(replace(replace(t, "C3", c3), "C7", c7), tmp_path / "in" / "a.parquet")
    out = tmp_path / "out"
    proc = run_etl("preprocess", "--pipeline", CRITEO, "--input", p.parent, "--out", out, "--on-error", "quarantine")
    assert "400 in = 397 out + 3 quarantined" in proc.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["totals"] == {"rows_in": 400, "rows_out": 397, "rows_quarantined": 3}
    q = pq.read_table(out / manifest["files"][0]["quarantine"]).to_pydict()
    assert q["_row"] == sorted(bad_rows)
    assert q["_column"] == ["C3", "C7", "C3"]
    assert all("malformed value" in r for r in q["_reason"])
    assert q["C3"][0] == "zz123456" and q["C7"][1] == "0x123456"  # the raw row is kept as it was
    # the good rows are exactly the others, in order
    clean = t.filter(pa.array([i not in bad_rows for i in range(400)]))
    ref = tmp_path / "ref"
    write(clean, ref / "a.parquet")
    run_etl("preprocess", "--pipeline", CRITEO, "--input", ref, "--out", tmp_path / "refout", "--artifacts", out / "artifacts")
    got = pq.read_table(out / "part-00000.parquet")
    assert got.equals(pq.read_table(tmp_path / "refout" / "part-00000.parquet"))


def test_bad_pipeline_names_field(tmp_path: Path) -> None:
    pipe = tmp_path / "p.yaml"
    pipe.write_text(f"schema: {REPO / 'schemas/criteo.yaml'}\nops:\n  - {{op: Frobnicate, columns: '@dense'}}\n")
    p = write(criteo_table(10), tmp_path / "in" / "a.parquet")
    proc = run_etl("preprocess", "--pipeline", pipe, "--input", p.parent, "--out", tmp_path / "out", check=False)
    assert proc.returncode == 2 and "ops[0].op" in proc.stderr and "Frobnicate" in proc.stderr


def test_convert_join_errors(tmp_path: Path) -> None:
    ratings, movies = tmp_path / "ratings.csv", tmp_path / "movies.csv"
    ratings.write_text("userId,movieId,rating,timestamp\n1,1,4.0,964982703\n")
    movies.write_text("movieId,title,genres\n1,A,Drama\n2,B,Comedy\n1,C,Crime\n")
    schema = REPO / "schemas/movielens.yaml"
    cases = [
        (["--join", movies, "--on", "movieId"], f"{movies}, column 'movieId': key 1 appears on lines 2 and 4: the side table's keys must be unique"),
        (["--join", movies], "--join and --on go together"),
        (["--join", movies, "--on", "title"], "--on title: the schema"),
    ]
    for extra, fragment in cases:
        proc = run_etl("convert", ratings, "--schema", schema, "--out", tmp_path / "raw", *extra, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert fragment in " ".join(proc.stderr.split()), proc.stderr
    assert not (tmp_path / "raw").exists()
