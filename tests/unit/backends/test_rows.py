"""etl.backends.rows: scatter_rows against numpy fancy indexing, split_rows against its definition."""

from __future__ import annotations

import numpy as np
import pytest

from etl.backends.rows import scatter_rows, split_rows


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.uint8, np.uint64, np.bool_])
@pytest.mark.parametrize("width", [None, 1, 3, 13, 26])
def test_scatter_rows_copies_each_row_to_its_place(dtype: type, width: int | None) -> None:
    rng = np.random.default_rng(width or 0)
    shape = (50,) if width is None else (50, width)
    src = rng.integers(0, 100, shape).astype(dtype)
    src_rows = rng.integers(0, 50, 30)
    out_rows = rng.permutation(40)[:30]
    out = np.zeros((40, *shape[1:]), dtype)
    want = out.copy()
    want[out_rows] = src[src_rows]
    scatter_rows(src, src_rows, out, out_rows)
    assert np.array_equal(out, want)


def test_scatter_rows_reads_row_slices_and_writes_into_views() -> None:
    src = np.arange(200, dtype=np.float32).reshape(40, 5)[10:30]  # rows 10..29 of a larger array
    big = np.zeros((12, 5), np.float32)
    scatter_rows(src, np.array([0, 19, 4]), big[4:7], np.array([2, 1, 0]))  # a view of rows 4..6
    assert big[4:7].tolist() == [src[4].tolist(), src[19].tolist(), src[0].tolist()]
    assert not big[:4].any() and not big[7:].any()


def test_scatter_rows_refuses_arrays_it_cannot_copy_row_by_row() -> None:
    a = np.zeros((10, 4), np.int32)
    with pytest.raises(ValueError, match="contiguous"):
        scatter_rows(a[:, :2], np.array([0]), np.zeros((1, 2), np.int32), np.array([0]))  # rows with gaps
    with pytest.raises(ValueError):
        scatter_rows(a, np.array([0]), np.zeros((1, 4), np.int64), np.array([0]))  # another dtype
    with pytest.raises(ValueError):
        scatter_rows(a, np.array([0, 1]), np.zeros((2, 4), np.int32), np.array([0]))  # row counts differ
    with pytest.raises(ValueError):
        scatter_rows(a, np.array([0]), np.zeros((1, 3), np.int32), np.array([0]))  # widths differ


def test_split_rows_sorts_rows_by_array_keeping_their_order() -> None:
    starts = np.array([0, 4, 4, 9, 10])  # arrays of 4, 0, 5 and 1 rows
    rows = np.array([9, 0, 5, 3, 4, 8, 9, 1])
    src_rows, out_rows, bounds = split_rows(starts, rows)
    assert bounds.tolist() == [0, 3, 3, 6, 8]
    assert src_rows.tolist() == [0, 3, 1, 1, 0, 4, 0, 0]  # array 0: rows 0, 3, 1; array 2: 1, 0, 4; array 3: 0, 0
    assert out_rows.tolist() == [1, 3, 7, 2, 4, 5, 0, 6]
    rng = np.random.default_rng(5)
    rows = rng.permutation(10)
    src_rows, out_rows, bounds = split_rows(starts, rows)
    for k in range(4):
        a, b = bounds[k], bounds[k + 1]
        assert np.array_equal(src_rows[a:b] + starts[k], rows[out_rows[a:b]])
        assert np.all(np.diff(out_rows[a:b]) > 0)
    assert sorted(out_rows.tolist()) == list(range(10))
    empty = split_rows(starts, np.array([], np.int64))
    assert [len(x) for x in empty[:2]] == [0, 0] and empty[2].tolist() == [0] * 5


@pytest.mark.parametrize("width", [None, 1, 3])
def test_row_numbers_out_of_range_raise_instead_of_reading_or_writing_past_the_arrays(width: int | None) -> None:
    shape = () if width is None else (width,)
    src, out = np.arange(4 * (width or 1), dtype=np.int64).reshape(4, *shape), np.zeros((2, *shape), np.int64)
    for src_rows, out_rows in [([0, 4], [0, 1]), ([0, -1], [0, 1]), ([0, 1], [0, 2]), ([0, 1], [-1, 0])]:
        with pytest.raises(IndexError):
            scatter_rows(src, np.array(src_rows), out, np.array(out_rows))
    for rows in ([0, 10], [-1]):
        with pytest.raises(IndexError):
            split_rows(np.array([0, 4, 10]), np.array(rows))
