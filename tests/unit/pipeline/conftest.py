"""Shared data and references of the pipeline tests: generated Criteo-like shards (with a shard of bad rows), a
pipeline fitted on them with its artifacts, and reference transforms computed in plain Python (Counter-based
vocabularies, math.log1p) from the generated data; hash formulas come from etl.backends.hashing (checked
independently in test_hashing.py)."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from etl.backends import hashing
from etl.io.parquet import open_shard
from etl.pipeline import Pipeline

ROOT = Path(__file__).resolve().parents[3]
PIPELINES = ROOT / "pipelines"
CRITEO_SCHEMA = ROOT / "schemas" / "criteo.yaml"
DENSE = [f"I{i}" for i in range(1, 14)]
CATS = [f"C{i}" for i in range(1, 27)]


# ---------------------------------------------------------------- data


def criteo_table(seed: int, n: int, pools: dict[str, np.ndarray]) -> pa.Table:
    """Criteo-like rows: label, I1..I13 (nulls, negatives), C1..C26 8-hex-digit strings (nulls, Zipf repeats,
    some upper case)."""
    rng = np.random.default_rng(seed)
    cols: dict[str, pa.Array] = {"label": pa.array(rng.integers(0, 2, n), pa.int64())}
    for c in DENSE:
        v = rng.integers(-3, 1000, n)
        v[rng.random(n) < 0.05] = 2**40
        cols[c] = pa.array(v, pa.int64(), mask=rng.random(n) < 0.15)
    for c in CATS:
        pool = pools[c]
        rank = np.minimum(rng.zipf(1.6, n) - 1, len(pool) - 1)
        items = []
        for r, null, up in zip(rank, rng.random(n) < 0.1, rng.random(n) < 0.2):
            h = f"{int(pool[r]):08x}"
            items.append(None if null else (h.upper() if up else h))
        cols[c] = pa.array(items, pa.string())
    return pa.table(cols)


@pytest.fixture(scope="session")
def criteo(tmp_path_factory):
    d = tmp_path_factory.mktemp("criteo")
    rng = np.random.default_rng(42)
    pools = {c: rng.choice(2**32, size=60, replace=False) for c in CATS}
    pools["C1"][:2] = [0, 2**32 - 1]
    paths, tables = [], []
    for i, n in enumerate([230, 170, 310, 95]):
        t = criteo_table(100 + i, n, pools)
        p = d / f"part-{i}.parquet"
        pq.write_table(t, p, row_group_size=60)
        paths.append(p)
        tables.append(t)
    assert pq.ParquetFile(paths[0]).num_row_groups == 4
    return paths, tables, pools


def key_of(s: str | None) -> int | None:
    return None if s is None else int(s, 16)


def ref_vocab(counts: Counter, t: int, B: int, max_size=None) -> dict[int, int]:
    kept = sorted((-c, k) for k, c in counts.items() if c >= t)[:max_size]
    return {k: 2 + B + i for i, (_, k) in enumerate(kept)}


def ref_criteo_vocabs(tables, t=3) -> dict[str, dict[int, int]]:
    out = {}
    for c in CATS:
        cnt = Counter(key_of(s) for tb in tables for s in tb.column(c).to_pylist() if s is not None)
        out[c] = ref_vocab(cnt, t, 1)
    return out


def ref_criteo_rows(table: pa.Table, vocabs) -> dict[str, list]:
    """The DLRM reference transform of a table (criteo.yaml), column by column."""
    out: dict[str, list] = {"label": [float(np.float32(x)) for x in table.column("label").to_pylist()]}
    for c in DENSE:
        out[c] = [float(np.float32(math.log1p(max(0 if x is None else x, 0)))) for x in table.column(c).to_pylist()]
    for c in CATS:
        ids = []
        for s in table.column(c).to_pylist():
            k = key_of(s)
            ids.append(1 if k is None else vocabs[c].get(k, 2 + hashing.reduce(hashing.hash64(k, 0), 1)))
        out[c] = ids
    return out


@pytest.fixture(scope="session")
def fitted(criteo, tmp_path_factory):
    paths, tables, _ = criteo
    pipe = Pipeline.from_file(PIPELINES / "criteo.yaml")
    pipe.fit(paths, workers=2)
    art = tmp_path_factory.mktemp("art") / "criteo"
    pipe.save(art)
    return pipe, art


def transform_file(pipe: Pipeline, path: Path, on_error="raise"):
    shard = open_shard(path, pipe.schema)
    return [pipe.transform(shard.read(i), on_error) for i in range(shard.num_row_groups)]


# ---------------------------------------------------------------- movielens (lists, string keys, Normalize)


GENRES = ["Action", "Adventure", "Animation", "Children", "Comedy", "Crime", "Drama", "Fantasy", "Horror", "Sci-Fi"]


@pytest.fixture(scope="session")
def ml_shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("ml")
    rng = np.random.default_rng(7)
    paths, tables = [], []
    for i, n in enumerate([80, 120, 45]):
        genres = []
        for _ in range(n):
            r = rng.random()
            if r < 0.05:
                genres.append(None)
            elif r < 0.1:
                genres.append([])
            else:
                genres.append([GENRES[int(g)] for g in np.minimum(rng.zipf(1.5, rng.integers(1, 6)) - 1, 9)])
        ts = rng.integers(800_000_000, 1_700_000_000, n)
        t = pa.table({
            "userId": pa.array(rng.zipf(1.4, n) % 50, pa.int64()),
            "movieId": pa.array(rng.integers(1, 30, n), pa.int64(), mask=rng.random(n) < 0.05),
            "rating": pa.array(rng.integers(1, 11, n) / 2.0, pa.float64()),
            "timestamp": pa.array(ts, pa.int64(), mask=rng.random(n) < 0.05),
            "genres": pa.array(genres, pa.list_(pa.string())),
        })  # fmt: skip
        p = d / f"ml-{i}.parquet"
        pq.write_table(t, p, row_group_size=40)
        paths.append(p)
        tables.append(t)
    return paths, tables


# ---------------------------------------------------------------- pipeline files


def write_pipeline(tmp_path: Path, ops, schema=str(CRITEO_SCHEMA), **extra) -> Path:
    doc = {"name": "t", "schema": schema, "ops": ops, **extra}
    p = tmp_path / "pipe.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


DLRM = [
    {"op": "FillMissing", "columns": "@dense", "value": 0},
    {"op": "Clamp", "columns": "@dense", "min": 0},
    {"op": "Log1p", "columns": "@dense"},
    {"op": "Decode", "columns": "@categorical"},
    {"op": "Hash", "columns": "@categorical", "num_buckets": 1000},
]


# ---------------------------------------------------------------- invalid rows


BAD_ROWS = {  # file row -> (column, value); label None means a missing label
    5: ("C3", "zz123456"),
    61: ("C7", "1234567"),
    73: ("C3", "123456789"),
    74: ("label", None),
    119: ("C26", ""),
    120: ("C1", "68fd1e6g"),
}
EXTRA_BAD = {73: ("C9", "xyz")}  # row 73 is bad in two columns


@pytest.fixture(scope="session")
def bad_shard(criteo, tmp_path_factory):
    _, _, pools = criteo
    t = criteo_table(999, 150, pools)
    cols = {name: t.column(name).to_pylist() for name in t.column_names}
    for row, (c, v) in list(BAD_ROWS.items()) + list(EXTRA_BAD.items()):
        cols[c][row] = v
    fixed = pa.table({name: pa.array(v, t.schema.field(name).type) for name, v in cols.items()})
    p = tmp_path_factory.mktemp("bad") / "bad.parquet"
    pq.write_table(fixed, p, row_group_size=60)
    good = [i for i in range(150) if i not in BAD_ROWS]
    return p, fixed, good
