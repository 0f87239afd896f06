"""The online vocabulary state machine (etl.ops.online_vocab) and Categorify's online settings."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.backends import cpu
from etl.backends.hashing import hash64, reduce
from etl.batch import Batch, Column
from etl.errors import ConfigError
from etl.ops import Categorify
from etl.ops.base import InvalidState
from etl.ops.counts import KeyCounts
from etl.ops.online_vocab import OnlineVocab, canonical_state
from etl.schema import ColumnSpec


def feed(v: OnlineVocab, keys: list) -> list[int]:
    """The ids of ``keys`` (None: missing), one update."""
    ids, _ = v.update(np.array([0 if k is None else k for k in keys], np.uint64), np.array([k is not None for k in keys]))
    return ids.tolist()


def oov(key: int, buckets: int = 1, seed: int = 0) -> int:
    return 2 + reduce(hash64(key, seed), buckets)


def test_a_key_gets_an_id_at_its_t_th_sighting_and_keeps_it() -> None:
    v = OnlineVocab(capacity=4, admit_after=3, oov_buckets=5, seed=7)
    first = 2 + 5
    assert feed(v, [10, 10, None]) == [oov(10, 5, 7), oov(10, 5, 7), 1]
    assert feed(v, [10]) == [first]  # the admitting row already gets the id
    assert feed(v, [20, 20, 20, 10, 30, 10]) == [oov(20, 5, 7), oov(20, 5, 7), first + 1, first, oov(30, 5, 7), first]
    assert len(v) == 2 and v.rows == 10 and v.cardinality == first + 4


def test_update_reports_admissions_and_evictions_in_order() -> None:
    v = OnlineVocab(capacity=2, admit_after=1)
    ids, ev = v.update(np.array([5, 6, 6, 7, 7, 7, 5], np.uint64))
    # 7 needs a count above 5's (1) to push it out; the freed id waits for the next batch, 5 is out of vocabulary
    assert ids.tolist() == [3, 4, 4, oov(7), oov(7), oov(7), oov(5)]
    assert ev.admitted_ids.tolist() == [3, 4] and ev.admitted_keys.tolist() == [5, 6]
    assert ev.evicted_ids.tolist() == [3] and ev.evicted_keys.tolist() == [5]
    assert ev.admitted_keys.dtype == np.uint64 and len(ev) == 3
    ids, ev = v.update(np.array([7, 7], np.uint64))  # the next batch: the id is free again
    assert ids.tolist() == [3, 3] and ev.admitted_keys.tolist() == [7] and len(ev.evicted_ids) == 0


def test_an_evicted_id_names_one_key_per_batch_and_a_candidate_evicts_once() -> None:
    v = OnlineVocab(capacity=2, admit_after=1)
    feed(v, [1, 1, 2, 2])
    ids, ev = v.update(np.array([3, 3, 3, 3, 3, 1, 4, 4, 4], np.uint64))
    # 3 evicts 1 (count 2, seen first) once; 4 then evicts 2 (its count 3 > 2); neither id is given again in the batch
    assert ev.evicted_keys.tolist() == [1, 2] and ev.evicted_ids.tolist() == [3, 4] and len(ev.admitted_ids) == 0
    assert ids.tolist() == [oov(3)] * 5 + [oov(1)] + [oov(4)] * 3
    assert feed(v, [4, 3, 1]) == [3, 4, oov(1)]  # lowest free id first, by sighting


def test_lfu_evicts_the_least_frequent_then_least_recent_key_only_for_a_more_frequent_candidate() -> None:
    v = OnlineVocab(capacity=3, admit_after=2)
    # a (count 3), b (2), c (2, seen after b): full
    feed(v, [1, 1, 2, 2, 3, 3, 1])
    ids = {k: i for k, i in zip([1, 2, 3], feed(v, [1, 2, 3]))}  # counts now 4, 3, 3
    assert feed(v, [9, 9]) == [oov(9), oov(9)]  # count 2 < 3: no eviction, 9 stays a candidate
    out, ev = v.update(np.array([9, 8], np.uint64))  # 9 reaches 3: not above 3 either
    assert out.tolist() == [oov(9), oov(8)] and len(ev) == 0
    out, ev = v.update(np.array([9], np.uint64))  # 4 > 3: evicts 2 (count 3, seen before 3), its id free next batch
    assert out.tolist() == [oov(9)] and ev.evicted_keys.tolist() == [2] and len(ev.admitted_ids) == 0
    out, ev = v.update(np.array([9], np.uint64))
    assert out.tolist() == [ids[2]] and ev.admitted_keys.tolist() == [9]
    assert feed(v, [1, 3]) == [ids[1], ids[3]]  # the others keep their ids


def test_ttl_evicts_the_least_recent_key_once_unseen_for_ttl_rows() -> None:
    v = OnlineVocab(capacity=2, admit_after=1, evict="ttl", ttl_rows=3)
    assert feed(v, [1, 2]) == [3, 4]  # rows 0, 1
    assert feed(v, [5]) == [oov(5)]  # row 2: key 1 unseen for 2 rows
    assert feed(v, [2]) == [4]  # row 3
    out, ev = v.update(np.array([5], np.uint64))  # row 4: key 1 unseen for 4 rows >= 3
    assert out.tolist() == [oov(5)] and ev.evicted_keys.tolist() == [1] and len(ev.admitted_ids) == 0
    out, ev = v.update(np.array([5], np.uint64))
    assert out.tolist() == [3] and ev.admitted_keys.tolist() == [5]


def test_freed_ids_are_taken_lowest_first() -> None:
    v = OnlineVocab(capacity=4)
    v.restore({"rows": 5, "key": np.array([10, 11], np.uint64), "count": np.array([1, 1]), "last": np.array([0, 1]), "id": np.array([0, 2])})
    assert feed(v, [10, 12, 13, 11]) == [3, 4, 6, 5]


def test_the_table_stays_bounded_and_ids_stay_in_range() -> None:
    v = OnlineVocab(capacity=16, admit_after=2, oov_buckets=3)
    rng = np.random.default_rng(0)
    keys = rng.zipf(1.3, 20_000).astype(np.uint64)
    ids = np.concatenate([v.update(part)[0] for part in np.array_split(keys, 20)])
    state = v.export()
    assert 0 < len(v) <= 16 and len(state["key"]) <= 32 and (state["id"] >= 0).sum() == len(v)
    assert ids.min() >= 2 and ids.max() < v.cardinality
    assert len(np.unique(state["id"][state["id"] >= 0])) == len(v)


def test_seeding_from_the_fit_keeps_categorify_s_ids() -> None:
    op = Categorify(["c"], online=True, capacity=3, oov_buckets=2)
    counts = KeyCounts.of(np.array([4, 5, 6, 7], np.uint64), np.array([9, 1, 5, 5]))
    op.vocab["c"] = _vocab_table(op, counts)
    v = op.online_vocab("c")
    assert op.cardinalities() == {"c": 2 + 2 + 3}
    assert feed(v, [4, 6, 7, 5]) == [4, 5, 6, oov(5, 2)]  # by count desc, key asc: 4, 6, 7 (5 left out by capacity)


def _vocab_table(op: Categorify, counts: KeyCounts):
    op.bind({"c": ColumnSpec(name="c", role="categorical", dtype="int64", encoding="int")})
    op.finalize_ranked("c", op.rank(counts), cpu)
    return op.vocab["c"]


def test_export_and_restore_continue_exactly() -> None:
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 40, 3000).astype(np.uint64)
    a = OnlineVocab(capacity=8, admit_after=2, evict="ttl", ttl_rows=50)
    whole = np.concatenate([a.update(keys[:1234])[0], a.update(keys[1234:])[0]])
    b = OnlineVocab(capacity=8, admit_after=2, evict="ttl", ttl_rows=50)
    first, _ = b.update(keys[:1234])
    c = OnlineVocab(capacity=8, admit_after=2, evict="ttl", ttl_rows=50)
    c.restore(b.export())
    rest, _ = c.update(keys[1234:])
    assert np.array_equal(whole, np.concatenate([first, rest]))
    assert all(np.array_equal(x, y) for x, y in zip(a.export().values(), c.export().values()))


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"key": np.array([2, 2], np.uint64)}, "more than once"),
        ({"id": np.array([0, 0])}, "two keys"),
        ({"id": np.array([0, 9])}, "outside"),
        ({"count": np.array([0, 1])}, "count below 1"),
        ({"last": np.array([3, 3])}, "distinct"),
        ({"rows": 2}, "before the clock"),
        ({"rows": 2**63}, "rows clock"),
        ({"id": np.array([0])}, "length"),
    ],
)
def test_restore_refuses_a_state_it_could_not_have_exported(change: dict, problem: str) -> None:
    state = {"rows": 5, "key": np.array([1, 2], np.uint64), "count": np.array([1, 1]), "last": np.array([0, 3]), "id": np.array([0, 1])}
    with pytest.raises(InvalidState, match=problem):
        OnlineVocab(capacity=2).restore(state | change)


def test_an_update_that_would_pass_the_rows_clock_s_limit_is_refused_and_changes_nothing() -> None:
    v = OnlineVocab(capacity=2)
    v.restore({"rows": 2**63 - 3, "key": np.array([7], np.uint64), "count": np.array([1]), "last": np.array([2**63 - 4]), "id": np.array([0])})
    before = v.export()
    with pytest.raises(OverflowError, match="rows clock"):
        v.update(np.array([7, 8, 9, 10], np.uint64))
    assert all(np.array_equal(before[k], v.export()[k]) for k in before)
    assert feed(v, [7, 8]) == [3, 4] and v.rows == 2**63 - 1


def test_update_refuses_keys_of_another_width_or_a_mask_of_another_length() -> None:
    v = OnlineVocab(capacity=2)
    with pytest.raises(TypeError, match="uint64"):
        v.update(np.array([1, 2, 3, 4], np.int32))
    with pytest.raises(ValueError, match="valid"):
        v.update(np.array([1, 2], np.uint64), np.array([True]))
    assert v.rows == 0 and feed(v, [1, 2]) == [3, 4]


def _reference(batches: list[list], capacity: int, t_admit: int, evict: str, ttl: int | None, buckets: int) -> tuple[list, list]:
    """The module docstring's semantics, spelled out with dicts, sets and min()."""
    table: dict[int, list[int]] = {}  # key -> [count, last, id]
    free, out, events = list(range(capacity)), [], []
    rows = [(b, k) for b, batch in enumerate(batches) for k in batch]
    cooling: list[int] = []
    waiting: set[int] = set()
    for t, (b, k) in enumerate(rows):
        if t and b != rows[t - 1][0]:
            free += cooling
            cooling, waiting = [], set()
        if k is None:
            out.append(1)
            continue
        if k in table:
            table[k][0] += 1
            table[k][1] = t
            if table[k][2] >= 0:
                out.append(2 + buckets + table[k][2])
                continue
        else:
            cands = [x for x in table if table[x][2] < 0]
            if len(cands) == capacity:
                gone = min(cands, key=lambda x: (table[x][0], table[x][1]))
                del table[gone]
                waiting.discard(gone)
            table[k] = [1, t, -1]
        e, new = table[k], -1
        if e[0] >= t_admit:
            if free:
                new = free.pop(free.index(min(free)))
            elif k not in waiting and (adm := [x for x in table if table[x][2] >= 0]):
                v = min(adm, key=(lambda x: (table[x][0], table[x][1])) if evict == "lfu" else (lambda x: table[x][1]))
                if (e[0] > table[v][0]) if evict == "lfu" else (t - table[v][1] >= ttl):
                    cooling.append(table[v][2])
                    waiting.add(k)
                    events.append(("evicted", 2 + buckets + table[v][2], v))
                    del table[v]
        if new < 0:
            out.append(oov(k, buckets))
            continue
        e[2] = new
        events.append(("admitted", 2 + buckets + new, k))
        out.append(2 + buckets + new)
    return out, events


def test_matches_a_plain_python_model_across_updates_and_restores() -> None:
    for trial in range(120):
        rng = random.Random(trial)
        capacity, t_admit, buckets = rng.randint(1, 6), rng.randint(1, 3), rng.randint(1, 3)
        evict = rng.choice(["lfu", "ttl"])
        ttl = rng.randint(1, 10) if evict == "ttl" else None
        keys = [None if rng.random() < 0.1 else rng.randint(0, 15) << (60 if rng.random() < 0.2 else 0) for _ in range(rng.randint(0, 200))]
        cuts = [0]
        while cuts[-1] < len(keys):
            cuts.append(min(len(keys), cuts[-1] + rng.randint(1, 30)))
        batches = [keys[i:j] for i, j in zip(cuts, cuts[1:])]
        want_ids, want_events = _reference(batches, capacity, t_admit, evict, ttl, buckets)
        v = OnlineVocab(capacity, t_admit, evict, ttl, buckets)
        ids, admitted, evicted = [], [], []
        for part in batches:
            got, ev = v.update(np.array([k or 0 for k in part], np.uint64), np.array([k is not None for k in part]))
            ids += got.tolist()
            admitted += list(zip(ev.admitted_ids.tolist(), ev.admitted_keys.tolist()))
            evicted += list(zip(ev.evicted_ids.tolist(), ev.evicted_keys.tolist()))
            if rng.random() < 0.3:
                w = OnlineVocab(capacity, t_admit, evict, ttl, buckets)
                w.restore(v.export())
                v = w
        assert ids == want_ids, trial
        assert admitted == [(i, k) for what, i, k in want_events if what == "admitted"], trial
        assert evicted == [(i, k) for what, i, k in want_events if what == "evicted"], trial


def test_candidates_seen_once_leave_oldest_first_after_their_queue_wraps() -> None:
    """Rows one batch each, so that the ring of candidates seen once fills while its head is past its start: the
    compaction that makes room keeps every candidate still seen once, in order."""
    keys = [1, 2, 3, 4, 5, 2, 1, 3, 6, 4, 7, 6, 5, 7, 8, 9, 2, 1, 8, 1]
    batches = [[k] for k in keys]
    v = OnlineVocab(4, 2, "ttl", 6)
    ids = [i for part in batches for i in v.update(np.array(part, np.uint64))[0].tolist()]
    assert ids == _reference(batches, 4, 2, "ttl", 6, 1)[0]


KEYS = st.one_of(st.none(), st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 2**63, 15 << 60, 2**64 - 2, 2**64 - 1]))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(capacity=st.integers(1, 4), admit_after=st.integers(1, 3), ttl=st.one_of(st.none(), st.integers(1, 6)), buckets=st.integers(1, 3),
       batches=st.lists(st.lists(KEYS, max_size=12), max_size=30), restores=st.sets(st.integers(0, 29)))  # fmt: skip
def test_ids_events_undo_records_and_restores_match_a_plain_python_model(capacity: int, admit_after: int, ttl: int | None,
                                                                         buckets: int, batches: list, restores: set) -> None:  # fmt: skip
    """Keys 0 and 2**64 - 1 among a few, tables of a handful of entries (hash slots shift back on every delete), empty
    batches, restores between batches: the ids and events are the model's, and the undo records of the updates since
    the last restore give back the state before each of them."""
    evict = "lfu" if ttl is None else "ttl"
    want_ids, want_events = _reference(batches, capacity, admit_after, evict, ttl, buckets)
    v = OnlineVocab(capacity, admit_after, evict, ttl, buckets)
    ids, admitted, evicted, states, undos = [], [], [], [], []
    for b, part in enumerate(batches):
        states.append(v.export())
        got, ev, undo = v.update_with_undo(np.array([k or 0 for k in part], np.uint64), np.array([k is not None for k in part], bool))
        ids += got.tolist()
        admitted += list(zip(ev.admitted_ids.tolist(), ev.admitted_keys.tolist()))
        evicted += list(zip(ev.evicted_ids.tolist(), ev.evicted_keys.tolist()))
        undos.append(undo)
        for i, state in enumerate(states):
            back = v.export(undo=undos[i:][::-1])
            assert all(np.array_equal(back[k], state[k]) for k in state), (b, i)
        if b in restores:
            w = OnlineVocab(capacity, admit_after, evict, ttl, buckets)
            w.restore(v.export(canonical=False))
            v, states, undos = w, [], []
    assert ids == want_ids
    assert admitted == [(i, k) for what, i, k in want_events if what == "admitted"]
    assert evicted == [(i, k) for what, i, k in want_events if what == "evicted"]


def _events(ev) -> list[tuple]:
    return list(zip(ev.admitted_ids.tolist(), ev.admitted_keys.tolist())) + list(zip(ev.evicted_ids.tolist(), ev.evicted_keys.tolist()))


@pytest.mark.parametrize("evict, ttl", [("lfu", None), ("ttl", 300)])
def test_matches_a_plain_python_model_on_a_long_stream(evict: str, ttl: int | None) -> None:
    """Thousands of rows of skewed keys through a table that fills, drops candidates and evicts over and over."""
    rng = np.random.default_rng(7)
    keys = [int(k) for k in rng.zipf(1.4, 8000) % 400]
    cuts = np.unique(np.concatenate([[0, len(keys)], rng.integers(0, len(keys), 40)]))
    batches = [keys[i:j] for i, j in zip(cuts, cuts[1:])]
    want_ids, want_events = _reference(batches, 50, 2, evict, ttl, 3)
    v = OnlineVocab(50, 2, evict, ttl, 3)
    ids, events = [], []
    for part in batches:
        got, ev = v.update(np.array(part, np.uint64))
        ids += got.tolist()
        events += _events(ev)
    assert ids == want_ids
    assert sorted(events) == sorted((i, k) for _, i, k in want_events) and len(events) == len(want_events)


@pytest.mark.parametrize("evict, ttl", [("lfu", None), ("ttl", 20_000)])
def test_undo_records_give_the_state_before_each_update(evict: str, ttl: int | None) -> None:
    """A table of tens of thousands of keys (the kernel prefetches ahead there): ``update_with_undo`` gives what
    ``update`` gives, and the state laid over with the undo records of the last updates is the state before them."""
    rng = np.random.default_rng(3)
    batches = np.array_split((rng.zipf(1.1, 120_000) % 300_000).astype(np.uint64), 12)
    v, twin = OnlineVocab(20_000, 3, evict, ttl), OnlineVocab(20_000, 3, evict, ttl)
    states, undos = [], []
    for part in batches:
        states.append(v.export())
        ids, ev, undo = v.update_with_undo(part)
        want_ids, want_ev = twin.update(part)
        assert np.array_equal(ids, want_ids) and _events(ev) == _events(want_ev)
        assert len(undo.records) <= min(2 * len(part), 40_000) and undo.rows == states[-1]["rows"]
        undos.append(undo)
    assert len(states[-1]["key"]) > 1 << 14  # above _FAR: the kernel prefetches
    for i, state in enumerate(states):
        got = v.export(undo=undos[i:][::-1])
        assert got.keys() == state.keys() and all(np.array_equal(got[k], state[k]) for k in state), i
    now = v.export(canonical=False, undo=[])
    assert all(np.array_equal(canonical_state(now)[k], twin.export()[k]) for k in now)


# ---------------------------------------------------------------- Categorify's settings


@pytest.mark.parametrize(
    "params, key",
    [
        ({"online": "yes", "capacity": 5}, "Categorify.online"),
        ({"online": True}, "Categorify.capacity"),
        ({"online": True, "capacity": 0}, "Categorify.capacity"),
        ({"online": True, "capacity": 5, "admit_after": 0}, "Categorify.admit_after"),
        ({"online": True, "capacity": 5, "evict": "lru"}, "Categorify.evict"),
        ({"online": True, "capacity": 5, "evict": "ttl"}, "Categorify.ttl_rows"),
        ({"online": True, "capacity": 5, "ttl_rows": 9}, "Categorify.ttl_rows"),
        ({"online": True, "capacity": 5, "max_size": 6}, "Categorify.max_size"),
        ({"capacity": 5}, "Categorify.capacity"),
        ({"evict": "lfu"}, "Categorify.evict"),
    ],
)
def test_categorify_checks_online_settings_naming_the_key(params: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        Categorify(["c"], **params)


def test_online_categorify_gives_ids_only_through_the_loader() -> None:
    op = Categorify(["c"], online=True, capacity=5)
    assert op.max_size == 5
    batch = Batch({"c": Column(np.array([1, 2], np.uint64))}, 2)
    with pytest.raises(ConfigError, match="Loader"):
        op.transform(batch, cpu)


def test_online_categorify_refuses_list_columns() -> None:
    with pytest.raises(ValueError, match="list column"):
        Categorify(["g"], online=True, capacity=5).bind({"g": ColumnSpec(name="g", role="list", dtype="string", encoding="string")})
