"""Count tables as plain data: the partial statistics of Categorify, how they merge, rank and partition.

A ``KeyCounts`` is what some rows (a shard, a row group range, a partition of the keys) contribute to one column's
vocabulary: distinct uint64 keys with their counts, the number of missing values, and, for string-encoded columns,
the text of each key. It is plain data (numpy arrays, an Arrow array, an int), so it pickles and travels between
processes.

- A *partial* holds its keys in ascending order. ``merge_counts`` sums the counts of equal keys: it is associative
  and commutative, so partials merge in any grouping and order with the same result. (Two texts for one key, which
  only a 64-bit collision of the string hash can cause, keep the smaller text.)
- ``KeyCounts.ranked(threshold, limit)`` is the vocabulary order: the keys counted at least ``threshold`` times,
  by count descending then key ascending, the first ``limit`` of them.
- ``merge_ranked`` is the k-way merge of ranked tables over disjoint key sets (the partitions of one column) into
  the ranked table of their union, read chunk by chunk.
- Partitions: key ``k`` belongs to partition ``reduce(hash64(k, 0), P)`` of ``P`` (``partition_of``; the hash and
  ``reduce`` are those of ``etl.backends.hashing``). ``reduce`` keeps the order of the hashes, so partition ``p``
  is the hash interval ``hash_range(p, P)``: a table sorted by ``key_hashes`` holds every partition as one run,
  whatever ``P`` is chosen later.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from etl.backends.hashing import check_buckets, hash64_array
from etl.io.arrow import from_numpy, strings

#: The seed of the partition hash.
PARTITION_SEED = 0


@dataclass
class KeyCounts:
    """Distinct ``keys`` (uint64) with their ``counts`` (int64, >= 1), ``nulls`` (missing values seen) and, for
    string keys, ``texts`` (an Arrow string array aligned with ``keys``; None for hex and int keys, whose text is
    their canonical rendering). Keys are ascending in a partial, in rank order in a ranked table."""

    keys: np.ndarray
    counts: np.ndarray
    nulls: int = 0
    texts: pa.Array | None = None

    def __len__(self) -> int:
        return len(self.keys)

    @classmethod
    def of(cls, keys: np.ndarray, counts: np.ndarray, nulls: int = 0, texts: pa.Array | None = None) -> KeyCounts:
        """A partial from distinct keys in any order (sorted here)."""
        if bool(np.all(keys[1:] > keys[:-1])):
            return cls(keys, counts, nulls, texts)
        order = np.argsort(keys, kind="stable")
        return cls(keys[order], counts[order], nulls, None if texts is None else texts.take(from_numpy(order)))

    def take(self, idx: np.ndarray) -> KeyCounts:
        """The entries at positions ``idx`` (same ``nulls``)."""
        return KeyCounts(self.keys[idx], self.counts[idx], self.nulls, None if self.texts is None else self.texts.take(from_numpy(idx)))

    def slice(self, start: int, stop: int) -> KeyCounts:
        """Entries ``[start, stop)``, without copying (same ``nulls``)."""
        texts = None if self.texts is None else self.texts.slice(start, stop - start)
        return KeyCounts(self.keys[start:stop], self.counts[start:stop], self.nulls, texts)

    def ranked(self, threshold: int, limit: int | None) -> KeyCounts:
        """The keys counted at least ``threshold`` times, by count descending then key ascending, the first
        ``limit`` (all when None)."""
        kept = np.flatnonzero(self.counts >= threshold)
        order = kept[np.lexsort((self.keys[kept], -self.counts[kept]))]
        return self.take(order[:limit])


def merge_counts(parts: Iterable[KeyCounts]) -> KeyCounts:
    """The partial of the union of the rows of ``parts`` (partials of one column): counts of equal keys and nulls
    summed. At least one part is needed."""
    parts = list(parts)
    if len(parts) == 1:
        return parts[0]
    keys = np.concatenate([p.keys for p in parts])
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    nulls = sum(p.nulls for p in parts)
    if not len(keys):
        return KeyCounts(keys, np.zeros(0, np.int64), nulls, parts[0].texts)
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    counts = np.add.reduceat(np.concatenate([p.counts for p in parts])[order], starts)
    texts = None
    if parts[0].texts is not None:
        texts = _first_texts(pa.concat_arrays([p.texts for p in parts]).take(from_numpy(order)), starts)
    return KeyCounts(keys[starts], counts, nulls, texts)


def _first_texts(texts: pa.Array, starts: np.ndarray) -> pa.Array:
    """The text of each run of equal keys (runs begin at ``starts``): the smallest when a run holds different texts."""
    firsts = texts.take(from_numpy(starts))
    ends = np.r_[starts[1:], len(texts)]
    runs = np.flatnonzero(ends - starts > 1)
    if not len(runs):
        return firsts
    values = texts.to_pylist()
    out = firsts.to_pylist()
    for r in runs:
        out[r] = min(values[starts[r] : ends[r]])
    return strings(out)


def merge_ranked(tables: list[Iterator[KeyCounts]], limit: int | None = None, with_texts: bool = False) -> KeyCounts:
    """k-way merge of ranked tables over disjoint key sets, each given as an iterator of its chunks in order, into
    the ranked table of their union, cut to ``limit`` entries (``with_texts``: the tables hold texts). Only what
    can already be placed is merged at each step: every entry up to the smallest last entry among the chunks in
    hand (each table's later entries rank after it)."""
    heads: list[tuple[KeyCounts, Iterator[KeyCounts]]] = []
    for it in tables:
        head = _next_nonempty(it)
        if head is not None:
            heads.append((head, it))
    out: list[KeyCounts] = []
    done = 0
    while heads and (limit is None or done < limit):
        bound = min(((-int(h.counts[-1]), int(h.keys[-1])) for h, _ in heads))
        ready, rest = [], []
        for head, it in heads:
            n = _rank_prefix(head, -bound[0], bound[1])
            ready.append(head.slice(0, n))
            if n < len(head):
                rest.append((head.slice(n, len(head)), it))
            else:
                nxt = _next_nonempty(it)
                if nxt is not None:
                    rest.append((nxt, it))
        step = _concat(ready)
        step = step.take(np.lexsort((step.keys, -step.counts)))
        if limit is not None:
            step = step.slice(0, min(len(step), limit - done))
        out.append(step)
        done += len(step)
        heads = rest
    if not out:
        return KeyCounts(np.zeros(0, np.uint64), np.zeros(0, np.int64), 0, strings([]) if with_texts else None)
    return _concat(out)


def _next_nonempty(it: Iterator[KeyCounts]) -> KeyCounts | None:
    for chunk in it:
        if len(chunk):
            return chunk
    return None


def _rank_prefix(t: KeyCounts, count: int, key: int) -> int:
    """How many entries of ranked ``t`` rank at or before (``count``, ``key``)."""
    above = int(np.searchsorted(-t.counts, -count, side="left"))  # counts greater than ``count``
    tie_end = int(np.searchsorted(-t.counts, -count, side="right"))
    return above + int(np.searchsorted(t.keys[above:tie_end], np.uint64(key), side="right"))


def _concat(parts: list[KeyCounts]) -> KeyCounts:
    texts = None if parts[0].texts is None else pa.concat_arrays([p.texts for p in parts])
    return KeyCounts(np.concatenate([p.keys for p in parts]), np.concatenate([p.counts for p in parts]), parts[0].nulls, texts)


# ---------------------------------------------------------------- partitions


def key_hashes(keys: np.ndarray) -> np.ndarray:
    """``hash64(key, PARTITION_SEED)`` of every key (uint64; a bijection, so distinct keys have distinct hashes)."""
    return hash64_array(keys, PARTITION_SEED)


def partition_of(keys: np.ndarray, partitions: int) -> np.ndarray:
    """The partition (int64 in [0, partitions)) of every key: ``reduce(hash64(key, 0), partitions)``."""
    check_buckets(partitions)
    return ((key_hashes(keys) >> np.uint64(32)) * np.uint64(partitions) >> np.uint64(32)).astype(np.int64)


def hash_range(p: int, partitions: int) -> tuple[int, int]:
    """The hashes [lo, hi) of partition ``p`` of ``partitions`` (``hi`` is 2**64 for the last one)."""
    check_buckets(partitions)
    if not 0 <= p < partitions:
        raise ValueError(f"partition {p} is not in [0, {partitions})")

    def low(q: int) -> int:
        return -(-(q << 32) // partitions) << 32  # the smallest hash h with ((h >> 32) * partitions) >> 32 >= q

    return low(p), low(p + 1)
