"""MovieLens ratings enriched with genres (a multi-hot list column) through convert and preprocess."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from etl.backends.hashing import string_key

from tests.conftest import REPO, run_etl


def build_joined_csv(root: Path, dest: Path) -> list[dict[str, str]]:
    """ratings.csv joined with movies.csv on movieId: userId,movieId,rating,timestamp,genres."""
    with open(root / "movies.csv", newline="", encoding="utf-8") as f:
        genres = {r["movieId"]: r["genres"] for r in csv.DictReader(f)}
    with open(root / "ratings.csv", newline="") as f:
        rows = [dict(r, genres=genres[r["movieId"]]) for r in csv.DictReader(f)]
    with open(dest, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["userId", "movieId", "rating", "timestamp", "genres"])
        w.writeheader()
        w.writerows(rows)
    return rows


def vocab_ids(values: list, key=lambda v: v) -> dict:
    counts = Counter(values)
    ordered = sorted(counts, key=lambda v: (-counts[v], key(v)))
    return {v: 3 + i for i, v in enumerate(ordered)}  # 0 pad, 1 null, 2 OOV


def test_movielens_genres_multi_hot(movielens: Path, tmp_path: Path) -> None:
    joined = tmp_path / "ratings_genres.csv"
    rows = build_joined_csv(movielens, joined)
    raw, out = tmp_path / "raw", tmp_path / "out"
    run_etl("convert", joined, "--schema", REPO / "schemas/movielens.yaml", "--out", raw, "--rows-per-file", 40_000)
    run_etl("preprocess", "--pipeline", REPO / "pipelines/movielens.yaml", "--input", raw, "--out", out)

    manifest = json.loads((out / "manifest.json").read_text())
    table = pq.read_table([out / f["output"] for f in manifest["files"]])
    assert table.num_rows == len(rows) == manifest["totals"]["rows_out"]

    np.testing.assert_array_equal(table.column("rating").to_numpy(), np.array([float(r["rating"]) for r in rows], np.float32))
    users = vocab_ids([int(r["userId"]) for r in rows])
    assert table.column("userId").to_pylist() == [users[int(r["userId"])] for r in rows]

    first3 = [r["genres"].split("|")[:3] for r in rows]
    genre_ids = vocab_ids([g for gs in first3 for g in gs], key=lambda g: string_key(g.encode()))
    assert table.column("genres").to_pylist() == [[genre_ids[g] for g in gs] for gs in first3]
    vocab = pq.read_table(out / "artifacts" / "03-Categorify" / "genres.parquet").to_pydict()
    assert vocab["raw"] == sorted(genre_ids, key=genre_ids.get)

    ts = np.array([float(r["timestamp"]) for r in rows])
    np.testing.assert_allclose(table.column("timestamp").to_numpy(), ((ts - ts.mean()) / ts.std()).astype(np.float32), rtol=1e-5, atol=1e-6)
