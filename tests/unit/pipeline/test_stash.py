"""etl.pipeline.stash: entries in memory within the budget, spilled to Arrow IPC files beyond it and read back
equal (memory-mapped), the spill directory removed on close and on error, and budget sizes parsed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from etl.batch import Batch, Column, InlineStrings, Strings
from etl.errors import ConfigError
from etl.io.files import is_temporary
from etl.pipeline import stash as stash_module
from etl.pipeline.stash import (
    DEFAULT_BUDGET_FRACTION,
    DEFAULT_STASH_BUDGET,
    RawRows,
    Stash,
    StashClosed,
    _parts,
    default_budget,
    default_stash_budget,
    entry_bytes,
    pack,
    parse_budget,
)


def batch(n: int = 5) -> Batch:
    """A batch with every kind of column: numbers with missing values, keys with their raw text, inline text,
    offset text, a list column."""
    valid = np.arange(n) % 3 != 0
    text = b"".join(f"v{i}".encode() for i in range(n))
    starts = np.array([2 * i for i in range(n)], np.int64)
    views = np.zeros((n, 4), np.uint32)
    views[:, 0] = 2
    views[:, 1] = np.arange(n, dtype=np.uint32) + 0x3030
    columns = {
        "x": Column(np.linspace(0, 1, n), valid),
        "k": Column(np.arange(n, dtype=np.uint64) * 7, raw=Strings(np.frombuffer(text, np.uint8), starts, starts + 2)),
        "inline": Column(InlineStrings(views)),
        "s": Column(Strings(np.frombuffer(text, np.uint8), starts, starts + 2), valid),
        "l": Column(np.arange(2 * n, dtype=np.int32), None, np.arange(0, 2 * n + 1, 2, dtype=np.int64)),
    }
    return Batch(columns, n, "shard.parquet", 3, np.arange(100, 100 + n, dtype=np.int64))


def assert_same(a: Batch, b: Batch) -> None:
    assert (a.num_rows, a.source, a.row_group) == (b.num_rows, b.source, b.row_group)
    assert np.array_equal(a.row_ids, b.row_ids)
    assert list(a.columns) == list(b.columns)
    for name, x in a.columns.items():
        y = b.columns[name]
        assert type(x.values) is type(y.values), name
        if isinstance(x.values, Strings):
            assert x.values.to_list() == y.values.to_list(), name
        else:
            assert x.values.dtype == y.values.dtype and x.values.tobytes() == y.values.tobytes(), name  # bit for bit
        for part in ("valid", "offsets"):
            u, v = getattr(x, part), getattr(y, part)
            assert (u is None) == (v is None) and (u is None or np.array_equal(u, v)), (name, part)
        assert (x.raw is None) == (y.raw is None) and (x.raw is None or x.raw.to_list() == y.raw.to_list())


def spill_dirs(d: Path) -> list[Path]:
    return [p for p in d.iterdir() if is_temporary(p.name)]


def test_entries_within_the_budget_stay_in_memory(tmp_path: Path) -> None:
    b = batch()
    with Stash(2 * entry_bytes(b), tmp_path) as stash:
        stash.put((0, 0), b)
        stash.put((0, 1), b)
        assert_same(stash.get((0, 0)), b)
        assert stash.spill_directory is None
        assert stash.peak_bytes == 2 * entry_bytes(b) and stash.spilled_bytes == 0
        assert_same(stash.pop((0, 0)), b)
        assert (0, 0) not in stash
        stash.put((1, 0), b)  # room again
        assert stash.spill_directory is None
    assert spill_dirs(tmp_path) == []


def test_beyond_the_budget_entries_are_spilled_and_read_back_equal(tmp_path: Path) -> None:
    b = batch()
    raw = RawRows(pa.table({"a": pa.array(["x", None, "yz"], pa.string_view()), "b": [1, 2, 3]}), "f.parquet", 2, 40)
    with Stash(entry_bytes(b), tmp_path) as stash:
        stash.put((0, 0), b)
        stash.put((0, 1), b)
        stash.put((1, 0), raw)
        assert stash.peak_bytes == entry_bytes(b) <= stash.budget
        d = stash.spill_directory
        assert d is not None and d.parent == tmp_path and is_temporary(d.name)
        assert sorted(p.name for p in d.iterdir()) == ["0-1.arrow", "1-0.arrow"]
        assert stash.spilled_bytes == sum(p.stat().st_size for p in d.iterdir())
        back = stash.get((0, 1))
        assert isinstance(back, Batch)
        assert_same(back, b)
        got = stash.pop((1, 0))
        assert isinstance(got, RawRows) and got.table.equals(raw.table) and got.table.schema.metadata is None
        assert (got.source, got.row_group, got.first_row) == ("f.parquet", 2, 40)
        assert sorted(p.name for p in d.iterdir()) == ["0-1.arrow"]  # popped: its file is gone
        assert_same(stash.pop((0, 1)), b)
    assert spill_dirs(tmp_path) == []


@pytest.mark.parametrize(
    ("dtype", "values", "held"),
    [
        (np.int64, [0, 1, 1, 0], np.int8),
        (np.int64, [-129, 127], np.int16),
        (np.int64, [0, 1 << 15], np.int32),
        (np.int64, [-(1 << 31) - 1, 5], np.int64),
        (np.int64, [np.iinfo(np.int64).min, np.iinfo(np.int64).max], np.int64),
        (np.uint64, [0, 255], np.uint8),
        (np.uint64, [0, (1 << 32) - 1], np.uint32),
        (np.uint64, [1 << 32], np.uint64),
        (np.uint64, [np.iinfo(np.uint64).max], np.uint64),
        (np.int32, [-1, 70000], np.int32),
        (np.float64, [0.5, np.nan, -np.inf], np.float64),
        (np.bool_, [True, False], np.bool_),
    ],
)
def test_numbers_are_held_in_the_narrowest_type_that_gives_them_back_exactly(dtype: type, values: list, held: type) -> None:
    n = 1000
    a = np.resize(np.array(values, dtype), n)
    b = Batch({"a": Column(a, np.arange(n) % 7 != 3), "b": Column(a.copy())}, n, "s.parquet", 1, np.arange(7, 7 + n, dtype=np.int64))
    packed = pack(b)
    values, valid_bits = packed.columns["a"]
    assert values.data.dtype == np.dtype(held) and valid_bits is not None and valid_bits.data.nbytes == n // 8
    assert_same(packed.batch(), b)


def test_a_packed_batch_holds_fewer_bytes_than_its_arrays(tmp_path: Path) -> None:
    """Keys below 2**32 (8-digit hex), 0/1 labels and small counts with missing values: what a Criteo row group
    holds once decoded."""
    n = 4096
    rng = np.random.default_rng(0)
    valid = rng.random(n) < 0.9
    columns = {
        "label": Column(rng.integers(0, 2, n)),
        "I1": Column(rng.integers(0, 5000, n), valid),
        "C1": Column(rng.integers(0, 1 << 32, n, dtype=np.uint64), valid),
    }
    b = Batch(columns, n, "s.parquet", 0, np.arange(n, dtype=np.int64))
    wide = b.row_ids.nbytes + sum(c.values.nbytes + (0 if c.valid is None else c.valid.nbytes) for c in columns.values())
    assert entry_bytes(b) < wide / 2
    with Stash(entry_bytes(b), tmp_path) as stash:
        stash.put((0, 0), b)
        assert stash.spill_directory is None
        assert_same(stash.pop((0, 0)), b)


def test_a_spilled_batch_is_written_packed_and_read_back_equal(tmp_path: Path) -> None:
    """Narrowed integers, validity bitmaps and bool values go to disk as they are held in memory."""
    n = 4000
    valid = np.arange(n) % 5 != 0
    b = Batch({"n": Column(np.arange(n, dtype=np.int64) % 100, valid), "flag": Column(np.arange(n) % 3 == 0),
               "key": Column(np.arange(n, dtype=np.uint64) * 1_000_000), **batch(n).columns}, n, "s.parquet", 1,
              np.arange(n, dtype=np.int64))  # fmt: skip
    unpacked = sum(a.nbytes for c in b.columns.values() for _, a in _parts(c)) + b.row_ids.nbytes
    with Stash(0, tmp_path) as stash:
        stash.put((0, 0), b)
        assert 0 < stash.spilled_bytes < unpacked - 15 * n  # int64 -> int8, uint64 -> uint32, row ids -> int16, bitmaps
        assert_same(stash.pop((0, 0)), b)


def test_an_empty_batch_round_trips(tmp_path: Path) -> None:
    b = batch(0)
    with Stash(0, tmp_path) as stash:
        stash.put((0, 0), b)
        assert_same(stash.get((0, 0)), b)


def test_the_spill_directory_is_removed_on_error_and_later_puts_are_refused(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt), Stash(0, tmp_path) as stash:
        stash.put((0, 0), batch())
        assert len(spill_dirs(tmp_path)) == 1
        raise KeyboardInterrupt
    assert spill_dirs(tmp_path) == []
    with pytest.raises(StashClosed):
        stash.put((0, 1), batch())
    assert spill_dirs(tmp_path) == []


@pytest.mark.parametrize(("text", "n"), [("0", 0), ("512", 512), ("1k", 1024), ("512M", 512 << 20), ("2G", 2 << 30), ("1.5g", 3 << 29),
                                         ("64KiB", 64 << 10), (4096, 4096)])  # fmt: skip
def test_budget_sizes(text: str | int, n: int) -> None:
    assert parse_budget(text) == n


@pytest.mark.parametrize("text", ["", "lots", "-1G", "2X", "1e9"])
def test_bad_budget_sizes_are_config_errors(text: str) -> None:
    with pytest.raises(ConfigError, match="memory-budget"):
        parse_budget(text)


@pytest.mark.parametrize(("limit", "expected"), [("1073741824\n", 1 << 28), ("max\n", None), (None, None)])
def test_the_default_budget_is_a_quarter_of_the_memory_or_of_a_lower_container_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: str | None, expected: int | None
) -> None:
    path = tmp_path / "memory.max"
    if limit is not None:
        path.write_text(limit)
    monkeypatch.setattr(stash_module, "_CGROUP_LIMITS", (str(path),))
    total = stash_module._meminfo_total()
    assert total is not None and total > 1 << 28
    assert default_budget() == (expected if expected is not None else int(total * DEFAULT_BUDGET_FRACTION))


@pytest.mark.parametrize(("limit", "expected"), [("134217728\n", 32 << 20), ("max\n", DEFAULT_STASH_BUDGET)])
def test_the_default_stash_budget_is_64_mib_or_the_default_budget_when_lower(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: str, expected: int
) -> None:
    (tmp_path / "memory.max").write_text(limit)
    monkeypatch.setattr(stash_module, "_CGROUP_LIMITS", (str(tmp_path / "memory.max"),))
    assert DEFAULT_STASH_BUDGET == 64 << 20
    assert default_stash_budget() == expected
