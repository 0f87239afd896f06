"""etl.ops.history_sorted: the histories of rows sorted by key and time, against the plain-Python reference and the
streaming state, whatever the cut into slices (equal-time runs, keys and ttl windows across slices)."""

from __future__ import annotations

import numpy as np
import pytest

from etl.ops.history import KEY_HASH, RAW_TIME, History
from etl.ops.history_sorted import SortedHistory
from etl.ops.stream import Carried
from tests.unit.ops.test_history_state import advance, new_state, reference


def new_sorted(max_len: int, ttl: int | None = None, columns: tuple[str, ...] = ("item",)) -> SortedHistory:
    op = History(list(columns), key="user", time="ts", max_len=max_len, ttl=ttl)
    spec = op.state_spec()
    return SortedHistory([i.column for i in spec.inputs], spec.outputs, max_len, op.ttl)


def histories(state: SortedHistory, keys, times, values, cuts: list[int]) -> list[list[int]]:
    """The rows' histories (lists of the values) given in the slices ``cuts`` makes (their ends)."""
    out, start = [], 0
    for end in [*cuts, len(keys)]:
        ok = np.ones(end - start, np.bool_)
        inputs = {KEY_HASH: Carried(np.asarray(keys[start:end], np.uint64), ok), RAW_TIME: Carried(np.asarray(times[start:end], np.int64), ok),
                  "item": Carried(np.asarray(values[start:end], np.int64), ok)}  # fmt: skip
        got = state.advance(inputs)
        lengths, flat = got["hist_len"], got["hist_item"]
        assert lengths.dtype == np.int32 and flat.dtype == np.int64 and len(flat) == int(lengths.sum())
        offsets = np.r_[0, np.cumsum(lengths)]
        out += [flat[offsets[i] : offsets[i + 1]].tolist() for i in range(end - start)]
        start = end
    return out


def sorted_rows(rng: np.random.Generator, n: int, keys: int, span: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    key = rng.integers(0, keys, n).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    time = rng.integers(0, span, n)
    order = np.lexsort((time, key))
    return key[order], time[order], rng.integers(0, 1000, n)


def test_issue_example_in_slices_of_one_row() -> None:
    assert histories(new_sorted(2), [5, 5, 5, 5], [10, 20, 20, 30], [7, 8, 9, 4], [1, 2, 3]) == [[], [7], [7], [8, 9]]


def test_a_run_of_equal_times_longer_than_max_len_across_slices() -> None:
    keys, times, values = [1] * 8, [1, 1, 2, 2, 2, 2, 2, 3], list(range(1, 9))
    expected = [[], [], [1, 2], [1, 2], [1, 2], [1, 2], [1, 2], [6, 7]]
    for cuts in ([], [3], [2, 4, 6], list(range(1, 8))):
        assert histories(new_sorted(2), keys, times, values, cuts) == expected


@pytest.mark.parametrize("seed", range(8))
def test_against_the_reference_and_the_streaming_state(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(25):
        n, max_len = int(rng.integers(1, 200)), int(rng.integers(1, 6))
        ttl = None if rng.random() < 0.5 else int(rng.integers(1, 8))
        keys, times, values = sorted_rows(rng, n, int(rng.integers(1, 8)), int(rng.integers(1, 30)))
        cuts = sorted(set(rng.integers(0, n + 1, int(rng.integers(0, 6))).tolist()))
        got = histories(new_sorted(max_len, ttl), keys, times, values, cuts)
        assert got == reference(keys, times, values, max_len, ttl)
        assert got == advance(new_state(max_len, ttl), keys, times, values, record=False)[0]


def test_ttl_at_the_edge_of_the_time_range() -> None:
    low = np.iinfo(np.int64).min
    keys, times, values = [3, 3, 3], [low, low + 1, low + 5], [1, 2, 3]
    assert histories(new_sorted(5, ttl=1), keys, times, values, [1]) == [[], [1], []]


def test_rows_kept_between_slices_stay_bounded() -> None:
    """One key of many rows: a slice keeps at most max_len rows before the last row's time, and that time's rows."""
    state = new_sorted(3)
    rows = 10_000
    times = np.arange(rows) // 2  # two rows per time
    histories(state, np.ones(rows, np.uint64), times, np.arange(rows), list(range(100, rows, 100)))
    assert state.rows_kept <= 3 + 2
