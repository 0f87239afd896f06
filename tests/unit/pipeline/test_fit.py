"""Fitting over shards: results against plain-Python references, byte-identical artifacts whatever the shard
order and worker count, progress, invalid rows while fitting, list columns (MovieLens)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.backends import cpu, hashing
from etl.errors import FitError, RowError, SpecError
from etl.pipeline import Pipeline
from etl.pipeline.fit import _finalize_units, rows_of
from tests.conftest import tree_bytes
from tests.unit.pipeline.conftest import (
    BAD_ROWS,
    CATS,
    DLRM,
    GENRES,
    PIPELINES,
    key_of,
    ref_criteo_rows,
    ref_criteo_vocabs,
    ref_vocab,
    transform_file,
    write_pipeline,
)

# ---------------------------------------------------------------- criteo


def test_fit_transform_matches_reference(criteo, fitted):
    paths, tables, _ = criteo
    pipe, _ = fitted
    vocabs = ref_criteo_vocabs(tables)
    assert any(len(v) < len({k for tb in tables for k in tb.column(c).to_pylist() if k}) for c, v in vocabs.items())
    assert pipe.cardinalities() == {c: 3 + len(vocabs[c]) for c in CATS}
    for c in CATS:
        v = pipe.ops[4].vocab[c]
        assert dict(zip(v.column("key").to_pylist(), v.column("id").to_pylist())) == vocabs[c]
        assert v.column("raw").to_pylist() == [f"{k:08x}" for k in vocabs[c]]
    for path, table in zip(paths, tables):
        outs = [pipe.to_arrow(t.batch) for t in transform_file(pipe, path)]
        got = pa.concat_tables(outs)
        ref = ref_criteo_rows(table, vocabs)
        for c in pipe.output_columns:
            assert got.column(c).to_pylist() == ref[c], c


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("perm", [(0, 1, 2, 3), (3, 1, 0, 2), (2, 3, 1, 0)])
def test_fit_invariance_artifacts_byte_identical(criteo, fitted, workers, perm, tmp_path):
    paths = [criteo[0][i] for i in perm]
    _, reference_dir = fitted
    pipe = Pipeline.from_file(PIPELINES / "criteo.yaml")
    pipe.fit(paths, workers=workers)
    pipe.save(tmp_path / "a")
    ref, got = tree_bytes(reference_dir), tree_bytes(tmp_path / "a")
    assert sorted(got) == sorted(ref)
    assert len(ref) == 27  # pipeline.json + 26 vocabularies
    for name in ref:
        assert got[name] == ref[name], name


def test_fit_progress_counts_rows(criteo):
    paths, tables, _ = criteo
    seen = []
    Pipeline.from_file(PIPELINES / "criteo.yaml").fit(paths, workers=2, progress=lambda name, n: seen.append((name, n)))
    assert {name for name, _ in seen} == {"fit"}
    assert sum(n for _, n in seen) == sum(t.num_rows for t in tables)
    assert len(seen) == sum(pq.ParquetFile(p).num_row_groups for p in paths)


def test_fit_progress_names_each_stage_and_counts_its_rows_once(criteo, tmp_path):
    """The second Normalize reads what the first writes: two fitting passes, each over every row once."""
    paths, tables, _ = criteo
    ops = [DLRM[0], {"op": "Normalize", "columns": "@dense"}, {"op": "Normalize", "columns": "@dense"}, *DLRM[3:]]
    seen: dict[str, int] = {}

    def progress(name: str, n: int) -> None:
        seen[name] = seen.get(name, 0) + n

    Pipeline.from_file(write_pipeline(tmp_path, ops)).fit(paths, workers=2, progress=progress)
    rows = sum(t.num_rows for t in tables)
    assert seen == {"fit 1/2": rows, "fit 2/2": rows}


def test_fit_raise_and_quarantine(criteo, bad_shard):
    paths, tables, _ = criteo
    path, table, good = bad_shard
    with pytest.raises(RowError) as ei:
        Pipeline.from_file(PIPELINES / "criteo.yaml").fit(paths + [path], workers=2)
    assert ei.value.path == str(path)
    p = Pipeline.from_file(PIPELINES / "criteo.yaml")
    p.fit(paths + [path], workers=2, on_error="quarantine")
    # rows with malformed keys do not count; the row whose only problem is a missing label (74) may or may not
    # count (it is rejected at the output check, which fitting need not run): accept either
    decode_bad = {r for r, (c, _) in BAD_ROWS.items() if c != "label"}
    refs = []
    for label_row_counts in (True, False):
        keep = [i for i in range(table.num_rows) if i not in decode_bad and (label_row_counts or i != 74)]
        refs.append(ref_criteo_vocabs(tables + [table.take(keep)]))
    got = {}
    for c in CATS:
        v = p.ops[4].vocab[c]
        got[c] = dict(zip(v.column("key").to_pylist(), v.column("id").to_pylist()))
    assert got == refs[0] or got == refs[1]


def test_duplicate_column_in_op_is_rejected_or_counted_once(criteo, tmp_path):
    """``columns: ["@categorical", "C1"]`` names C1 twice. Either the spec is rejected, or C1 is counted once."""
    paths, tables, _ = criteo
    ops = [dict(o) for o in DLRM[:4]] + [{"op": "Categorify", "columns": ["@categorical", "C1"], "freq_threshold": 3}]
    p = write_pipeline(tmp_path, ops)
    try:
        pipe = Pipeline.from_file(p)
    except SpecError as e:
        assert e.field == "ops[4] (Categorify).columns" and "C1" in e.problem
        return
    pipe.fit(paths)
    v = pipe.ops[4].vocab["C1"]
    got = dict(zip(v.column("key").to_pylist(), v.column("count").to_pylist()))
    cnt = Counter(key_of(s) for tb in tables for s in tb.column("C1").to_pylist() if s is not None)
    assert got == {k: c for k, c in cnt.items() if c >= 3}


# ---------------------------------------------------------------- movielens (lists, string keys, Normalize)


def test_fit_invariance_movielens(tmp_path, ml_shards):
    path_list, _ = ml_shards
    dirs = []
    for i, (perm, workers) in enumerate([((0, 1, 2), 1), ((2, 0, 1), 3), ((1, 2, 0), 2)]):
        p = Pipeline.from_file(PIPELINES / "movielens.yaml")
        p.fit([path_list[j] for j in perm], workers=workers)
        p.save(tmp_path / str(i))
        dirs.append(tree_bytes(tmp_path / str(i)))
    assert dirs[0] == dirs[1] == dirs[2]


def test_movielens_fit_transform_vs_reference(ml_shards):
    paths, tables = ml_shards
    pipe = Pipeline.from_file(PIPELINES / "movielens.yaml")
    pipe.fit(paths, workers=2)
    full = pa.concat_tables(tables)
    vocab = {}
    for c in ("userId", "movieId"):
        vocab[c] = ref_vocab(Counter(x % 2**64 for x in full.column(c).to_pylist() if x is not None), 1, 1)
    gcount = Counter(hashing.string_key(g.encode()) for row in full.column("genres").to_pylist() for g in (row or [])[:3])
    vocab["genres"] = ref_vocab(gcount, 1, 1)
    ts = np.array([x for x in full.column("timestamp").to_pylist() if x is not None], np.float64)
    mean, std = ts.mean(), ts.std()
    norm = pipe.ops[4]
    assert norm.mean["timestamp"] == pytest.approx(mean, rel=1e-12)
    assert norm.std["timestamp"] == pytest.approx(std, rel=1e-7)
    genre_vocab = pipe.ops[3].vocab["genres"]
    assert set(genre_vocab.column("raw").to_pylist()) <= set(GENRES)
    for k, raw in zip(genre_vocab.column("key").to_pylist(), genre_vocab.column("raw").to_pylist()):
        assert k == hashing.string_key(raw.encode())
    assert pipe.output_schema().field("genres").type == pa.list_(pa.int32())
    out = pa.concat_tables([pipe.to_arrow(t.batch) for p in paths for t in transform_file(pipe, p)])
    assert out.schema == pipe.output_schema()
    for c in ("userId", "movieId"):
        assert out.column(c).to_pylist() == [1 if x is None else vocab[c].get(x, 2) for x in full.column(c).to_pylist()]
    assert out.column("genres").to_pylist() == [
        [vocab["genres"][hashing.string_key(g.encode())] for g in (row or [])[:3]] for row in full.column("genres").to_pylist()
    ]
    assert out.column("rating").to_pylist() == [float(np.float32(x)) for x in full.column("rating").to_pylist()]
    got_ts = out.column("timestamp").to_pylist()
    for g, x in zip(got_ts, full.column("timestamp").to_pylist()):
        if x is None:
            assert g is None
        else:
            assert g == pytest.approx((x - mean) / std, abs=1e-5)


class _Failing:
    """An op stand-in whose finalize of a column fails with the column's name (after ``delay`` seconds)."""

    def __init__(self, delay: dict[str, float]):
        self.delay = delay
        self.done: list[str] = []

    def finalize(self, stats, xp):
        (c,) = stats
        time.sleep(self.delay.get(c, 0))
        self.done.append(c)
        if c != "ok":
            raise FitError("Failing", c, "no values to fit")


def test_finalize_units_raises_the_first_error_in_unit_order():
    op = _Failing({"late": 0.2})  # the first unit fails last: its error is still the one raised
    units = [(op, {"late": None}), (op, {"ok": None}), (op, {"early": None})]
    with pytest.raises(FitError, match="'late'"):
        _finalize_units(units, 2, cpu)
    assert sorted(op.done) == ["early", "late", "ok"]  # every unit was finalized


def test_rows_of_local_shards_sums_their_footers_and_is_none_when_one_cannot_be_read(tmp_path: Path) -> None:
    for name, n in (("a.parquet", 3), ("b.parquet", 5)):
        pq.write_table(pa.table({"x": list(range(n))}), tmp_path / name)
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    assert rows_of([tmp_path / "a.parquet", tmp_path / "b.parquet"]) == 8
    assert rows_of([tmp_path / "a.parquet", tmp_path / "bad.parquet"]) is None
    assert rows_of([tmp_path / "a.parquet", tmp_path / "gone.parquet"]) is None
