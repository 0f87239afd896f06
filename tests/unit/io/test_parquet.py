"""etl.io.parquet: both row-group engines (polars, and pyarrow when polars is missing) give the same batches, and
the in-place string views (InlineStrings) behave as Strings."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.backends import cpu
from etl.batch import InlineStrings, Strings
from etl.errors import InputError
from etl.io import parquet
from etl.io.parquet import batch_from_arrow, list_shards, open_shard, read_rows
from etl.pipeline import Pipeline
from etl.schema import ColumnSpec, load_schema
from etl.tools.synth import generate

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[Path]:
    out = tmp_path_factory.mktemp("raw")
    return generate(load_schema(REPO / "schemas/criteo.yaml"), 3000, 2, out, seed=3)


def _columns_equal(a, b) -> None:
    assert (a.valid is None) == (b.valid is None)
    if a.valid is not None:
        assert np.array_equal(a.valid, b.valid)
    if isinstance(a.values, Strings):
        assert isinstance(b.values, Strings)
        mask = a.valid if a.valid is not None else np.ones(len(a.values), bool)
        assert [x for x, m in zip(a.values.to_list(), mask) if m] == [x for x, m in zip(b.values.to_list(), mask) if m]
    else:  # values under nulls are unspecified
        mask = a.valid if a.valid is not None else np.ones(len(a.values), bool)
        assert np.array_equal(a.values[mask], b.values[mask])


@pytest.mark.skipif(parquet.pl is None, reason="polars is not installed")
def test_pyarrow_engine_reads_the_same_batches(shards, monkeypatch):
    schema = load_schema(REPO / "schemas/criteo.yaml")
    shard = open_shard(shards[0], schema)
    for first, n in [(0, 1500), (200, 700), (1499, 1)]:
        polars_batch = batch_from_arrow(read_rows(shard.path, schema.names, first, n, 0), schema)
        monkeypatch.setattr(parquet, "ENGINE", "pyarrow")
        arrow_table = read_rows(shard.path, schema.names, first, n, 0)
        monkeypatch.setattr(parquet, "ENGINE", "polars")
        assert arrow_table.column_names == schema.names
        arrow_batch = batch_from_arrow(arrow_table, schema)
        assert arrow_batch.num_rows == polars_batch.num_rows == n
        for c in schema.names:
            _columns_equal(polars_batch[c], arrow_batch[c])


def test_pyarrow_engine_gives_the_same_pipeline_output(shards, monkeypatch):
    outputs = {}
    for engine in ("polars", "pyarrow") if parquet.pl is not None else ("pyarrow",):
        monkeypatch.setattr(parquet, "ENGINE", engine)
        p = Pipeline.from_file(REPO / "pipelines/criteo.yaml")
        p.fit(shards, workers=2)
        shard = open_shard(shards[1], p.schema)
        outputs[engine] = [p.to_arrow(p.transform(shard.read(i)).batch) for i in range(shard.num_row_groups)]
    first, *rest = outputs.values()
    for other in rest:
        assert all(a.equals(b) for a, b in zip(first, other))


def test_pyarrow_engine_errors_name_the_file(shards, monkeypatch, tmp_path):
    monkeypatch.setattr(parquet, "ENGINE", "pyarrow")
    with pytest.raises(InputError, match="column 'nope'"):
        read_rows(shards[0], ["label", "nope"], 0, 10, 0)
    with pytest.raises(InputError, match="not within row group"):
        read_rows(shards[0], ["label"], 1400, 200, 0)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(InputError, match="bad.parquet"):
        read_rows(bad, ["label"], 0, 1, 0)


def test_readers_work_without_polars(shards):
    """A process where ``import polars`` fails (as on a machine without it) reads with pyarrow."""
    code = (
        "import sys; sys.modules['polars'] = None\n"
        "from etl.io import parquet\n"
        "from etl.pipeline import Pipeline\n"
        "assert parquet.ENGINE == 'pyarrow', parquet.ENGINE\n"
        f"p = Pipeline.from_file({str(REPO / 'pipelines/criteo_hash.yaml')!r})\n"
        f"shard = parquet.open_shard({str(shards[0])!r}, p.schema)\n"
        "out = p.to_arrow(p.transform(shard.read(0)).batch)\n"
        "print(out.num_rows, int(out.column('C1').to_numpy().sum()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    p = Pipeline.from_file(REPO / "pipelines/criteo_hash.yaml")
    out = p.to_arrow(p.transform(open_shard(shards[0], p.schema).read(0)).batch)
    assert proc.stdout.split() == [str(out.num_rows), str(int(out.column("C1").to_numpy().sum()))]


def test_inline_strings_behave_as_strings():
    items = ["68fd1e64", None, "", "0123456789ab", "xyz", "ABCDEF01"]
    arr = pa.array(["pad"] + items, pa.string_view()).slice(1)
    s = parquet._strings(arr)
    assert isinstance(s, InlineStrings) and len(s) == len(items)
    assert s.to_list() == [x or "" for x in items]
    assert (s.ends - s.starts).tolist() == [len(x or "") for x in items]
    assert s.take(np.array([5, 0])).to_list() == ["ABCDEF01", "68fd1e64"]
    plain = Strings(s.data, s.starts, s.ends)  # the same strings through start/end arrays
    valid = np.array([x is not None for x in items])
    for width in (8, None, 12):
        k1, b1 = cpu.decode_hex(s, valid, width)
        k2, b2 = cpu.decode_hex(plain, valid, width)
        assert np.array_equal(k1, k2)
        assert (b1 is None and b2 is None) or np.array_equal(b1, b2)


def test_long_string_views_fall_back_to_offsets():
    arr = pa.array(["a" * 20, "b"], pa.string_view())
    s = parquet._strings(arr)
    assert not isinstance(s, InlineStrings)
    assert s.to_list() == ["a" * 20, "b"]


STRINGS = ["0000000a", None, "a" * 20, "0000000a", ""]


@pytest.mark.parametrize(
    "arr",
    [
        pa.array(STRINGS, t)
        for t in (pa.large_string(), pa.string_view(), pa.binary(), pa.large_binary(), pa.binary_view())
    ]
    + [pa.array(STRINGS, t).dictionary_encode() for t in (pa.string(), pa.string_view(), pa.binary_view())],
    ids=lambda arr: str(arr.type),
)
def test_string_like_columns_read_as_plain_strings(arr: pa.Array) -> None:
    spec = ColumnSpec("C1", "categorical", "string")
    parquet.check_type("x.parquet", spec, arr.type)
    column = parquet.column_from_arrow(arr, spec)
    plain = parquet.column_from_arrow(pa.array(STRINGS, pa.string()), spec)
    assert column.values.to_list() == plain.values.to_list()
    assert np.array_equal(column.valid, plain.valid)


def test_written_shard_round_trip_pyarrow(tmp_path, monkeypatch):
    monkeypatch.setattr(parquet, "ENGINE", "pyarrow")
    t = pa.table({"label": pa.array([1, 0, 1], pa.int64()), "C1": pa.array(["0000000a", None, "ffffffff"])})
    pq.write_table(t, tmp_path / "x.parquet", row_group_size=2)
    assert read_rows(tmp_path / "x.parquet", ["C1", "label"], 2, 1, 1).to_pydict() == {"C1": ["ffffffff"], "label": [1]}


@pytest.mark.parametrize("engine", ["polars", "pyarrow"])
def test_rows_past_the_end_of_a_shortened_file_are_an_error_naming_it(tmp_path, monkeypatch, engine):
    """A file shortened (replaced) after its footer was read: the rows asked for that it no longer holds are an
    ``InputError`` naming it, never a shorter table (a loader would lose those rows without a word)."""
    if engine == "polars" and parquet.pl is None:
        pytest.skip("polars is not installed")
    monkeypatch.setattr(parquet, "ENGINE", engine)
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"label": pa.array(range(100), pa.int64())}), path)
    footer = parquet.read_footer(path)
    pq.write_table(pa.table({"label": pa.array(range(40), pa.int64())}), path)
    with pytest.raises(InputError, match=r"x\.parquet, row group 0: .*rows 20\.\.80"):
        read_rows(path, ["label"], 20, 60, 0, footer)


def test_list_shards_follows_symlinks_and_refuses_dangling_ones(tmp_path: Path) -> None:
    d = tmp_path / "raw"
    d.mkdir()
    pq.write_table(pa.table({"x": [1]}), tmp_path / "real.parquet")
    (d / "part-00000.parquet").symlink_to(tmp_path / "real.parquet")
    (d / "nested.parquet").mkdir()  # a subdirectory: skipped, not searched
    (d / "notes.txt").write_text("not a shard")
    assert list_shards(d) == [d / "part-00000.parquet"]
    (d / "part-00001.parquet").symlink_to(tmp_path / "gone.parquet")
    with pytest.raises(InputError, match=r"part-00001.parquet: dangling symlink: its target .*gone.parquet does not exist"):
        list_shards(d)
    with pytest.raises(InputError, match="part-00001.parquet: dangling symlink"):
        list_shards(d / "part-00001.parquet")
    (d / "part-00001.parquet").unlink()
    os.mkfifo(d / "part-00002.parquet")
    with pytest.raises(InputError, match="part-00002.parquet: not a regular file"):
        list_shards(d)


def test_list_shards_takes_a_directory_of_shard_names_in_index_order(tmp_path: Path) -> None:
    """Past part-99999 a shard name is wider: part-100000.parquet comes after part-99999.parquet, not (as in
    name order) between part-10000.parquet and part-10001.parquet. A directory with any other name is in name order."""
    d = tmp_path / "raw"
    d.mkdir()
    for i in (100000, 10001, 99999, 10000, 2):
        pq.write_table(pa.table({"x": [i]}), d / f"part-{i:05d}.parquet")
    assert [p.name for p in list_shards(d)] == [f"part-{i:05d}.parquet" for i in (2, 10000, 10001, 99999, 100000)]
    pq.write_table(pa.table({"x": [0]}), d / "extra.parquet")
    names = ["extra.parquet", "part-00002.parquet", "part-10000.parquet", "part-100000.parquet", "part-10001.parquet", "part-99999.parquet"]
    assert [p.name for p in list_shards(d)] == names


def test_unsigned_64_bit_numbers_keep_their_value_and_keys_their_bits() -> None:
    big = [2**64 - 1, 2**63, 5, None]
    arr = pa.array(big, pa.uint64())
    dense = parquet.column_from_arrow(arr, ColumnSpec("I1", "dense", "int64", None))
    assert dense.array.dtype == np.float64
    assert dense.array[:3].tolist() == [float(2**64 - 1), float(2**63), 5.0] and dense.valid.tolist() == [True] * 3 + [False]
    keys = parquet.column_from_arrow(arr, ColumnSpec("C1", "categorical", "int64", "int"))
    assert keys.array[:3].view(np.uint64).tolist() == big[:3]


def test_unsigned_64_bit_dense_value_through_the_dlrm_transform() -> None:
    """2**64 - 1 in a dense column becomes ln(1 + 1.8e19) = 44.36..., not a wrapped -1 clamped to 0."""
    pipe = Pipeline.from_file(REPO / "pipelines/criteo_hash.yaml")
    schema = pipe.output_schema()
    cols: dict[str, pa.Array] = {"label": pa.array([1], pa.int64())}
    for name in pipe.schema.by_role("dense"):
        cols[name] = pa.array([2**64 - 1], pa.uint64())
    for name in pipe.schema.by_role("categorical"):
        cols[name] = pa.array(["0000abcd"], pa.string())
    out = pipe.transform_table(pa.table(cols))
    assert schema.names == out.schema.names
    assert out["I1"][0].as_py() == pytest.approx(np.log1p(float(2**64 - 1)), rel=1e-6)


def test_footer_sha256_is_the_checksum_of_the_footer(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"x": [1, 2, 3]}), path)
    data = path.read_bytes()
    length = int.from_bytes(data[-8:-4], "little")
    assert parquet.footer_sha256(path) == hashlib.sha256(data[-8 - length:]).hexdigest()
    pq.write_table(pa.table({"x": [1, 2, 4]}), path)  # same size, other statistics
    assert len(path.read_bytes()) == len(data) and parquet.footer_sha256(path) != hashlib.sha256(data[-8 - length:]).hexdigest()


@pytest.mark.parametrize("content", [b"", b"PAR1", b"not a parquet file at all", b"\xff\xff\xff\x7fPAR1"])
def test_footer_sha256_of_a_file_without_a_footer_hashes_its_last_bytes(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.parquet"
    path.write_bytes(content)
    assert parquet.footer_sha256(path) == hashlib.sha256(content[-8:]).hexdigest()


def test_timestamp_columns_are_read_as_counts_of_the_schema_unit(tmp_path: Path) -> None:
    from etl.schema import parse_schema

    def schema(unit: str):
        return parse_schema({"name": "t", "columns": [{"name": "ts", "role": "passthrough", "dtype": "int64", "unit": unit}]})

    path = tmp_path / "t.parquet"
    ms = np.array([1_700_000_000_123, -1_500, 0], np.int64)
    pq.write_table(pa.table({"ts": pa.array(ms, pa.timestamp("ms", tz="Europe/Paris"), mask=np.array([False, False, True]))}), path)
    shard = open_shard(path, schema("us"))
    col = shard.read(0)["ts"]
    assert col.values.tolist()[:2] == (ms[:2] * 1000).tolist() and col.valid.tolist() == [True, True, False]
    assert shard.read_table(0).column("ts").to_pylist() == [ms[0] * 1000, ms[1] * 1000, None]
    assert open_shard(path, schema("ms")).read(0)["ts"].values.tolist()[:2] == ms[:2].tolist()
    with pytest.raises(InputError, match=r"column 'ts'.*no whole number of s"):
        open_shard(path, schema("s")).read(0)
    pq.write_table(pa.table({"ts": pa.array([2**60], pa.timestamp("ms"))}), path)
    with pytest.raises(InputError, match="beyond the int64 range in ns"):
        open_shard(path, schema("ns")).read_table(0)
    no_unit = parse_schema({"name": "t", "columns": [{"name": "ts", "role": "passthrough", "dtype": "int64"}]})
    with pytest.raises(InputError, match="expected int64 values, found timestamp"):
        open_shard(path, no_unit)
