"""Count tables: merging partials in any grouping and order, ranking, the k-way merge of ranked partitions (ties,
limits, chunking) and the partition function, against plain-Python references."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from etl.backends import hashing
from etl.ops.counts import KeyCounts, hash_range, key_hashes, merge_counts, merge_ranked, partition_of


def partial_of(keys: list[int], nulls: int = 0, texts: dict[int, str] | None = None) -> KeyCounts:
    c = Counter(keys)
    ks = np.array(sorted(c), np.uint64)
    t = None if texts is None else pa.array([texts[int(k)] for k in ks], pa.string())
    return KeyCounts(ks, np.array([c[int(k)] for k in ks], np.int64), nulls, t)


def as_dict(p: KeyCounts) -> dict[int, int]:
    return dict(zip(p.keys.tolist(), p.counts.tolist()))


def random_rows(rng: np.random.Generator, n: int) -> list[int]:
    """Keys with many repeats, the extremes of the key space included."""
    pool = np.r_[rng.integers(0, 2**63, 40, dtype=np.uint64) * np.uint64(2), np.array([0, 2**64 - 1], np.uint64)]
    return [int(pool[i]) for i in np.minimum(rng.zipf(1.5, n) - 1, len(pool) - 1)]


@pytest.mark.parametrize("seed", range(5))
def test_merge_in_any_grouping_and_order_equals_the_one_table_result(seed):
    rng = np.random.default_rng(seed)
    rows = random_rows(rng, 500)
    cuts = np.sort(rng.choice(np.arange(1, len(rows)), size=6, replace=False))
    parts = [partial_of(chunk, nulls=i) for i, chunk in enumerate(np.split(np.array(rows, dtype=object), cuts))]
    whole = partial_of(rows, nulls=sum(range(len(parts))))
    for _ in range(4):
        order = rng.permutation(len(parts))
        shuffled = [parts[i] for i in order]
        flat = merge_counts(shuffled)
        # a random binary tree of pairwise merges
        pending = list(shuffled)
        while len(pending) > 1:
            i = int(rng.integers(0, len(pending) - 1))
            pending[i : i + 2] = [merge_counts([pending[i], pending[i + 1]])]
        for got in (flat, pending[0]):
            assert as_dict(got) == as_dict(whole)
            assert got.keys.tolist() == sorted(got.keys.tolist())
            assert got.nulls == whole.nulls
            assert got.keys.dtype == np.uint64 and got.counts.dtype == np.int64


def test_merge_keeps_texts_aligned_and_the_smaller_text_on_a_collision():
    a = partial_of([5, 5, 9], texts={5: "five", 9: "nine"})
    b = partial_of([9, 2], texts={9: "NINE", 2: "two"})  # key 9 with another text: a hash collision
    for got in (merge_counts([a, b]), merge_counts([b, a])):
        assert got.keys.tolist() == [2, 5, 9] and got.counts.tolist() == [1, 2, 2]
        assert got.texts.to_pylist() == ["two", "five", "NINE"]


def test_merge_of_empty_partials():
    e = KeyCounts(np.zeros(0, np.uint64), np.zeros(0, np.int64), 3)
    assert len(merge_counts([e, e])) == 0 and merge_counts([e, e]).nulls == 6
    assert as_dict(merge_counts([e, partial_of([1, 1])])) == {1: 2}


def ref_ranked(c: dict[int, int], t: int = 1, limit: int | None = None) -> list[tuple[int, int]]:
    return [(k, -n) for n, k in sorted((-n, k) for k, n in c.items() if n >= t)][:limit]


def pairs(p: KeyCounts) -> list[tuple[int, int]]:
    return list(zip(p.keys.tolist(), p.counts.tolist()))


@pytest.mark.parametrize(("t", "limit"), [(1, None), (2, None), (1, 5), (3, 0), (1, 10**6)])
def test_ranked_orders_by_count_descending_then_key(t, limit):
    rows = random_rows(np.random.default_rng(1), 400)
    p = partial_of(rows)
    assert pairs(p.ranked(t, limit)) == ref_ranked(as_dict(p), t, limit)


def chunks(p: KeyCounts, size: int):
    for i in range(0, len(p), size):
        yield p.take(np.arange(i, min(i + size, len(p))))


@pytest.mark.parametrize("partitions", [1, 3, 8])
@pytest.mark.parametrize("chunk", [1, 4, 1000])
@pytest.mark.parametrize("limit", [None, 0, 7, 33])
def test_k_way_merge_of_ranked_partitions(partitions, chunk, limit):
    """Many ties: counts 1..4 only, so equal counts span partitions and chunk boundaries."""
    rng = np.random.default_rng(partitions * 100 + chunk)
    keys = rng.choice(2**40, size=120, replace=False).astype(np.uint64)
    counts = rng.integers(1, 5, len(keys))
    whole = KeyCounts.of(keys, counts.astype(np.int64))
    part = partition_of(whole.keys, partitions)
    ranked = [whole.take(np.flatnonzero(part == p)).ranked(1, limit) for p in range(partitions)]
    got = merge_ranked([chunks(r, chunk) for r in ranked], limit)
    assert pairs(got) == ref_ranked(as_dict(whole), 1, limit)


def test_k_way_merge_carries_texts_and_handles_empty_tables():
    a = KeyCounts(np.array([7, 3], np.uint64), np.array([5, 2], np.int64), 0, pa.array(["seven", "three"]))
    b = KeyCounts(np.array([1, 9], np.uint64), np.array([5, 1], np.int64), 0, pa.array(["one", "nine"]))
    empty = KeyCounts(np.zeros(0, np.uint64), np.zeros(0, np.int64), 0, pa.array([], pa.string()))
    got = merge_ranked([iter([a]), iter([empty]), iter([]), chunks(b, 1)])
    assert pairs(got) == [(1, 5), (7, 5), (3, 2), (9, 1)]
    assert got.texts.to_pylist() == ["one", "seven", "three", "nine"]
    assert len(merge_ranked([iter([])])) == 0 and merge_ranked([iter([])]).texts is None
    assert merge_ranked([iter([empty])], with_texts=True).texts.to_pylist() == []


def test_partition_function_is_the_documented_hash_and_reduce():
    rng = np.random.default_rng(3)
    keys = np.r_[rng.integers(0, 2**64 - 1, 200, dtype=np.uint64, endpoint=True), np.array([0, 2**64 - 1], np.uint64)]
    assert key_hashes(keys).tolist() == [hashing.hash64(int(k), 0) for k in keys]
    for n in (1, 3, 8, 1000, 2**31):
        got = partition_of(keys, n)
        assert got.tolist() == [hashing.reduce(hashing.hash64(int(k), 0), n) for k in keys]
        for k, p in zip(keys[:50], got[:50]):
            lo, hi = hash_range(int(p), n)
            assert lo <= hashing.hash64(int(k), 0) < hi


@pytest.mark.parametrize("n", [1, 3, 7, 8, 2**31])
def test_hash_ranges_tile_the_hash_space(n):
    ps = range(n) if n < 100 else [0, 1, n // 2, n - 2, n - 1]
    ranges = {p: hash_range(p, n) for p in ps}
    assert ranges[0][0] == 0 and ranges[max(ps)][1] == 2**64
    for p, (lo, hi) in ranges.items():
        if p + 1 in ranges:
            assert hi == ranges[p + 1][0]
        assert lo < hi
        assert hashing.reduce(lo, n) == p and hashing.reduce(hi - 1, n) == p
    with pytest.raises(ValueError):
        hash_range(n, n)
