"""MovieLens ratings with each user's history (pipelines/movielens_sequence.yaml, the README's "Sequence features"
command): every user's rows, in the output, equal a plain-Python reference built from ratings.csv (the user's
ratings sorted by time then file order; each one's history the movies of the strictly earlier ones, the latest
50), with ids from a Counter-built vocabulary; the same bytes with one worker or two, and the loader reads the
lists."""

from __future__ import annotations

import csv
import hashlib
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq

from etl.loader import Loader
from tests.conftest import REPO, run_etl
from tests.docs import section_commands
from tests.integration.test_movielens import vocab_ids


def test_movielens_histories(movielens: Path, tmp_path: Path) -> None:
    convert = section_commands("MovieLens")[0]
    (sequence,) = section_commands("Sequence features")
    for command in (convert, sequence):
        run_etl(*(a.replace("ml-latest-small/", f"{movielens}/").replace("data/ml/", f"{tmp_path}/ml/") for a in command[1:]))
    out = tmp_path / "ml" / "sequences"
    assert sequence[sequence.index("--pipeline") + 1] == "pipelines/movielens_sequence.yaml"

    with open(movielens / "ratings.csv", newline="") as f:
        ratings = [(int(r["userId"]), int(r["movieId"]), int(r["timestamp"])) for r in csv.DictReader(f)]
    users = vocab_ids([u for u, _, _ in ratings])
    movies = vocab_ids([m for _, m, _ in ratings])
    by_user: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for pos, (u, m, t) in enumerate(ratings):
        by_user[users[u]].append((t, pos, movies[m]))
    want = {}
    for u, events in by_user.items():
        events.sort()
        want[u] = [(m, [e[2] for e in events if e[0] < t][-50:]) for t, _, m in events]

    rows = pq.read_table(out / "part-00000.parquet").select(["userId", "movieId", "hist_movieId", "hist_len"]).to_pylist()
    got: dict[int, list[tuple[int, list[int]]]] = defaultdict(list)
    for r in rows:
        got[r["userId"]].append((r["movieId"], r["hist_movieId"]))
        assert r["hist_len"] == len(r["hist_movieId"])
    assert got == want
    assert sum(1 for r in rows if r["hist_len"] == 50) > 0 and sum(1 for r in rows if r["hist_len"] == 0) > len(by_user)  # ties at the first time

    one = tmp_path / "one-worker"
    run_etl("preprocess", "--pipeline", REPO / "pipelines/movielens_sequence.yaml", "--input", tmp_path / "ml/raw", "--out", one, "--workers", "1")
    digest = [hashlib.sha256((d / "part-00000.parquet").read_bytes()).hexdigest() for d in (out, one)]
    assert digest[0] == digest[1]

    batch = next(iter(Loader(out, batch_size=1024)))  # the output's first rows, in file order
    values, offsets = batch.lists["hist_movieId"]
    lists = [r["hist_movieId"] for r in rows[:1024]]
    assert (offsets[1:] - offsets[:-1]).tolist() == [len(h) for h in lists] and values.tolist() == [m for h in lists for m in h]
