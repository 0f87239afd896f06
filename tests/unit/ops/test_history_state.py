"""etl.ops.history_state: the per-key state against a plain-Python reference (strictly earlier, latest max_len,
ties, ttl, batch cuts), least-recently-seen eviction, late rows, undo records, export / check / restore."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from etl.ops.base import InvalidState
from etl.ops.history import KEY_HASH, RAW_TIME, History
from etl.ops.history_state import HistoryState, LateRow
from etl.ops.stream import Carried


def new_state(max_len: int, ttl: int | None = None, max_keys: int | None = None, columns: tuple[str, ...] = ("item",)) -> HistoryState:
    op = History(list(columns), key="user", time="ts", max_len=max_len, ttl=ttl)
    state = op.new_stream_state(op.state_spec().name, max_keys=max_keys)
    assert isinstance(state, HistoryState)
    return state


def advance(state: HistoryState, keys, times, values, record: bool = True) -> tuple[list[list[int]], object]:
    """The rows' histories (lists of the first column's values) and the undo record."""
    n = len(keys)
    ok = np.ones(n, np.bool_)
    inputs = {KEY_HASH: Carried(np.asarray(keys, np.uint64), ok), RAW_TIME: Carried(np.asarray(times, np.int64), ok)}
    for c in state.columns:
        inputs[c] = Carried(np.asarray(values, np.int64), ok)
    step = state.advance(inputs, record=record)
    lengths = step.outputs["hist_len"]
    assert lengths.dtype == np.int32
    flat = step.outputs[f"hist_{state.columns[0]}"]
    assert len(flat) == int(lengths.sum())
    offsets = np.r_[0, np.cumsum(lengths)]
    return [flat[offsets[i] : offsets[i + 1]].tolist() for i in range(n)], step.undo


def reference(keys, times, values, max_len: int, ttl: int | None) -> list[list[int]]:
    """Plain Python: each row's history is the values of the earlier rows of its key with a strictly earlier time
    (within ttl), ordered by (time, row), the latest max_len."""
    out = []
    for i in range(len(keys)):
        events = [(times[j], j) for j in range(i) if keys[j] == keys[i] and times[j] < times[i] and (ttl is None or times[i] - ttl <= times[j])]
        out.append([values[j] for _, j in sorted(events)][-max_len:] if events else [])
    return out


def time_ordered(rng: np.random.Generator, n: int, keys: int, span: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    key = rng.integers(0, keys, n).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return key, np.sort(rng.integers(0, span, n)), rng.integers(0, 1000, n)


def test_issue_example() -> None:
    state = new_state(max_len=2)
    hist, _ = advance(state, [5, 5, 5, 5], [10, 20, 20, 30], [7, 8, 9, 4])
    assert hist == [[], [7], [7], [8, 9]]


def test_same_time_rows_never_see_each_other_across_batches() -> None:
    state = new_state(max_len=3)
    assert advance(state, [1, 1], [5, 7], [10, 11])[0] == [[], [10]]
    assert advance(state, [1], [7], [12])[0] == [[10]]  # the same time as the last row of the batch before
    assert advance(state, [1], [8], [13])[0] == [[10, 11, 12]]


def test_more_same_time_rows_than_max_len() -> None:
    state = new_state(max_len=2)
    hist, _ = advance(state, [1] * 6, [1, 1, 2, 2, 2, 3], [1, 2, 3, 4, 5, 6])
    assert hist == [[], [], [1, 2], [1, 2], [1, 2], [4, 5]]


@pytest.mark.parametrize("seed", range(6))
def test_against_the_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(30):
        n, max_len = int(rng.integers(1, 150)), int(rng.integers(1, 5))
        ttl = None if rng.random() < 0.5 else int(rng.integers(1, 8))
        keys, times, values = time_ordered(rng, n, int(rng.integers(1, 6)), 25)
        state = new_state(max_len, ttl)
        cuts = sorted({0, n, *rng.integers(0, n, 3).tolist()})
        got = []
        for a, b in zip(cuts, cuts[1:]):
            got += advance(state, keys[a:b], times[a:b], values[a:b])[0]
        assert got == reference(keys, times, values, max_len, ttl)


def test_times_at_the_int64_edges_with_a_ttl() -> None:
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    state = new_state(max_len=4, ttl=10)
    assert advance(state, [1, 1, 2, 2], [lo, lo + 5, hi - 20, hi], [1, 2, 3, 4])[0] == [[], [1], [], []]


def test_key_sorted_input_is_exact_with_one_key_kept() -> None:
    rng = np.random.default_rng(7)
    keys = np.sort(rng.integers(0, 40, 400)).astype(np.uint64)
    times = rng.integers(0, 30, 400)
    order = np.lexsort((np.arange(400), times, keys))
    keys, times, values = keys[order], times[order], rng.integers(0, 99, 400)
    state = new_state(max_len=3, max_keys=1)
    assert advance(state, keys, times, values)[0] == reference(keys, times, values, 3, None)
    assert state.evictions == len(np.unique(keys)) - 1


def test_least_recently_seen_key_is_evicted() -> None:
    state = new_state(max_len=5, max_keys=2)
    advance(state, [1, 2, 1, 3], [1, 2, 3, 4], [10, 20, 11, 30])  # 3 evicts 2, seen longest ago
    assert state.evictions == 1 and state.keys_held == 2
    hist, _ = advance(state, [1, 2], [9, 9], [12, 21])
    assert hist == [[10, 11], []]  # 2 forgot its history; 2 then evicted 3
    assert state.evictions == 2


def test_tables_grow_with_the_keys() -> None:
    state = new_state(max_len=1)
    keys = np.arange(5000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    advance(state, keys, np.zeros(5000), np.arange(5000))
    hist, _ = advance(state, keys, np.ones(5000), np.zeros(5000))
    assert hist == [[i] for i in range(5000)]
    assert state.keys_held == 5000 and state.evictions == 0


def test_a_late_row_is_refused_and_the_rows_before_it_taken() -> None:
    state = new_state(max_len=2)
    with pytest.raises(LateRow) as e:
        advance(state, [1, 1, 1], [5, 6, 4], [1, 2, 3])
    assert e.value.row == 2
    assert advance(state, [1], [7], [9])[0] == [[1, 2]]


def test_invalid_rows_are_refused() -> None:
    state = new_state(max_len=2)
    inputs = {KEY_HASH: Carried(np.zeros(2, np.uint64), np.array([True, False])), RAW_TIME: Carried(np.zeros(2, np.int64), np.ones(2, np.bool_)),
              "item": Carried(np.zeros(2, np.int64), np.ones(2, np.bool_))}  # fmt: skip
    with pytest.raises(ValueError, match="needs a key"):
        state.advance(inputs)


def test_two_columns_share_lengths() -> None:
    op = History(["a", "b"], key="u", time="t", max_len=2)
    state = op.new_stream_state("hist_*")
    ok = np.ones(3, np.bool_)
    step = state.advance({KEY_HASH: Carried(np.array([1, 1, 1], np.uint64), ok), RAW_TIME: Carried(np.array([1, 2, 3]), ok),
                          "a": Carried(np.array([1, 2, 3]), ok), "b": Carried(np.array([7, 8, 9]), ok)})  # fmt: skip
    assert step.outputs["hist_len"].tolist() == [0, 1, 2]
    assert step.outputs["hist_a"].tolist() == [1, 1, 2] and step.outputs["hist_b"].tolist() == [7, 7, 8]


def test_undo_records_give_back_every_earlier_state() -> None:
    rng = np.random.default_rng(3)
    for trial in range(40):
        n = int(rng.integers(1, 200))
        keys, times, values = time_ordered(rng, n, int(rng.integers(1, 12)), 40)
        state = new_state(max_len=int(rng.integers(1, 4)), max_keys=int(rng.integers(1, 10)))
        cuts = sorted({0, n, *rng.integers(0, n, 4).tolist()})
        exports, undos = [state.export()], []
        for a, b in zip(cuts, cuts[1:]):
            undos.append(advance(state, keys[a:b], times[a:b], values[a:b])[1])
            exports.append(state.export())
        for back in range(len(undos) + 1):
            got = state.export(undo=undos[::-1][:back])
            want = exports[len(exports) - 1 - back]
            assert got.keys() == want.keys()
            for k in want:
                assert np.array_equal(np.asarray(got[k]), np.asarray(want[k])), (trial, back, k)


def test_restore_continues_as_the_state_exported() -> None:
    rng = np.random.default_rng(4)
    keys, times, values = time_ordered(rng, 300, 20, 50)
    a = new_state(max_len=3, ttl=9, max_keys=8)
    advance(a, keys[:150], times[:150], values[:150])
    for saved in (a.export(), a.export(canonical=False)):
        b = new_state(max_len=3, ttl=9, max_keys=8)
        b.check(saved)
        b.restore(saved)
        assert advance(b, keys[150:], times[150:], values[150:], record=False)[0] == advance(new_copy(a), keys[150:], times[150:], values[150:])[0]


def new_copy(state: HistoryState) -> HistoryState:
    copy = new_state(state.max_len, state.ttl, state.max_keys)
    copy.restore(state.export())
    return copy


def test_export_is_canonical_whatever_the_slots() -> None:
    a, b = new_state(max_len=2), new_state(max_len=2)
    advance(a, [1, 2, 3], [1, 1, 1], [1, 2, 3])
    advance(b, [3, 2, 1], [1, 1, 1], [3, 2, 1])
    ea, eb = a.export(), b.export()
    assert np.array_equal(ea["key"], eb["key"]) and np.array_equal(ea["value.item"], eb["value.item"])


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda s: s.update(rows=-1), "rows"),
        (lambda s: s.update(time=s["time"][::-1].copy()), "time order"),
        (lambda s: s.update(last=s["last"] + 100), "last"),
        (lambda s: s.update(key=np.array([1, 2, 1, 1], np.uint64)), "together"),
        (lambda s: s.update(**{"value.item": s["value.item"][:2]}), "length"),
    ],
)
def test_check_refuses_a_tampered_state(change, problem: str) -> None:
    state = new_state(max_len=3)
    advance(state, [1, 1, 1, 1], [1, 2, 3, 4], [1, 2, 3, 4])
    saved = state.export()
    change(saved)
    with pytest.raises(InvalidState, match=problem):
        state.check(saved)


def test_check_refuses_more_entries_than_max_len() -> None:
    state = new_state(max_len=3)
    advance(state, [1] * 4, [1, 2, 3, 4], [1, 2, 3, 4])
    small = new_state(max_len=1)
    with pytest.raises(InvalidState, match="max_len"):
        small.check(state.export())
    few = new_state(max_len=3, max_keys=1)
    advance(state, [2], [1], [1])
    with pytest.raises(InvalidState, match="max_keys"):
        few.check(state.export())


def lru_reference(keys, times, values, max_len: int, max_keys: int) -> tuple[list[list[int]], int]:
    """Plain Python with at most ``max_keys`` keys: a new key evicts the key seen least recently, which forgets
    its events; the histories and the evictions."""
    kept: OrderedDict[int, list[tuple[int, int]]] = OrderedDict()
    out, evictions = [], 0
    for k, t, v in zip(keys.tolist(), times.tolist(), values.tolist()):
        if k not in kept and len(kept) == max_keys:
            kept.popitem(last=False)
            evictions += 1
        events = kept.pop(k, [])
        out.append([w for s, w in events if s < t][-max_len:])
        kept[k] = [*events, (t, v)]
    return out, evictions


@pytest.mark.parametrize("seed", range(4))
def test_eviction_against_an_lru_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(20):
        n, max_keys = int(rng.integers(1, 400)), int(rng.integers(1, 40))
        keys, times, values = time_ordered(rng, n, int(rng.integers(1, 80)), 60)
        state = new_state(max_len=3, max_keys=max_keys)
        cuts = sorted({0, n, *rng.integers(0, n, 3).tolist()})
        got = []
        for a, b in zip(cuts, cuts[1:]):
            got += advance(state, keys[a:b], times[a:b], values[a:b])[0]
        want, evictions = lru_reference(keys, times, values, 3, max_keys)
        assert got == want and state.evictions == evictions



def check_no_later_event(keys: np.ndarray, times: np.ndarray, got: dict[int, list[int]], max_len: int) -> None:
    """Each row's history (``got``: row → the rows its entries are) holds only rows of its key given before it,
    strictly earlier in time, in time order, at most ``max_len``."""
    for row, hist in got.items():
        assert len(hist) <= max_len
        assert all(e < row and keys[e] == keys[row] and times[e] < times[row] for e in hist)
        assert [times[e] for e in hist] == sorted(times[e] for e in hist)


def late_input(rng: np.random.Generator, n: int, lateness: int) -> tuple[np.ndarray, np.ndarray]:
    """Keys and times in time order, then about a third of the rows made late by 0 to ``lateness``."""
    keys = rng.integers(0, int(rng.integers(1, 8)), n).astype(np.uint64)
    return keys, np.sort(rng.integers(0, 80, n)) - rng.integers(0, lateness + 1, n) * (rng.random(n) < 0.3)


@pytest.mark.parametrize("seed", range(4))
def test_rows_within_the_lateness_never_see_a_later_event(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(20):
        n, max_len, lateness = int(rng.integers(1, 300)), int(rng.integers(1, 6)), int(rng.integers(1, 6))
        keys, times = late_input(rng, n, lateness)
        op = History(["item"], key="user", time="ts", max_len=max_len, allowed_lateness=lateness)
        state = op.new_stream_state(op.state_spec().name)
        cuts = sorted({0, n, *rng.integers(0, n, 3).tolist()})
        got: list[list[int]] = []
        for a, b in zip(cuts, cuts[1:]):
            got += advance(state, keys[a:b], times[a:b], np.arange(a, b))[0]
        assert len(got) == n
        check_no_later_event(keys, times, dict(enumerate(got)), max_len)


@pytest.mark.parametrize("seed", range(4))
def test_a_row_beyond_the_lateness_is_refused_and_never_seen(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(20):
        n, max_len = int(rng.integers(1, 200)), int(rng.integers(1, 6))
        keys, times = late_input(rng, n, 4)
        op = History(["item"], key="user", time="ts", max_len=max_len, allowed_lateness=1)
        state = op.new_stream_state(op.state_spec().name)
        got: dict[int, list[int]] = {}
        latest: dict[int, int] = {}
        for row in range(n):
            k, t = int(keys[row]), int(times[row])
            try:
                got[row] = advance(state, keys[row : row + 1], times[row : row + 1], [row])[0][0]
            except LateRow:
                assert latest[k] - t > 1
                continue
            assert latest.get(k, t) - t <= 1
            latest[k] = max(latest.get(k, t), t)
        refused = set(range(n)) - set(got)
        assert not refused & {e for hist in got.values() for e in hist}
        check_no_later_event(keys, times, got, max_len)
