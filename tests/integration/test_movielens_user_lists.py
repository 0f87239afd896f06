"""MovieLens ratings grouped into one row per user (pipelines/movielens_user_lists.yaml, the README's "Session and
user lists" command): every user's row equals a plain-Python reference built from ratings.csv (the user's ratings
sorted by time then file order; the latest 50 movies, the count, the last movie, the mean rating and the last
rating), with ids from a Counter-built vocabulary; the command prints and etl inspect shows the events in and the
groups out; the same bytes with one worker or two and in several partitions; the loader reads batches of it."""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from etl.io.processed import open_processed
from etl.loader import Loader
from tests.conftest import REPO, run_etl
from tests.docs import section_commands
from tests.integration.test_movielens import vocab_ids


def outputs(out: Path) -> pa.Table:
    return pa.concat_tables([pq.read_table(p) for p in open_processed(out).parts])


def test_movielens_user_lists(movielens: Path, tmp_path: Path) -> None:
    convert = section_commands("MovieLens")[0]
    (grouping,) = section_commands("Session and user lists")
    assert grouping[grouping.index("--pipeline") + 1] == "pipelines/movielens_user_lists.yaml"
    run_etl(*(a.replace("ml-latest-small/", f"{movielens}/").replace("data/ml/", f"{tmp_path}/ml/") for a in convert[1:]))
    proc = run_etl(*(a.replace("data/ml/", f"{tmp_path}/ml/") for a in grouping[1:]))
    out = tmp_path / "ml" / "user_lists"

    with open(movielens / "ratings.csv", newline="") as f:
        ratings = [(int(r["userId"]), int(r["movieId"]), float(r["rating"]), int(r["timestamp"])) for r in csv.DictReader(f)]
    users = vocab_ids([u for u, _, _, _ in ratings])
    movies = vocab_ids([m for _, m, _, _ in ratings])
    by_user: dict[int, list[tuple[int, int, int, float]]] = defaultdict(list)
    for pos, (u, m, r, t) in enumerate(ratings):
        by_user[users[u]].append((t, pos, movies[m], r))
    want = {}
    for u, events in by_user.items():
        events.sort()
        if len(events) >= 5:
            stars = [e[3] for e in events]
            want[u] = ([e[2] for e in events][-50:], len(events), events[-1][2], sum(stars) / len(stars), stars[-1])
    dropped = len(by_user) - len(want)
    assert f"rows: {len(ratings):,} in = {len(want):,} out + 0 quarantined" in proc.stdout
    assert f"(Groupby: {len(ratings):,} events → {len(want):,} groups ({dropped:,} dropped by min_len))" in proc.stdout

    got = outputs(out)
    assert got.column_names == ["userId", "rating", "movieId_list", "movieId_count", "movieId_last", "rating_mean"]
    rows = got.to_pylist()
    assert sorted(r["userId"] for r in rows) == sorted(want)
    for r in rows:
        movies_list, count, last, mean, label = want[r["userId"]]
        assert (r["movieId_list"], r["movieId_count"], r["movieId_last"], r["rating"]) == (movies_list, count, last, label)
        assert math.isclose(r["rating_mean"], float(np.float32(mean)), rel_tol=1e-6)
    assert max(len(r["movieId_list"]) for r in rows) == 50 and min(r["movieId_count"] for r in rows) < 50

    shown = run_etl("inspect", out).stdout
    assert f"Groupby: {len(ratings):,} events → {len(want):,} groups" in shown and "Groupby: one row per group of userId sorted by timestamp" in shown

    one, parts = tmp_path / "one-worker", tmp_path / "parts"
    run_etl("preprocess", "--pipeline", REPO / "pipelines/movielens_user_lists.yaml", "--input", tmp_path / "ml/raw", "--out", one, "--workers", "1")
    assert (one / "part-00000.parquet").read_bytes() == (out / "part-00000.parquet").read_bytes()
    run_etl("preprocess", "--pipeline", REPO / "pipelines/movielens_user_lists.yaml", "--input", tmp_path / "ml/raw", "--out", parts,
            "--memory-budget", "2M")  # fmt: skip
    assert len(open_processed(parts).parts) > 1 and outputs(parts).equals(got)

    seen = []
    for batch in Loader(out, batch_size=128, drop_last=False):  # the output's rows, in file order
        values, offsets = batch.lists["movieId_list"]
        seen += [values[a:b].tolist() for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
        assert batch.dense.shape[1] == 2 and batch.sparse_names == ["userId", "movieId_last"]
    assert seen == got.column("movieId_list").to_pylist()
