"""`etl schema infer` on the real data sets: the guessed schema and pipeline convert and preprocess without edits,
and the output matches plain-Python references computed from the text."""

from __future__ import annotations

import csv
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from etl.backends.hashing import string_key
from etl.pipeline import Pipeline
from etl.schema import Schema, load_schema
from tests.conftest import REPO, run_etl


def infer_convert_preprocess(src: Path, tmp_path: Path) -> tuple[Schema, Pipeline, list[dict], dict[str, list]]:
    """The three commands a user runs; returns the schema, pipeline, raw rows and processed columns."""
    schema, pipeline = tmp_path / "guess" / "schema.yaml", tmp_path / "guess" / "pipeline.yaml"
    schema.parent.mkdir()
    run_etl("schema", "infer", src, "--out", schema, "--pipeline", pipeline)
    run_etl("convert", src, "--schema", schema, "--out", tmp_path / "raw")
    run_etl("preprocess", "--pipeline", pipeline, "--input", tmp_path / "raw", "--out", tmp_path / "out")
    out = pq.read_table(tmp_path / "out" / "part-00000.parquet").to_pydict()
    return load_schema(schema), Pipeline.from_file(pipeline), pq.read_table(tmp_path / "raw").to_pylist(), out


def vocab_ids(values: list, key=lambda v: v) -> dict:
    """Categorify with freq_threshold 1 and one OOV bucket: count descending, then key ascending, from id 3."""
    counts = Counter(v for v in values if v is not None)
    return {v: 3 + i for i, v in enumerate(sorted(counts, key=lambda v: (-counts[v], key(v))))}


def log1p_ref(x: str) -> np.float32:
    return np.float32(math.log1p(max(float(x), 0.0)) if x else 0.0)


def test_criteo_kaggle_tsv_without_header(criteo_8k: Path, tmp_path: Path) -> None:
    src = criteo_8k / "train.csv"
    schema, pipeline, _, out = infer_convert_preprocess(src, tmp_path)
    assert schema.columns == load_schema(REPO / "schemas" / "criteo.yaml").columns
    assert (schema.text.delimiter, schema.text.header) == ("\t", False)
    lines = [ln.rstrip("\n").split("\t") for ln in open(src)]
    assert out["label"] == [float(r[0]) for r in lines]
    assert out["I5"] == [float(log1p_ref(r[5])) for r in lines]
    # I2 holds negative values: standardised, not clamped
    assert [op["columns"] for op in pipeline.doc["ops"] if op["op"] == "Normalize"] == [["I2"]]
    i2 = np.array([float(r[2]) if r[2] else 0.0 for r in lines])
    np.testing.assert_allclose(out["I2"], ((i2 - i2.mean()) / i2.std()).astype(np.float32), rtol=1e-5, atol=1e-6)
    for c in (1, 3, 20):  # C1, C3, C20
        ids = vocab_ids([int(r[13 + c], 16) if r[13 + c] else None for r in lines])
        assert out[f"C{c}"] == [ids[int(r[13 + c], 16)] if r[13 + c] else 1 for r in lines]


def test_deepctr_criteo_sample_csv_with_header(deepctr: Path, tmp_path: Path) -> None:
    src = deepctr / "criteo_sample.txt"
    schema, _, _, out = infer_convert_preprocess(src, tmp_path)
    assert (schema.text.delimiter, schema.text.header) == (",", True)
    assert schema.by_role("label") == ["label"] and schema.by_role("dense") == [f"I{i}" for i in range(1, 14)]
    assert schema.column("I3").dtype == "float64"  # integers written as "260.0"
    assert all(schema.column(f"C{i}").encoding == "hex" and schema.column(f"C{i}").width == 8 for i in range(1, 27))
    with open(src, newline="") as f:
        rows = list(csv.DictReader(f))
    assert out["label"] == [float(r["label"]) for r in rows]
    assert out["I3"] == [float(log1p_ref(r["I3"])) for r in rows]
    ids = vocab_ids([int(r["C2"], 16) if r["C2"] else None for r in rows])
    assert out["C2"] == [ids[int(r["C2"], 16)] if r["C2"] else 1 for r in rows]


def test_deepctr_movielens_sample(deepctr: Path, tmp_path: Path) -> None:
    src = deepctr / "movielens_sample.txt"
    schema, pipeline, _, out = infer_convert_preprocess(src, tmp_path)
    assert schema.by_role("label") == ["rating"] and schema.column("rating").dtype == "int64"
    assert schema.column("user_id").encoding == "int" and schema.column("genres").separator == "|"
    with open(src, newline="") as f:
        rows = list(csv.DictReader(f))
    x = max(len(r["genres"].split("|")) for r in rows)
    assert {"op": "FirstX", "columns": ["genres"], "x": x} in pipeline.doc["ops"]
    assert out["rating"] == [float(r["rating"]) for r in rows]
    users = vocab_ids([int(r["user_id"]) for r in rows])
    assert out["user_id"] == [users[int(r["user_id"])] for r in rows]
    genres = vocab_ids([g for r in rows for g in r["genres"].split("|")], key=lambda g: string_key(g.encode()))
    assert out["genres"] == [[genres[g] for g in r["genres"].split("|")] for r in rows]
    titles = vocab_ids([r["title"] for r in rows], key=lambda t: string_key(t.encode()))  # quoted, with commas
    assert out["title"] == [titles[r["title"]] for r in rows]


def test_deepctr_avazu_sample_ids_beyond_int64(deepctr: Path, tmp_path: Path) -> None:
    src = deepctr / "avazu_sample.txt"
    schema, _, raw, out = infer_convert_preprocess(src, tmp_path)
    assert schema.by_role("label") == ["click"]
    assert (schema.column("id").role, schema.column("id").dtype) == ("passthrough", "string")  # a row id
    with open(src, newline="") as f:
        rows = list(csv.DictReader(f))
    assert max(int(r["id"]) for r in rows) > 2**63 - 1
    assert [r["id"] for r in raw] == [r["id"] for r in rows]  # kept verbatim as text
    assert out["id"] == [r["id"] for r in rows]  # and copied to the output as it is
    # read as int64, the first id beyond int64 stops convert with a one-line error naming file, line and column
    as_int = tmp_path / "int.yaml"
    text = (tmp_path / "guess" / "schema.yaml").read_text()
    as_int.write_text(text.replace("{name: id, role: passthrough, dtype: string}", "{name: id, role: categorical, dtype: int64}"))
    proc = run_etl("convert", src, "--schema", as_int, "--out", tmp_path / "raw_int", check=False)
    first_big = next(i for i, r in enumerate(rows) if int(r["id"]) > 2**63 - 1)
    assert proc.returncode == 2
    assert f"column 'id': line {first_big + 2}: cannot convert to int64: invalid value '{rows[first_big]['id']}'" in proc.stderr


def test_cli_prints_without_out_and_refuses_pipeline_without_out(movielens: Path, tmp_path: Path) -> None:
    proc = run_etl("schema", "infer", movielens / "ratings.csv", "--rows", "500")
    schema_text, pipeline_text = proc.stdout.split("\n---\n")
    (tmp_path / "schema.yaml").write_text(schema_text)
    (tmp_path / "pipeline.yaml").write_text(pipeline_text)
    p = Pipeline.from_file(tmp_path / "pipeline.yaml")
    assert p.schema.names == ["userId", "movieId", "rating", "timestamp"] and p.schema.by_role("label") == ["rating"]
    assert "from ratings.csv (500 rows sampled)" in schema_text
    proc = run_etl("schema", "infer", movielens / "ratings.csv", "--pipeline", tmp_path / "p.yaml", check=False)
    assert proc.returncode == 2 and "--pipeline needs --out" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_etl("schema", "infer", tmp_path / "nope.csv", check=False)
    assert proc.returncode == 2 and "nope.csv: no such file" in proc.stderr


@pytest.mark.parametrize("name", ["links.csv", "movies.csv", "tags.csv"])
def test_other_movielens_files_give_valid_yaml(movielens: Path, tmp_path: Path, name: str) -> None:
    run_etl("schema", "infer", movielens / name, "--out", tmp_path / "s.yaml", "--pipeline", tmp_path / "p.yaml")
    assert Pipeline.from_file(tmp_path / "p.yaml").schema.names == load_schema(tmp_path / "s.yaml").names
