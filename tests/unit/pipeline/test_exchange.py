"""etl.pipeline.exchange: spilled files read back a bucket range at a time and sorted, the per-row byte measure
(the same whatever file a row is in), the partition plan, and files that are not what spill writes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from etl.errors import InputError
from etl.io.text import raw_arrow_schema
from etl.pipeline import exchange
from etl.pipeline.exchange import BUCKET_BITS, BUCKETS, HASH, INPUT, ROW, SPANS, SPILL_ROWS, buckets, plan, read_partition, row_bytes, spill
from etl.schema import parse_schema

SCHEMA = parse_schema({"name": "e", "columns": [{"name": "k", "role": "categorical", "dtype": "int64"},
                                               {"name": "t", "role": "passthrough", "dtype": "int64"},
                                               {"name": "s", "role": "passthrough", "dtype": "string"},
                                               {"name": "g", "role": "list", "dtype": "string", "separator": "|"}]})  # fmt: skip


def rows(n: int, seed: int) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    table = pa.table({
        "k": pa.array(rng.integers(0, 50, n)),
        "t": pa.array(rng.integers(0, 5, n), mask=rng.random(n) < 0.1),
        "s": pa.array([("x" * int(i)) if i else None for i in rng.integers(0, 4, n)], pa.string_view()),
        "g": pa.array([[f"g{j}" for j in range(int(i))] if i < 3 else None for i in rng.integers(0, 4, n)], pa.list_(pa.string())),
    })  # fmt: skip
    hashes = rng.integers(0, 2**64, n, dtype=np.uint64)
    usable = rng.random(n) > 0.05
    return table, hashes, usable


@pytest.mark.parametrize("batch", [SPILL_ROWS, 16])
def test_partitions_hold_every_row_once_sorted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: int) -> None:
    monkeypatch.setattr(exchange, "SPILL_ROWS", batch)  # 16: a partition reads some of a file's batches
    files, total = [], np.zeros(BUCKETS, np.int64)
    for i, n in enumerate([300, 0, 500]):
        table, hashes, usable = rows(n, i)
        kept = np.arange(0, n, 2, dtype=np.int64)  # a stage removed the odd rows
        files.append(tmp_path / f"{i}.arrow")
        sizes = spill(files[-1], table, kept, SCHEMA, hashes, usable, f"shard{i}", i, 3, 1000)
        assert sizes.sum() == row_bytes(table.cast(raw_arrow_schema(SCHEMA)).take(kept)).sum()
        total += sizes
    ranges = plan(total, 2000)
    assert len(ranges) > 3 and ranges[0][0] == 0 and ranges[-1][1] == BUCKETS
    for path, n in zip(files, [300, 0, 500]):
        assert ipc.open_file(path).num_record_batches == -(-n // 2 // batch)
    got = [read_partition(files, lo, hi, SCHEMA, 3, ["t"]) for lo, hi in ranges]
    whole = pa.concat_tables(got)
    assert whole.num_rows == 400 and sorted(zip(whole.column(INPUT).to_pylist(), whole.column(ROW).to_pylist())) == sorted(
        (i, 1000 + r) for i, n in enumerate([300, 0, 500]) for r in range(0, n, 2))
    for part in got:  # sorted by hash (missing first), t (missing first), input, row
        keys = [(h is not None, h or 0, t is not None, t or 0, i, r) for h, t, i, r in
                zip(*(part.column(c).to_pylist() for c in (HASH, "t", INPUT, ROW)))]  # fmt: skip
        assert keys == sorted(keys)
    assert whole.column("s").type == pa.string() and whole.column("g").type == pa.list_(pa.field("element", pa.string()))


def test_row_bytes_depend_on_values_only() -> None:
    table, _, _ = rows(200, 1)
    whole = row_bytes(table.cast(pa.schema([("k", pa.int64()), ("t", pa.int64()), ("s", pa.string()), ("g", pa.list_(pa.string()))])))
    parts = np.concatenate([row_bytes(table.slice(0, 77)), row_bytes(table.slice(77))])
    assert np.array_equal(whole, parts)
    s = table.column("s").to_pylist()
    g = table.column("g").to_pylist()
    assert whole.tolist() == [24 + 8 + 8 + 4 + len(x or "") + 4 + sum(4 + len(v) for v in (y or [])) for x, y in zip(s, g)]


def test_plan_cuts_consecutive_buckets() -> None:
    sizes = np.zeros(BUCKETS, np.int64)
    sizes[[0, 5, 6, 7, 100]] = [10, 10, 95, 10, 10]
    assert plan(sizes, 30) == [(0, 6), (6, 7), (7, BUCKETS)]
    assert plan(np.zeros(BUCKETS, np.int64), 1) == [(0, BUCKETS)]
    assert plan(sizes, 10**9) == [(0, BUCKETS)]


def test_buckets_are_the_top_bits() -> None:
    h = np.array([0, 2**64 - 1, 1 << (64 - BUCKET_BITS)], np.uint64)
    assert buckets(h, np.array([True, True, False])).tolist() == [0, BUCKETS - 1, 0]


def write_ipc(path: Path, table: pa.Table, metadata: dict[bytes, bytes] | None = None, chunk: int = SPILL_ROWS) -> Path:
    with ipc.new_file(str(path), table.schema.with_metadata(metadata or {})) as w:
        w.write_table(table, max_chunksize=chunk)
    return path


def test_a_file_that_is_not_a_spilled_one_is_refused(tmp_path: Path) -> None:
    table, hashes, usable = rows(100, 2)
    good = tmp_path / "good.arrow"
    spill(good, table, np.arange(100), SCHEMA, hashes, usable, "shard", 0, 0, 0)
    spilled = ipc.open_file(good).read_all()
    spans, b = spilled.schema.metadata, buckets_of(spilled)
    assert json.loads(spans[SPANS]) == [[int(b[0]), int(b[-1])]]  # the first and last bucket of its one batch
    cases = {  # a file, what the error says
        "other columns": (write_ipc(tmp_path / "other.arrow", table, spans), "columns .*not a spilled file"),
        "Parquet": (tmp_path / "good.parquet", "cannot read"),
        "no spans": (write_ipc(tmp_path / "bare.arrow", spilled.replace_schema_metadata(None)), "no spans"),
        "spans of other batches": (write_ipc(tmp_path / "batches.arrow", spilled, spans, chunk=30), "do not fit its 4 batches"),
        "spans out of order": (write_ipc(tmp_path / "spans.arrow", spilled, {SPANS: b"[[9, 3]]"}), "do not fit"),
        "rows out of order": (write_ipc(tmp_path / "shuffled.arrow", spilled.take(np.arange(100)[::-1].copy()), spans), "bucket order"),
        "rows outside the span": (write_ipc(tmp_path / "outside.arrow", spilled, {SPANS: b"[[0, 0]]"}), "bucket order"),
    }
    pq.write_table(spilled, tmp_path / "good.parquet")
    for name, (path, message) in cases.items():
        with pytest.raises(InputError, match=message) as e:
            read_partition([path], 0, BUCKETS, SCHEMA, 1, [])
        assert str(path) in str(e.value), name
    with pytest.raises(InputError, match="input shards"):
        read_partition([good], 0, BUCKETS, SCHEMA, 0, [])
    (tmp_path / "cut.arrow").write_bytes(good.read_bytes()[:-10])
    with pytest.raises(InputError, match="cannot read"):
        read_partition([tmp_path / "cut.arrow"], 0, BUCKETS, SCHEMA, 1, [])


def test_values_that_are_no_valid_arrow_data_are_refused(tmp_path: Path) -> None:
    """The offsets of a text column going back (a value of negative length): refused at the door, not read."""
    table, hashes, usable = rows(10, 3)
    good = tmp_path / "good.arrow"
    spill(good, table, np.arange(10), SCHEMA, hashes, usable, "shard", 0, 0, 0)
    spilled = ipc.open_file(good).read_all()
    offsets = np.arange(0, 22, 2, dtype=np.int32)  # ten values "ab"
    offsets[1] = 6
    broken = pa.Array.from_buffers(pa.string(), 10, [None, pa.py_buffer(offsets), pa.py_buffer(b"ab" * 10)])
    path = write_ipc(tmp_path / "broken.arrow", spilled.set_column(2, "s", broken), spilled.schema.metadata)
    with pytest.raises(InputError, match="cannot read"):
        read_partition([path], 0, BUCKETS, SCHEMA, 1, [])


def buckets_of(table: pa.Table) -> np.ndarray:
    hashes = table.column(HASH)
    return buckets(np.asarray(hashes.fill_null(0).to_numpy(), np.uint64), np.asarray(hashes.is_valid()))


def test_values_the_raw_layout_cannot_hold_name_the_shard(tmp_path: Path) -> None:
    table = pa.table({"k": pa.array([2**63], pa.uint64()), "t": [1], "s": ["a"], "g": pa.array([["x"]])})
    with pytest.raises(InputError, match="shard7.*row group 2.*column 'k'"):
        spill(tmp_path / "x.arrow", table, np.arange(1), SCHEMA, np.zeros(1, np.uint64), np.ones(1, np.bool_), "shard7", 0, 2, 0)
