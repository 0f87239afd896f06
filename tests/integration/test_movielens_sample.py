"""DeepCTR's MovieLens-1M sample (ratings joined with movie and user attributes) through `etl convert`, `etl
preprocess` and the loader: every output value against a plain-Python reference, with the hour and weekday of each
rating's Unix timestamp by ``datetime``."""

from __future__ import annotations

import csv
import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from etl.backends.hashing import string_key
from etl.loader import Loader
from tests.conftest import REPO, run_etl

PIPELINE = REPO / "pipelines/movielens_sample.yaml"
INT_COLUMNS = ["user_id", "movie_id", "age", "occupation"]
TEXT_COLUMNS = ["title", "gender", "zip"]
SPARSE = ["user_id", "movie_id", "title", "gender", "age", "occupation", "zip", "timestamp_hour", "timestamp_weekday"]


def vocab_ids(values: list, key=lambda v: v) -> dict:
    """Categorify's ids: 0 pad, 1 missing, 2 the one OOV bucket, then by count descending, ties by key ascending."""
    counts = Counter(values)
    return {v: 3 + i for i, v in enumerate(sorted(counts, key=lambda v: (-counts[v], key(v))))}


def text_key(s: str) -> int:
    return string_key(s.encode())


def reference(rows: list[dict[str, str]]) -> dict[str, list]:
    """The pipeline's output, column by column, computed here from the CSV rows."""
    out: dict[str, list] = {"rating": [float(r["rating"]) for r in rows]}
    ts = np.array([int(r["timestamp"]) for r in rows], np.float64)
    out["timestamp"] = list((ts - ts.mean()) / ts.std())
    for c in INT_COLUMNS:
        ids = vocab_ids([int(r[c]) for r in rows])
        out[c] = [ids[int(r[c])] for r in rows]
    for c in TEXT_COLUMNS:
        ids = vocab_ids([r[c] for r in rows], key=text_key)
        out[c] = [ids[r[c]] for r in rows]
    genres = [r["genres"].split("|") for r in rows]
    ids = vocab_ids([g for gs in genres for g in gs], key=text_key)
    out["genres"] = [[ids[g] for g in gs] for gs in genres]
    when = [datetime.fromtimestamp(int(r["timestamp"]), UTC) for r in rows]
    for part, values in (("hour", [d.hour for d in when]), ("weekday", [d.weekday() for d in when])):
        ids = vocab_ids(values)
        out[f"timestamp_{part}"] = [ids[v] for v in values]
    return out


def test_movielens_sample_through_the_cli_and_the_loader(movielens_sample: Path, tmp_path: Path) -> None:
    with open(movielens_sample, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 200
    raw, out = tmp_path / "raw", tmp_path / "out"
    run_etl("convert", movielens_sample, "--schema", REPO / "schemas/movielens_sample.yaml", "--out", raw)
    run_etl("preprocess", "--pipeline", PIPELINE, "--input", raw, "--out", out)

    manifest = json.loads((out / "manifest.json").read_text())
    table = pq.read_table([out / f["output"] for f in manifest["files"]])
    assert table.num_rows == manifest["totals"]["rows_out"] == len(rows)
    assert table.column_names == list(rows[0]) + ["timestamp_hour", "timestamp_weekday"]  # the new columns last
    want = reference(rows)
    np.testing.assert_array_equal(table.column("rating").to_numpy(), np.array(want["rating"], np.float32))
    np.testing.assert_allclose(table.column("timestamp").to_numpy(), np.array(want["timestamp"], np.float32), rtol=1e-6, atol=1e-6)
    for c in SPARSE + ["genres"]:
        assert table.column(c).to_pylist() == want[c], c
    assert all(str(table.schema.field(c).type) == "int32" for c in SPARSE)

    vocab = pq.read_table(out / "artifacts" / "03-Categorify" / "timestamp_hour.parquet").to_pydict()
    hours = Counter(datetime.fromtimestamp(int(r["timestamp"]), UTC).hour for r in rows)
    assert vocab["raw"] == [str(h) for h in sorted(hours, key=lambda h: (-hours[h], h))]
    assert vocab["count"] == sorted(hours.values(), reverse=True)

    # the loader: the processed output as is, and the raw shards transformed on the host and after the copy (torch
    # backend on CPU tensors here); sparse holds the schema's id columns, then timestamp_hour and timestamp_weekday
    kw = dict(pipeline=PIPELINE, artifacts=out / "artifacts", batch_size=64)
    for loader in (Loader(out, batch_size=64), Loader(raw, **kw), Loader(raw, transform_on="device", **kw)):
        assert loader.layout.sparse == SPARSE and loader.layout.dense == ["timestamp"] and loader.layout.lists == ["genres"]
        batches = [(b.label.clone(), b.dense.clone(), b.sparse.clone(), *(t.clone() for t in b.lists["genres"])) for b in loader]
        assert len(batches) == 4
        label, dense, sparse = (torch.cat([b[i] for b in batches]) for i in range(3))
        np.testing.assert_array_equal(label.numpy(), table.column("rating").to_numpy())
        np.testing.assert_array_equal(dense[:, 0].numpy(), table.column("timestamp").to_numpy())
        for j, c in enumerate(SPARSE):
            assert sparse[:, j].tolist() == want[c], c
        genres = [v.tolist()[o[i] : o[i + 1]] for v, o in ((b[3], b[4].tolist()) for b in batches) for i in range(len(o) - 1)]
        assert genres == want["genres"]
