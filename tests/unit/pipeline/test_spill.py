"""Spilled count tables and ranked partitions: partitions read back from a spilled partial make up the partial for
any partition count, ranked files read back in order, and files that are not what the fit wrote are refused."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.errors import InputError
from etl.ops.counts import KeyCounts, merge_counts, partition_of
from etl.pipeline import spill


def some_partial(n: int, texts: bool, seed: int = 0) -> KeyCounts:
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True))
    t = pa.array([f"k{k}" for k in keys.tolist()], pa.string()) if texts else None
    return KeyCounts(keys, rng.integers(1, 50, len(keys)).astype(np.int64), 0, t)


@pytest.mark.parametrize("texts", [False, True])
@pytest.mark.parametrize("partitions", [1, 3, 8, 100])
def test_partitions_of_a_spilled_partial_make_up_the_partial(tmp_path, monkeypatch, texts, partitions):
    monkeypatch.setattr(spill, "SPILL_ROW_GROUP", 50)  # many row groups: partitions are found by their statistics
    part = some_partial(1000, texts)
    path = tmp_path / "p.parquet"
    spill.write_partial(path, part)
    assert pq.ParquetFile(path).num_row_groups > 10
    pieces = [spill.read_partition(path, p, partitions, texts) for p in range(partitions)]
    for p, piece in enumerate(pieces):
        assert (partition_of(piece.keys, partitions) == p).all()
        assert piece.keys.tolist() == sorted(piece.keys.tolist())
    got = merge_counts(pieces)
    assert got.keys.tolist() == part.keys.tolist() and got.counts.tolist() == part.counts.tolist()
    if texts:
        assert got.texts.to_pylist() == part.texts.to_pylist()


def test_empty_partial_round_trip(tmp_path):
    path = tmp_path / "e.parquet"
    spill.write_partial(path, KeyCounts(np.zeros(0, np.uint64), np.zeros(0, np.int64)))
    assert len(spill.read_partition(path, 0, 2, False)) == 0


def test_ranked_round_trip_in_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(spill, "RANKED_CHUNK", 7)
    ranked = some_partial(100, True).ranked(1, None)
    path = tmp_path / "r.parquet"
    spill.write_ranked(path, ranked)
    chunks = list(spill.read_ranked(path, True))
    assert len(chunks) > 10
    assert np.concatenate([c.keys for c in chunks]).tolist() == ranked.keys.tolist()
    assert sum((c.texts.to_pylist() for c in chunks), []) == ranked.texts.to_pylist()


def test_files_that_are_not_the_fits_are_refused(tmp_path):
    part = some_partial(200, False)
    path = tmp_path / "p.parquet"
    spill.write_partial(path, part)
    t = pq.read_table(path)
    # a key moved to another hash: rows out of place
    keys = t.column("key").to_numpy().copy()
    keys[3] ^= np.uint64(1)
    pq.write_table(t.set_column(1, "key", pa.array(keys, pa.uint64())), tmp_path / "bad.parquet")
    with pytest.raises(InputError, match="hash"):
        spill.read_partition(tmp_path / "bad.parquet", 0, 1, False)
    pq.write_table(t.drop_columns(["count"]), tmp_path / "cols.parquet")
    with pytest.raises(InputError, match="columns"):
        spill.read_partition(tmp_path / "cols.parquet", 0, 1, False)
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputError, match="junk.parquet"):
        spill.read_partition(tmp_path / "junk.parquet", 0, 1, False)
    ranked = part.ranked(1, None)
    spill.write_ranked(tmp_path / "r.parquet", ranked.take(np.arange(len(ranked))[::-1]))
    with pytest.raises(InputError, match="out of order"):
        list(spill.read_ranked(tmp_path / "r.parquet", False))
    zero = ranked.take(np.arange(len(ranked)))
    zero.counts[-1] = 0
    spill.write_ranked(tmp_path / "z.parquet", zero)
    with pytest.raises(InputError, match="counts below 1"):
        list(spill.read_ranked(tmp_path / "z.parquet", False))
