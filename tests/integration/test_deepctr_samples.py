"""The DeepCTR samples of Avazu and Criteo (CSV with a header) through `etl convert`, `etl preprocess` and the
loader, every output value checked against plain-Python references computed from the text with the csv module.

Avazu has a 20-digit unsigned row id (a passthrough column, and, in a variant, a categorical column decoded as
integer text), `header: auto` (a file with a header and one without), and no dense column; the Criteo sample has
dense values written as floats and missing fields."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
import yaml

from etl.backends.hashing import hash64, reduce
from etl.loader import Loader
from tests.conftest import REPO, run_etl

AVAZU_HASHED = ("device_id", "device_ip")


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def vocabulary(keys: list[int], threshold: int) -> dict[int, int]:
    """Categorify's ids (one OOV bucket: vocabulary from 3): keys seen at least ``threshold`` times, by count
    descending, then key ascending."""
    counts = Counter(keys)
    kept = sorted((k for k in counts if counts[k] >= threshold), key=lambda k: (-counts[k], k))
    return {k: 3 + i for i, k in enumerate(kept)}


#: The Avazu columns whose values are hex text (``encoding: hex`` in the schema).
AVAZU_HEX = {c["name"] for c in yaml.safe_load((REPO / "schemas/avazu.yaml").read_text())["columns"] if c.get("encoding") == "hex"}


def avazu_key(column: str, row: dict[str, str]) -> int:
    """The documented key of an Avazu value: hex columns → the value of 8 hex digits; ints → two's complement; the
    columns DateParts derives from ``hour`` (YYMMDDHH) → the hour of the day and the weekday (0 = Monday)."""
    if column in ("hour_hour", "hour_weekday"):
        when = datetime.strptime(row["hour"], "%y%m%d%H")
        return when.hour if column == "hour_hour" else when.weekday()
    return int(row[column], 16) if column in AVAZU_HEX else int(row[column]) % 2**64


def processed_table(out: Path):
    manifest = json.loads((out / "manifest.json").read_text())
    return pq.read_table([out / f["output"] for f in manifest["files"]]), manifest


def batches(loader: Loader) -> list[tuple[torch.Tensor, ...]]:
    return [(b.label.clone(), b.dense.clone(), b.sparse.clone()) for b in loader]


def test_avazu_sample(deepctr: Path, tmp_path: Path) -> None:
    src = deepctr / "avazu_sample.txt"
    rows = read_rows(src)
    raw, out = tmp_path / "raw", tmp_path / "out"
    run_etl("convert", src, "--schema", REPO / "schemas/avazu.yaml", "--out", raw)
    run_etl("preprocess", "--pipeline", REPO / "pipelines/avazu.yaml", "--input", raw, "--out", out)
    table, manifest = processed_table(out)
    assert table.num_rows == len(rows) == 100 and manifest["totals"]["rows_quarantined"] == 0

    features = [c for c in rows[0] if c not in ("id", "click")] + ["hour_hour", "hour_weekday"]  # DateParts adds two
    assert table.column_names == ["id", "click", *features]
    assert table.column("id").to_pylist() == [r["id"] for r in rows]  # passthrough: the exact 20-digit text
    assert "10000169349117863715" in table.column("id").to_pylist()
    assert table.column("click").to_pylist() == [float(r["click"]) for r in rows]
    for c in features:
        keys = [avazu_key(c, r) for r in rows]
        if c in AVAZU_HASHED:
            want = [2 + reduce(hash64(k, 0), 1_000_000) for k in keys]
        else:
            vocab = vocabulary(keys, 2)
            want = [vocab.get(k, 2) for k in keys]
        assert table.column(c).to_pylist() == want, c
    assert min(table.column("C20").to_pylist()) >= 2  # C20 holds -1: a key like any other

    # the loader: the processed output as is, and the raw shards transformed on the host and on the device
    processed = batches(Loader(out, batch_size=32))
    kw = dict(pipeline=REPO / "pipelines/avazu.yaml", artifacts=out / "artifacts", batch_size=32)
    for other in (batches(Loader(raw, **kw)), batches(Loader(raw, transform_on="device", **kw))):
        assert len(other) == len(processed) == 4
        assert all(torch.equal(u, v) for x, y in zip(processed, other) for u, v in zip(x, y))
    loader = Loader(out, batch_size=32)
    assert loader.layout.sparse == features and loader.layout.dense == []  # no id: passthrough columns stay out
    label = torch.cat([b[0] for b in processed]).numpy()
    sparse = torch.cat([b[2] for b in processed]).numpy()
    np.testing.assert_array_equal(label, table.column("click").to_numpy())
    for j, c in enumerate(features):
        np.testing.assert_array_equal(sparse[:, j], table.column(c).to_numpy(), err_msg=c)
    assert processed[0][1].shape == (32, 0)


def test_avazu_header_auto_with_and_without_header(deepctr: Path, tmp_path: Path) -> None:
    lines = (deepctr / "avazu_sample.txt").read_text().splitlines(keepends=True)
    first, second = tmp_path / "part1.csv", tmp_path / "part2.csv"
    first.write_text("".join(lines[:61]))  # the header and 60 rows
    second.write_text("".join(lines[61:]))  # 40 rows, no header
    schema = REPO / "schemas/avazu.yaml"
    run_etl("convert", deepctr / "avazu_sample.txt", "--schema", schema, "--out", tmp_path / "whole")
    run_etl("convert", first, second, "--schema", schema, "--out", tmp_path / "split")
    whole = pq.read_table(tmp_path / "whole")
    split = pq.read_table(tmp_path / "split")
    assert split.num_rows == 100 and split.equals(whole)
    rows = read_rows(deepctr / "avazu_sample.txt")
    assert split.column("id").to_pylist() == [r["id"] for r in rows]
    assert split.column("C20").to_pylist() == [int(r["C20"]) for r in rows]

    # the same headerless part with `header: true` is refused, naming the expected and the found names
    doc = yaml.safe_load(schema.read_text())
    doc["text"]["header"] = True
    strict = tmp_path / "strict.yaml"
    strict.write_text(yaml.safe_dump(doc))
    proc = run_etl("convert", second, "--schema", strict, "--out", tmp_path / "bad", check=False)
    assert proc.returncode == 2
    assert str(second) in proc.stderr and "'click', 'hour'" in proc.stderr and "first difference: field 1: expected 'id'" in proc.stderr


def test_avazu_unsigned_ids_as_categorical_keys(deepctr: Path, tmp_path: Path) -> None:
    """``id`` decoded as integer text: keys are the exact unsigned values; beyond 2**64 - 1 is a RowError."""
    doc = yaml.safe_load((REPO / "schemas/avazu.yaml").read_text())
    doc["columns"][0] = {"name": "id", "role": "categorical", "dtype": "string", "encoding": "int"}
    schema = tmp_path / "schemas/avazu_ids.yaml"
    schema.parent.mkdir()
    schema.write_text(yaml.safe_dump(doc))
    pipeline = tmp_path / "pipelines/avazu_ids.yaml"
    pipeline.parent.mkdir()
    pipeline.write_text(yaml.safe_dump({"name": "avazu_ids", "schema": "../schemas/avazu_ids.yaml", "ops": [
        {"op": "Decode", "columns": "@categorical"},
        {"op": "Hash", "columns": "@categorical", "num_buckets": 2**31, "seed": 5},
    ]}))  # fmt: skip
    rows = read_rows(deepctr / "avazu_sample.txt")
    extra = [str(2**64 - 1), str(2**63), "-1", str(-(2**63))]
    text = tmp_path / "ids.csv"
    base = (deepctr / "avazu_sample.txt").read_text().splitlines(keepends=True)
    text.write_text("".join(base) + "".join(v + base[1][base[1].index(","):] for v in extra))
    raw, out = tmp_path / "raw", tmp_path / "out"
    run_etl("convert", text, "--schema", schema, "--out", raw)
    run_etl("preprocess", "--pipeline", pipeline, "--input", raw, "--out", out)
    table, _ = processed_table(out)
    ids = [r["id"] for r in rows] + extra
    assert max(int(v) for v in ids) > 2**63  # the sample's ids go beyond the int64 range
    assert table.column("id").to_pylist() == [2 + reduce(hash64(int(v) % 2**64, 5), 2**31) for v in ids]
    got = table.column("id").to_pylist()
    assert got[-4] == got[-2] and got[-3] == got[-1]  # 2**64 - 1 is the key of -1, 2**63 that of -2**63

    text.write_text("".join(base[:3]) + "18446744073709551616" + base[1][base[1].index(","):])
    run_etl("convert", text, "--schema", schema, "--out", raw, "--overwrite")
    proc = run_etl("preprocess", "--pipeline", pipeline, "--input", raw, "--out", tmp_path / "out2", check=False)
    assert proc.returncode == 2
    assert "row 2, column 'id'" in proc.stderr and "[-2**63, 2**64 - 1]" in proc.stderr and "18446744073709551616" in proc.stderr


def test_criteo_sample(deepctr: Path, tmp_path: Path) -> None:
    src = deepctr / "criteo_sample.txt"
    rows = read_rows(src)
    raw, out = tmp_path / "raw", tmp_path / "out"
    run_etl("convert", src, "--schema", REPO / "schemas/criteo_sample.yaml", "--out", raw)
    run_etl("preprocess", "--pipeline", REPO / "pipelines/criteo_sample.yaml", "--input", raw, "--out", out)
    table, manifest = processed_table(out)
    assert table.num_rows == len(rows) == 200 and manifest["totals"]["rows_out"] == 200

    dense = [f"I{i}" for i in range(1, 14)]
    cats = [f"C{i}" for i in range(1, 27)]
    assert table.column("label").to_pylist() == [float(r["label"]) for r in rows]
    for c in dense:
        want = [float(np.float32(math.log1p(max(float(r[c]) if r[c] else 0.0, 0.0)))) for r in rows]
        assert table.column(c).to_pylist() == want, c
    assert any(r["I2"] == "-1" for r in rows) and any(r["I3"] == "260.0" for r in rows)
    for c in cats:
        vocab = vocabulary([int(r[c], 16) for r in rows if r[c]], 2)
        assert table.column(c).to_pylist() == [vocab.get(int(r[c], 16), 2) if r[c] else 1 for r in rows], c
    assert sum(r["C22"] == "" for r in rows) > 100  # mostly missing

    processed = batches(Loader(out, batch_size=64))
    raw_host = batches(Loader(raw, pipeline=REPO / "pipelines/criteo_sample.yaml", artifacts=out / "artifacts", batch_size=64))
    assert len(processed) == len(raw_host) == 4
    assert all(torch.equal(u, v) for x, y in zip(processed, raw_host) for u, v in zip(x, y))
    dense_out = torch.cat([b[1] for b in processed]).numpy()
    sparse_out = torch.cat([b[2] for b in processed]).numpy()
    for j, c in enumerate(dense):
        np.testing.assert_array_equal(dense_out[:, j], table.column(c).to_numpy(), err_msg=c)
    for j, c in enumerate(cats):
        np.testing.assert_array_equal(sparse_out[:, j], table.column(c).to_numpy(), err_msg=c)
