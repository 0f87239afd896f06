"""The naive baselines (etl.bench.baselines) against etl's own pipelines on small synthetic Criteo data."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.backends import hashing
from etl.bench import baselines, duckdb_baselines, polars_baselines
from etl.io.parquet import list_shards
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.schema import load_schema
from etl.tools.synth import generate

REPO = Path(__file__).resolve().parents[3]
BUCKETS = 40_000_000


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """Raw synthetic shards plus etl's outputs of both Criteo pipelines."""
    d = tmp_path_factory.mktemp("baselines")
    generate(load_schema(REPO / "schemas/criteo.yaml"), 20_000, 3, d / "raw", seed=0)
    files = list_shards(d / "raw")
    preprocess(Pipeline.from_file(REPO / "pipelines/criteo.yaml"), files, d / "ours_cat", workers=1)
    preprocess(Pipeline.from_file(REPO / "pipelines/criteo_hash.yaml"), files, d / "ours_hash", workers=1)
    return d


def files_of(work: Path) -> list[Path]:
    return list_shards(work / "raw")


def test_polars_categorify_equals_ours(work: Path) -> None:
    polars_baselines.polars_categorify(files_of(work), work / "polars_cat", freq_threshold=3)
    assert baselines.first_difference(work / "ours_cat", work / "polars_cat") is None


def test_numpy_categorify_equals_ours(work: Path) -> None:
    baselines.numpy_categorify(files_of(work), work / "numpy_cat", freq_threshold=3)
    assert baselines.first_difference(work / "ours_cat", work / "numpy_cat") is None
    # the comparison is not vacuous: vocabulary ids, the OOV id and the null id all occur
    t = pq.read_table(work / "numpy_cat" / "part-00000.parquet")
    ids = np.concatenate([t.column(c).to_numpy() for c in baselines.CATS])
    assert {1, 2, 3} <= set(np.unique(ids).tolist())


def test_numpy_hash_equals_ours(work: Path) -> None:
    baselines.numpy_hash(files_of(work), work / "numpy_hash", num_buckets=BUCKETS)
    assert baselines.same_output(work / "ours_hash", work / "numpy_hash")


def test_output_layout(work: Path) -> None:
    baselines.numpy_hash(files_of(work), work / "layout", num_buckets=BUCKETS)
    names = sorted(p.name for p in (work / "layout").glob("*.parquet"))
    assert names == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    schema = pq.read_schema(work / "layout" / names[0])
    assert schema.names == polars_baselines.OUTPUT_COLUMNS
    assert [f.type for f in schema] == [pa.float32()] * 14 + [pa.int32()] * 26


def test_polars_hash_schema_and_ranges(work: Path) -> None:
    n = 1000
    polars_baselines.polars_hash(files_of(work), work / "polars_hash", num_buckets=n)
    raw = pq.read_table(work / "raw" / "part-00001.parquet")
    out = pq.read_table(work / "polars_hash" / "part-00001.parquet")
    assert out.schema.names == polars_baselines.OUTPUT_COLUMNS
    assert [f.type for f in out.schema] == [pa.float32()] * 14 + [pa.int32()] * 26
    assert out.num_rows == raw.num_rows
    ours = pq.read_table(work / "ours_hash" / "part-00001.parquet")
    for c in ["label", *baselines.DENSE]:
        assert out.column(c).equals(ours.column(c))
    for c in baselines.CATS:
        ids = out.column(c).to_numpy()
        missing = raw.column(c).is_null().to_numpy(zero_copy_only=False)
        assert (ids[missing] == 1).all()
        assert ((ids[~missing] >= 2) & (ids[~missing] < 2 + n)).all()


def test_same_output_detects_one_changed_value(work: Path) -> None:
    copy = work / "changed"
    shutil.copytree(work / "ours_cat", copy, dirs_exist_ok=True)
    assert baselines.same_output(work / "ours_cat", copy)
    path = copy / "part-00002.parquet"
    t = pq.read_table(path)
    ids = t.column("C7").to_numpy().copy()
    ids[1234] += 1
    t = t.set_column(t.schema.get_field_index("C7"), t.schema.field("C7"), pa.array(ids))
    pq.write_table(t, path)
    assert not baselines.same_output(work / "ours_cat", copy)
    msg = baselines.first_difference(work / "ours_cat", copy)
    assert msg is not None and "part-00002.parquet" in msg and "'C7'" in msg and "row 1234" in msg

    # a float changed by one ulp is a difference too
    t2 = pq.read_table(work / "ours_cat" / "part-00000.parquet")
    d = t2.column("I3").to_numpy().copy()
    d[5] = np.nextafter(d[5], np.float32(np.inf))
    t2 = t2.set_column(t2.schema.get_field_index("I3"), t2.schema.field("I3"), pa.array(d))
    pq.write_table(t2, copy / "part-00000.parquet")
    msg = baselines.first_difference(work / "ours_cat", copy)
    assert msg is not None and "part-00000.parquet" in msg and "'I3' row 5" in msg


def test_same_output_detects_missing_file(work: Path, tmp_path: Path) -> None:
    shutil.copytree(work / "ours_cat", tmp_path / "x")
    (tmp_path / "x" / "part-00001.parquet").unlink()
    assert not baselines.same_output(work / "ours_cat", tmp_path / "x")


EDGE_KEYS = [0, 1, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 0x68FD1E64]


@pytest.mark.parametrize("seed", [0, 1, 12345])
@pytest.mark.parametrize("n", [1, 2, 1000, 40_000_000, 2**31])
def test_numpy_hash_matches_reference(seed: int, n: int) -> None:
    keys = np.array(EDGE_KEYS, np.uint64)
    got = baselines.numpy_hash_ids(keys, None, n, seed)
    want = [2 + hashing.reduce(hashing.hash64(k, seed), n) for k in EDGE_KEYS]
    if n < 2**31 - 1:
        assert got.tolist() == want
    else:  # ids above int32 wrap in the int32 output; the buckets themselves must still match
        assert (got.astype(np.int64) & 0xFFFFFFFF).tolist() == [w & 0xFFFFFFFF for w in want]


def test_numpy_hash_nulls() -> None:
    keys = np.array([5, 0, 7], np.uint64)
    ids = baselines.numpy_hash_ids(keys, np.array([True, False, True]), 10)
    assert ids[1] == 1 and ids.dtype == np.int32
    assert ids[0] == 2 + hashing.reduce(hashing.hash64(5, 0), 10)


def test_hex8_keys() -> None:
    arr = pa.chunked_array([["00000000", None, "FFFFFFFF"], ["68fd1e64", "aBcD0123", None]])
    keys, valid = baselines.hex8_keys(arr)
    assert valid.tolist() == [True, False, True, True, True, False]
    assert keys.tolist() == [0, 0, 0xFFFFFFFF, 0x68FD1E64, 0xABCD0123, 0]
    # a sliced array (non-zero offset) and string views
    assert baselines.hex8_keys(pa.array(["00000001", "00000002", "0000000a"]).slice(1))[0].tolist() == [2, 10]
    assert baselines.hex8_keys(pa.array(["0000000f"], pa.string_view()))[0].tolist() == [15]
    for bad in (["1234567"], ["123456789"], ["1234567g"]):
        with pytest.raises(ValueError):
            baselines.hex8_keys(pa.array(bad))


needs_duckdb = pytest.mark.skipif(not duckdb_baselines.HAS_DUCKDB, reason="duckdb is not installed (pip install 'etl[bench]')")


@needs_duckdb
@pytest.mark.parametrize("script", ["categorify", "categorify-joined"])
def test_duckdb_categorify_equals_ours(work: Path, script: str) -> None:
    """Both DuckDB categorify scripts (a join per file; one join of all files) write our output, row order included."""
    duckdb_baselines.SCRIPTS[script](files_of(work), work / script)
    assert baselines.first_difference(work / "ours_cat", work / script) is None


@needs_duckdb
def test_duckdb_hash_equals_ours_bit_for_bit(work: Path) -> None:
    duckdb_baselines.duckdb_hash(files_of(work), work / "duckdb_hash", num_buckets=BUCKETS)
    assert baselines.first_difference(work / "ours_hash", work / "duckdb_hash") is None


@needs_duckdb
@pytest.mark.parametrize("seed, n", [(0, 1), (7, 3), (123, 2**31)])
def test_duckdb_hash_matches_reference(seed: int, n: int, tmp_path: Path) -> None:
    """Keys over the whole 32-bit range, other seeds and bucket counts: the SQL macros equal etl's hash."""
    keys = np.array([0, 1, 0xFFFFFFFF, 0x80000000, 0xDEADBEEF, 12345], np.uint64)
    cols = {"label": pa.array(np.zeros(len(keys), np.int64))} | {c: pa.array(np.zeros(len(keys), np.int64)) for c in baselines.DENSE}
    cols |= {c: pa.array([f"{int(k):08x}" for k in keys]) for c in baselines.CATS}
    pq.write_table(pa.table(cols), tmp_path / "raw.parquet")
    duckdb_baselines.duckdb_hash([tmp_path / "raw.parquet"], tmp_path / "out", num_buckets=n, seed=seed)
    got = pq.read_table(tmp_path / "out" / "part-00000.parquet").column("C1").to_numpy()
    assert got.tolist() == baselines.numpy_hash_ids(keys, None, n, seed).tolist()
