"""MovieLens ratings enriched with genres (a multi-hot list column): the README's commands (convert with
--join, preprocess, inspect), checked against a polars join, then the loader (host and device placement)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import torch
import yaml

from etl.backends.hashing import string_key
from etl.loader import Loader
from tests.conftest import REPO, run_etl
from tests.docs import section_commands


def vocab_ids(values: list, key=lambda v: v) -> dict:
    counts = Counter(values)
    ordered = sorted(counts, key=lambda v: (-counts[v], key(v)))
    return {v: 3 + i for i, v in enumerate(ordered)}  # 0 pad, 1 null, 2 OOV


def joined_rows(movielens: Path) -> list[dict]:
    """The reference: a polars left join of ratings.csv and movies.csv on movieId, in ratings.csv order."""
    ratings = pl.read_csv(movielens / "ratings.csv")
    movies = pl.read_csv(movielens / "movies.csv")
    joined = ratings.join(movies.select("movieId", "genres"), on="movieId", how="left", maintain_order="left")
    assert joined.height == ratings.height
    return joined.to_dicts()


def test_movielens_section_commands(movielens: Path, tmp_path: Path) -> None:
    commands = section_commands("MovieLens")
    assert [c[:2] for c in commands] == [["etl", "convert"], ["etl", "preprocess"], ["etl", "inspect"]]
    for command in commands:
        args = [a.replace("ml-latest-small/", f"{movielens}/").replace("data/ml/", f"{tmp_path}/ml/") for a in command[1:]]
        run_etl(*args)
    raw, out = tmp_path / "ml" / "raw", tmp_path / "ml" / "processed"

    rows = joined_rows(movielens)
    got = pq.read_table(raw).to_pylist()
    assert got == [dict(r, genres=None if r["genres"] is None else r["genres"].split("|")) for r in rows]

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

    # the loader on the same raw shards, host vs device placement (torch backend on CPU tensors here): the
    # same batches, lists included, and the same rows as preprocess wrote
    kw = dict(pipeline=REPO / "pipelines/movielens.yaml", artifacts=out / "artifacts", batch_size=8_192)
    host = [(b.label.clone(), b.dense.clone(), b.sparse.clone(), *(t.clone() for t in b.lists["genres"])) for b in Loader(raw, **kw)]
    device = Loader(raw, transform_on="device", **kw)
    dev = [(b.label.clone(), b.dense.clone(), b.sparse.clone(), *(t.clone() for t in b.lists["genres"])) for b in device]
    assert len(host) == len(dev) == -(-len(rows) // 8_192)
    for x, y in zip(host, dev):
        assert all(u.dtype == v.dtype and torch.equal(u, v) for u, v in zip(x, y))
    np.testing.assert_array_equal(torch.cat([x[0] for x in dev]).numpy(), table.column("rating").to_numpy())
    np.testing.assert_array_equal(torch.cat([x[2] for x in dev])[:, 0].numpy(), table.column("userId").to_numpy())
    assert sum(len(x[3]) for x in dev) == sum(len(gs) for gs in first3)


def test_movielens_no_genres_listed_is_a_missing_list(movielens: Path, tmp_path: Path) -> None:
    """``null_values: ["(no genres listed)"]`` on the genres list: that element is dropped, so those movies' rows
    get a missing (empty) list, which no vocabulary counts; every other list is as before."""
    rows = joined_rows(movielens)
    doc = yaml.safe_load((REPO / "schemas/movielens.yaml").read_text())
    doc["columns"][4]["null_values"] = ["(no genres listed)"]
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas/movielens.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "pipelines").mkdir()
    shutil.copy(REPO / "pipelines/movielens.yaml", tmp_path / "pipelines/movielens.yaml")
    raw, out = tmp_path / "raw", tmp_path / "out"
    run_etl("convert", movielens / "ratings.csv", "--join", movielens / "movies.csv", "--on", "movieId",
            "--schema", tmp_path / "schemas/movielens.yaml", "--out", raw)
    run_etl("preprocess", "--pipeline", tmp_path / "pipelines/movielens.yaml", "--input", raw, "--out", out)

    none = [r["genres"] == "(no genres listed)" for r in rows]
    assert 0 < sum(none) < len(rows)
    assert pq.read_table(raw).column("genres").to_pylist() == [None if n else r["genres"].split("|") for r, n in zip(rows, none)]
    table = pq.read_table(out / "part-00000.parquet")
    first3 = [[] if n else r["genres"].split("|")[:3] for r, n in zip(rows, none)]
    genre_ids = vocab_ids([g for gs in first3 for g in gs], key=lambda g: string_key(g.encode()))
    assert "(no genres listed)" not in genre_ids
    assert table.column("genres").to_pylist() == [[genre_ids[g] for g in gs] for gs in first3]
    lists = [b.lists["genres"] for b in Loader(out, batch_size=len(rows))]
    lengths = (lists[0][1][1:] - lists[0][1][:-1]).tolist()
    assert lengths == [len(gs) for gs in first3] and lengths.count(0) == sum(none)
