"""Column/Batch/Strings take and to_list against plain-Python list slicing."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from etl.batch import Batch, Column, Strings, take_values
from etl.io.parquet import column_from_arrow
from etl.schema import ColumnSpec


def strings_of(items: list[str], dtype=np.int64) -> Strings:
    bs = [s.encode() for s in items]
    offs = np.zeros(len(bs) + 1, dtype)
    np.cumsum([len(b) for b in bs], out=offs[1:])
    return Strings.from_offsets(np.frombuffer(b"".join(bs), np.uint8).copy(), offs)


WORDS = ["", "a", "bc", "héllo", "Sci-Fi", "", "zz123456", "中文"]


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_strings_to_list_and_take(dtype):
    s = strings_of(WORDS, dtype)
    assert len(s) == len(WORDS)
    assert s.to_list() == WORDS
    for idx in ([7, 0, 3, 3], [], [1], list(range(len(WORDS)))[::-1]):
        t = s.take(np.array(idx, np.int64))
        assert t.to_list() == [WORDS[i] for i in idx]
        assert len(t) == len(idx)
        assert t.data.dtype == np.uint8
        assert t.data.tobytes() == "".join(WORDS[i] for i in idx).encode()  # compacted


def test_strings_from_sliced_arrow():
    arr = pa.array(["x", "yy", None, "zzz", "w"]).slice(1)
    col = column_from_arrow(arr, ColumnSpec("c", "categorical", "string", "string"))
    assert col.values.to_list()[0] == "yy" and col.values.to_list()[2] == "zzz"
    assert col.valid.tolist() == [True, False, True, True]
    t = col.take(np.array([2, 0]))
    assert t.values.to_list() == ["zzz", "yy"] and t.valid.tolist() == [True, True]


def test_strings_with_gaps_and_overlaps():
    """starts/ends need not be contiguous (string views): strings may share or skip bytes."""
    data = np.frombuffer(b"XXhelloYYworld", np.uint8)
    s = Strings(data, np.array([2, 9, 2, 0]), np.array([7, 14, 4, 0]))
    assert s.to_list() == ["hello", "world", "he", ""]
    t = s.take(np.array([1, 3, 2]))
    assert t.to_list() == ["world", "", "he"]
    assert t.data.tobytes() == b"worldhe"


@pytest.mark.parametrize("typ", [pa.string(), pa.large_string(), pa.string_view()])
def test_strings_from_arrow_types(typ):
    items = ["short", None, "a string longer than twelve bytes", "", "x"]
    arr = pa.array(["pad"] + items, typ).slice(1)
    col = column_from_arrow(arr, ColumnSpec("c", "categorical", "string", "string"))
    assert [x if v else None for x, v in zip(col.values.to_list(), col.valid)] == items
    t = col.take(np.array([4, 2, 0]))
    assert t.values.to_list() == ["x", items[2], "short"]


def test_scalar_column_take():
    v = np.arange(10, 20, dtype=np.int64)
    valid = np.array([i % 3 != 0 for i in range(10)])
    col = Column(v, valid)
    rows = np.array([9, 0, 4, 4])
    t = col.take(rows)
    assert t.values.tolist() == [19, 10, 14, 14]
    assert t.valid.tolist() == [valid[i] for i in rows]
    assert t.offsets is None and t.raw is None and not t.is_list
    assert len(t) == 4
    assert t.null_count() == sum(not valid[i] for i in rows)
    t2 = Column(v).take(np.array([1]))
    assert t2.valid is None and t2.values.tolist() == [11] and t2.null_count() == 0


def _list_column():
    rows = [["a", "b"], [], ["c"], ["d", "e", "f"], [], ["g"]]
    flat = [x for r in rows for x in r]
    offs = np.zeros(len(rows) + 1, np.int64)
    np.cumsum([len(r) for r in rows], out=offs[1:])
    keys = np.array([ord(x) for x in flat], np.uint64)
    valid = np.array([x not in ("b", "e") for x in flat])
    return rows, Column(keys, valid, offs, strings_of(flat))


@pytest.mark.parametrize("sel", [[3, 0, 1], [1, 4], [], [5, 5, 2], [0, 1, 2, 3, 4, 5]])
def test_list_column_take_with_raw(sel):
    rows, col = _list_column()
    assert col.is_list and len(col) == len(rows)
    t = col.take(np.array(sel, np.int64))
    assert len(t) == len(sel)
    got_rows = [t.values[t.offsets[i] : t.offsets[i + 1]].tolist() for i in range(len(sel))]
    assert got_rows == [[ord(x) for x in rows[i]] for i in sel]
    raw = t.raw.to_list()
    assert [raw[t.offsets[i] : t.offsets[i + 1]] for i in range(len(sel))] == [rows[i] for i in sel]
    assert t.valid.tolist() == [x not in ("b", "e") for i in sel for x in rows[i]]
    assert t.offsets[0] == 0 and t.offsets.dtype == np.int64


def test_strings_list_column_take():
    rows = [["Action", "Comedy"], ["Drama"], []]
    flat = [x for r in rows for x in r]
    col = Column(strings_of(flat), None, np.array([0, 2, 3, 3]))
    t = col.take(np.array([2, 0]))
    assert t.values.to_list() == ["Action", "Comedy"]
    assert t.offsets.tolist() == [0, 0, 2]
    assert t.valid is None


def test_take_values_dispatch():
    s = strings_of(["p", "q", "r"])
    assert take_values(s, np.array([2, 0])).to_list() == ["r", "p"]
    assert take_values(np.array([5, 6, 7]), np.array([2, 0])).tolist() == [7, 5]


def test_batch_take_keeps_source_and_row_ids():
    rows, lc = _list_column()
    n = len(rows)
    b = Batch(
        {"x": Column(np.arange(n, dtype=np.float64) * 1.5), "s": Column(strings_of([str(i) for i in range(n)])), "l": lc},
        n,
        "f.parquet",
        3,
        np.arange(100, 100 + n, dtype=np.int64),
    )
    t = b.take(np.array([4, 1]))
    assert t.num_rows == 2 and t.source == "f.parquet" and t.row_group == 3
    assert t.row_ids.tolist() == [104, 101]
    assert t["x"].values.tolist() == [6.0, 1.5]
    assert t["s"].values.to_list() == ["4", "1"]
    assert t["l"].offsets.tolist() == [0, 0, 0]
    assert b.num_rows == n and b.row_ids.tolist() == list(range(100, 100 + n))  # original untouched


def test_batch_default_row_ids_and_with_columns():
    b = Batch({"x": Column(np.zeros(3))}, 3)
    assert b.row_ids.tolist() == [0, 1, 2] and b.source == "<memory>"
    b2 = b.with_columns({"y": Column(np.ones(3))})
    assert set(b2.columns) == {"x", "y"} and set(b.columns) == {"x"}
