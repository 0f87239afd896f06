"""The online vocabulary of one categorical column: keys get ids as a stream of rows goes by, in row order.

``OnlineVocab(capacity, admit_after, evict, ttl_rows, oov_buckets, seed)`` maps keys to ids with Categorify's
encoding (``etl.ops.categorical``): ``1`` missing, ``2 .. 2+B-1`` out-of-vocabulary buckets (a key without an id
gets ``2 + reduce(hash64(key, seed), B)``, exactly as Categorify maps an unknown key), ``2+B .. 2+B+C-1`` the ids
of admitted keys. The embedding table size is therefore fixed: ``2 + B + C``.

Semantics, row by row, batch by batch (``update`` processes the rows of one batch in order; the rows clock ``t``
counts every row, missing or not, from 0):

- the table tracks at most ``C`` admitted keys and at most ``C`` candidates (keys seen, not admitted), each with its
  exact count since it last entered the table and the row it was last seen at (``last``);
- a key seen: its count grows by one and ``last = t``. A key not in the table enters it as a candidate with count
  1; when the candidates are already ``C``, the candidate with the lowest (count, last) leaves the table first (its
  count is forgotten: counts are exact for the keys in the table, and a key that left starts again from 1);
- a candidate whose count reaches ``T = admit_after`` is admitted when an id is free: it takes the lowest free id.
  With no id free, it may evict an admitted key: ``lfu``: the admitted key with the lowest (count, last), when the
  candidate's count is higher than its count (a key seen T times does not push out one seen more often); ``ttl``:
  the admitted key with the oldest ``last``, when it was not seen in the last ``ttl_rows`` rows (``t - last >=
  ttl_rows``). The evicted id is free only from the next batch on (deferred reuse): the candidate stays out of
  vocabulary (its out-of-vocabulary bucket, still counted) and is admitted at a later sighting that finds an id
  free (another qualifying candidate may take the id first). A candidate evicts at most one key per batch. ``last``
  differs between any two keys of the table, so every choice is unique: the ids are a function of the row sequence
  and its cut into batches alone;
- the id of an admitted key never changes while it stays admitted; the row that admits a key already gets its id;
  an evicted key leaves the table (its later rows are out of vocabulary until it is admitted again).

Within a batch an id therefore names one key: an id evicted in batch ``b`` is given again at the earliest in batch
``b + 1``, and no row of the evicted key gets it from its eviction on. A trainer that resets the embedding rows of
the ids a batch admits before training on it never trains the new key on the old key's row.

``update`` returns the ids and the events of its batch: admitted (id, key) and evicted (id, key) pairs, each in the
order they happened (the admission that reuses an evicted id comes in a later batch than the eviction). Seeding
(``seed_from``) admits the first ``C`` keys of a fitted Categorify vocabulary with their fitted ids and counts;
entry ``i`` of ``n`` counts as last seen at row ``i - n`` (before the stream, in vocabulary order).

The state (``export``/``restore``) is four arrays, sorted by key (``key`` uint64, ``count`` int64, ``last`` int64,
``id`` int64: -1 for a candidate, else the id relative to the first vocabulary id), plus the rows clock; restoring
it gives a vocabulary that behaves exactly as the one exported (the queue, heaps and hash layout are rebuilt; no
choice depends on them). Between batches no id is cooling and no candidate waits: the state holds everything.

The per-row loop is a numba kernel over a table of entries (one 64-byte row per key: key, count, last, id and the
kernel's bookkeeping, so a key's fields share one cache line), a hash table of (hash, entry) slots (linear probing,
backward-shift deletion; the hash is Categorify's out-of-vocabulary hash ``fmix64(key ^ seed word)``, a bijection
of the keys, computed once per row for both uses), a queue of the candidates seen once (oldest first: they are the
lowest (count, last) candidates, so dropping one is O(1)) and three binary min-heaps (admitted keys by eviction
order, candidates seen more than once by (count, last), free ids); the heaps' rows hold the (count, last) their
entries had when placed. A sighting of a key in the table only bumps its count and ``last``; an entry found stale on
top of a heap is placed again before the top is used (priorities only grow, so the top is then the true minimum):
admissions, evictions and drops cost O(log C) amortised. With more keys than stay in L2, the loop prefetches the
hash slots and entries of the rows ahead and of the candidates the queue drops next: a key not in the table costs a
few cache misses (its slot, the dropped candidate's entry and slot), and they overlap.

``update_with_undo`` also returns what the update changed (``Undo``: each entry it changed, as it was before), so
that the state before a few updates is the state now with their undo records laid over it, newest first
(``export(undo=...)``): the loader keeps those of the batches in flight (``etl.loader.stream_state``).

``VocabularyStream`` is one column's online vocabulary as a streaming state (``etl.ops.stream``): how the loader
drives it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numba as nb
import numpy as np

from etl.backends.cpu import fmix64, prefetch, reduce_range
from etl.backends.hashing import check_buckets, check_seed, seed_word
from etl.ids import MISSING, RESERVED
from etl.ops.base import InvalidState
from etl.ops.stream import Carried, StateArrays, StreamSpec, StreamState, StreamStep

#: Eviction policies: least frequently used, or not seen in the last ``ttl_rows`` rows.
EVICT = ("lfu", "ttl")
#: The arrays of a state (``OnlineVocab.export``) with their dtypes; its one scalar is ``rows``, the clock.
STATE_ARRAYS = {"key": np.dtype(np.uint64), "count": np.dtype(np.int64), "last": np.dtype(np.int64), "id": np.dtype(np.int64)}

_jit = nb.njit(nogil=True, cache=True)
# The kernels of the per-row loop allocate nothing, so they run without numba's reference-counting runtime: a call
# between them then passes its arrays as they are, where with it each call costs atomic increments and decrements
# of every array argument (tens of ns a call, more than the work of a row whose key is in the table).
_kernel = nb.njit(nogil=True, cache=True, _nrt=False)  # type: ignore[call-overload]

# meta slots
_CLOCK, _N_ADMITTED, _N_CANDIDATES, _N_FREE_IDS, _N_FREE_ENTRIES, _N_HEAP, _QUEUE_HEAD, _QUEUE_SIZE, _N_COOLING, _BATCH, _N_UNDO = range(11)
# the fields of an entry (one 64-byte row of the entry table): the state's four first, then the heap position, the
# batch in which a candidate evicted a key it waits to replace and the batch in which the entry was last recorded for
# undo (both as batch + 1: 0, none), and the key's hash (see _hash). The tables start as zeros (pages the kernel
# never touches take no memory and no time): a free entry has count 0, an empty hash slot entry 0 (slots hold the
# entry + 1)
_KEY, _COUNT, _LAST, _ID, _POS, _WAITS, _LOGGED, _HASH = range(8)
_FIELDS = 8
_AHEAD = 16  # rows ahead whose hash slot is prefetched (their entry: half as far)
_FAR = 1 << 14  # keys in the table above which its rows no longer stay in L2 (1 MB): prefetch
_MAX_ROWS = 2**63 - 1  # the rows clock is an int64


def _aligned(rows: int, fields: int) -> np.ndarray:
    """An int64 table [rows, fields] of zeros whose rows start on 64-byte boundaries (a row of 8 fields is one
    cache line)."""
    buf = np.zeros(rows * fields + 8, np.int64)
    skip = (-buf.ctypes.data % 64) // 8
    return buf[skip : skip + rows * fields].reshape(rows, fields)


@dataclass(frozen=True)
class VocabEvents:
    """Ids given and taken back over some rows of one column, in the order it happened: ``admitted_ids`` [a]
    (int64, ids as the batches hold them) with their ``admitted_keys`` [a] (uint64), ``evicted_ids`` [e] with
    their ``evicted_keys`` [e]. A trainer resets the embedding rows of ``admitted_ids`` (a reused id is always
    admitted again, in a later batch than its eviction)."""

    admitted_ids: np.ndarray
    admitted_keys: np.ndarray
    evicted_ids: np.ndarray
    evicted_keys: np.ndarray

    @classmethod
    def none(cls) -> VocabEvents:
        ids, keys = np.zeros(0, np.int64), np.zeros(0, np.uint64)
        return cls(ids, keys, ids, keys)

    @staticmethod
    def concat(events: list[VocabEvents]) -> VocabEvents:
        if len(events) == 1:
            return events[0]
        if not events:
            return VocabEvents.none()
        fields = ("admitted_ids", "admitted_keys", "evicted_ids", "evicted_keys")
        return VocabEvents(*(np.concatenate([getattr(e, f) for e in events]) for f in fields))

    def __len__(self) -> int:
        return len(self.admitted_ids) + len(self.evicted_ids)


@dataclass(frozen=True)
class Undo:
    """What one update changed, enough to go back to the state before it: ``rows``, the clock before it, and
    ``records`` [m, 5] (int64), one per entry of the table it changed: the entry's place in the table, then what it
    held before: key bits, count, last, id (count 0: it was free). A row changes its key's entry and at most one
    other (a candidate it drops, a key it evicts), so ``m`` is at most twice the update's rows, and at most the
    table's ``2 * capacity`` entries."""

    rows: int
    records: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.records.nbytes


class OnlineVocab:
    """One column's online vocabulary (see the module docstring). Not thread-safe: one thread updates it."""

    def __init__(self, capacity: int, admit_after: int = 1, evict: str = "lfu", ttl_rows: int | None = None,
                 oov_buckets: int = 1, seed: int = 0):  # fmt: skip
        check_online_params(capacity, admit_after, evict, ttl_rows)
        check_buckets(oov_buckets)
        check_seed(seed)
        self.capacity, self.admit_after, self.evict, self.ttl_rows = capacity, admit_after, evict, ttl_rows or 0
        self.oov_buckets, self.seed = oov_buckets, seed
        self.first_id = RESERVED + oov_buckets
        self._seed_word = np.uint64(seed_word(seed))
        self.candidates = capacity
        self._reset()

    @property
    def cardinality(self) -> int:
        return self.first_id + self.capacity

    @property
    def rows(self) -> int:
        """Rows seen so far (the clock)."""
        return int(self._meta[_CLOCK])

    def __len__(self) -> int:
        """Admitted keys."""
        return int(self._meta[_N_ADMITTED])

    def _reset(self) -> None:
        c, k = self.capacity, self.candidates
        e = c + k
        self._ent = _aligned(e, _FIELDS)  # the entries, fields _KEY .. _HASH
        self._free_entries = np.arange(e - 1, -1, -1, dtype=np.int64)  # a stack: entry 0 on top
        # heaps of rows (count, last, entry): count and last as they were when the row was placed (see _fresh_top)
        self._admitted = np.zeros((c, 3), np.int64)  # admitted keys, in eviction order
        self._cands = np.zeros((k, 3), np.int64)  # candidates seen more than once, by (count, last)
        # a ring of (entry, last) of the candidates seen once, oldest first: at least twice the candidates, a power of two
        self._queue = np.zeros((1 << int(2 * k - 1).bit_length(), 2), np.int64)
        self._free_ids = np.arange(c, dtype=np.int64)  # heap of ids (sorted: a valid heap)
        self._cooling = np.zeros(c, np.int64)  # ids evicted in the current batch, free from the next one
        size = 1 << max(4, int(2 * e - 1).bit_length())
        self._slots = _aligned(size, 2)  # the hash table: (hash, entry + 1) per slot, 0: empty
        self._meta = np.array([0, 0, 0, c, e, 0, 0, 0, 0, 0, 0], np.int64)

    # ------------------------------------------------------------------ update
    def update(self, keys: np.ndarray, valid: np.ndarray | None = None) -> tuple[np.ndarray, VocabEvents]:
        """The ids (int64) of the rows of one batch, ``keys`` (uint64; ``valid`` False: missing, id 1), updating the
        vocabulary row by row, and the events of the batch. The ids it evicts become free once it returns (for the
        next batch). Changing nothing, ``TypeError`` for keys of another dtype than uint64 or int64, ``ValueError`` for
        ``valid`` of another length, ``OverflowError`` when the rows would take the clock past 2**63 - 1."""
        ids, events, _ = self._update(keys, valid, record=False)
        return ids, events

    def update_with_undo(self, keys: np.ndarray, valid: np.ndarray | None = None) -> tuple[np.ndarray, VocabEvents, Undo]:
        """``update``, and what it changed (``Undo``): ``export(undo=[...])`` gives the state before it."""
        return self._update(keys, valid, record=True)

    def _update(self, keys: np.ndarray, valid: np.ndarray | None, record: bool) -> tuple[np.ndarray, VocabEvents, Undo]:
        keys = np.ascontiguousarray(keys)
        if keys.dtype not in (np.uint64, np.int64):
            raise TypeError(f"online vocabulary: keys must be uint64 (or int64 bits), got {keys.dtype}")
        n = len(keys)
        if valid is not None and len(valid) != n:
            raise ValueError(f"online vocabulary: {len(valid)} valid flags for {n} keys")
        rows = self.rows
        if n > _MAX_ROWS - rows:
            raise OverflowError(f"online vocabulary: {n} more rows would take the rows clock ({rows}) past 2**63 - 1")
        keys = keys.view(np.int64)
        valid = np.ones(n, np.bool_) if valid is None else np.ascontiguousarray(valid, np.bool_)
        hashes = np.empty(n, np.int64)
        _hash(keys, self._seed_word, hashes)
        out = np.empty(n, np.int64)
        events = np.empty((4, n), np.int64)
        counts = np.zeros(2, np.int64)
        undo = np.empty((min(2 * n, len(self._ent)) if record else 0, 5), np.int64)  # see Undo
        _update(keys, hashes, valid, out, events, counts, self._ent, self._free_entries, self._admitted, self._cands, self._queue,
                self._free_ids, self._cooling, self._slots, undo, self._meta, self.admit_after, self.evict == "lfu", self.ttl_rows,
                self.first_id, self.oov_buckets)  # fmt: skip
        a, v = int(counts[0]), int(counts[1])
        ev = VocabEvents(events[0, :a].copy(), events[1, :a].copy().view(np.uint64), events[2, :v].copy(), events[3, :v].copy().view(np.uint64))
        m = int(self._meta[_N_UNDO]) if record else 0
        return out, ev, Undo(rows, undo[:m].copy())

    # ------------------------------------------------------------------ state
    def export(self, canonical: bool = True, undo: Sequence[Undo] = ()) -> dict[str, np.ndarray | int]:
        """The state: ``rows`` (the clock) and the arrays ``key``, ``count``, ``last``, ``id`` of every key in the
        table, sorted by key (see the module docstring); ``canonical=False``: in no particular order (a quicker copy
        that ``restore`` takes as well). ``undo``: what the last updates changed (``update_with_undo``), newest
        first: the state before them."""
        table = self._ent[:, :_POS].copy()  # key, count, last, id
        rows = self.rows
        for u in undo:
            table[u.records[:, 0]] = u.records[:, 1:]
            rows = u.rows
        table = table[table[:, _COUNT] > 0]
        state: dict[str, np.ndarray | int] = {"rows": rows, "key": table[:, _KEY].view(np.uint64).copy()}
        state |= {"count": table[:, _COUNT].copy(), "last": table[:, _LAST].copy(), "id": table[:, _ID].copy()}
        return canonical_state(state) if canonical else state

    def check(self, state: dict[str, np.ndarray | int]) -> None:
        """``InvalidState`` unless ``restore`` takes ``state``; changes nothing."""
        _checked(state, self.capacity, self.candidates)

    def restore(self, state: dict[str, np.ndarray | int]) -> None:
        """Take a state ``export`` gave (``InvalidState`` when it cannot be one of this vocabulary's)."""
        keys, counts, last, ids, rows = _checked(state, self.capacity, self.candidates)
        self._reset()
        keys = keys.view(np.int64)
        hashes = np.empty(len(keys), np.int64)
        _hash(keys, self._seed_word, hashes)
        _load(keys, hashes, counts, last, ids, self._ent, self._free_entries, self._admitted, self._cands, self._queue,
              self._free_ids, self._slots, self._meta, self.evict == "lfu")  # fmt: skip
        self._meta[_CLOCK] = rows

    def seed_from(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """Start from a fitted vocabulary (its keys and counts in id order): the first ``capacity`` keys admitted
        with ids 0, 1, ... (relative to the first vocabulary id: Categorify's ids), nothing else in the table."""
        n = min(len(keys), self.capacity)
        k = np.asarray(keys[:n], np.uint64)
        order = np.argsort(k, kind="stable")
        ranks = np.arange(n, dtype=np.int64)[order]
        self.restore({"rows": 0, "key": k[order], "count": np.asarray(counts[:n], np.int64)[order], "last": ranks - n, "id": ranks})


class VocabularyStream(StreamState):
    """One column's online vocabulary as a streaming state (``etl.ops.stream``): it reads the column's keys
    (carried as uint64 with their valid mask) and writes its ids; its events are each batch's ``VocabEvents``, its
    undo records ``Undo``, its state ``OnlineVocab.export``'s (scalar ``rows``, arrays ``STATE_ARRAYS``)."""

    def __init__(self, spec: StreamSpec, vocab: OnlineVocab):
        self.spec, self.vocab = spec, vocab

    def advance(self, inputs: Mapping[str, Carried]) -> StreamStep:
        keys, valid = inputs[self.spec.column]
        ids, events, undo = self.vocab.update_with_undo(keys, valid)
        return StreamStep({self.spec.column: ids}, events, undo)

    def export(self, canonical: bool = True, undo: Sequence[Any] = ()) -> StateArrays:
        return self.vocab.export(canonical, undo)

    def canonical(self, state: StateArrays) -> StateArrays:
        return canonical_state(state)

    def check(self, state: StateArrays) -> None:
        self.vocab.check(state)

    def restore(self, state: StateArrays) -> None:
        self.vocab.restore(state)


def canonical_state(state: dict[str, np.ndarray | int]) -> dict[str, np.ndarray | int]:
    """A state with its entries sorted by key (``export``'s order)."""
    order = np.argsort(np.asarray(state["key"]), kind="stable")
    return {k: v[order] if isinstance(v, np.ndarray) else v for k, v in state.items()}


def check_online_params(capacity: object, admit_after: object, evict: object, ttl_rows: object) -> None:
    """``ValueError`` naming the parameter unless: ``capacity`` an integer >= 1, ``admit_after`` an integer >= 1,
    ``evict`` one of ``EVICT``, ``ttl_rows`` an integer >= 1 with ``evict: ttl`` and absent otherwise."""
    for name, v in (("capacity", capacity), ("admit_after", admit_after)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"Categorify.{name} must be an integer >= 1, got {v!r}")
    if evict not in EVICT:
        raise ValueError(f"Categorify.evict must be one of {list(EVICT)}, got {evict!r}")
    if evict == "ttl" and (not isinstance(ttl_rows, int) or isinstance(ttl_rows, bool) or ttl_rows < 1):
        raise ValueError(f"Categorify.ttl_rows must be an integer >= 1 with evict: ttl, got {ttl_rows!r}")
    if evict != "ttl" and ttl_rows is not None:
        raise ValueError(f"Categorify.ttl_rows is for evict: ttl (evict is {evict!r})")


def _checked(state: dict[str, np.ndarray | int], capacity: int, candidates: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The arrays and clock of a state, checked (``InvalidState`` naming the problem)."""
    try:
        rows = int(state["rows"])
        keys, counts, last, ids = (np.asarray(state[k]) for k in ("key", "count", "last", "id"))
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidState(f"online vocabulary: malformed state: {e}") from None
    if not (len(keys) == len(counts) == len(last) == len(ids)):
        raise InvalidState("online vocabulary: key, count, last and id differ in length")
    keys, counts, last, ids = keys.astype(np.uint64), counts.astype(np.int64), last.astype(np.int64), ids.astype(np.int64)
    admitted = ids >= 0
    ordered = np.sort(keys)
    if len(keys) and (ordered[1:] == ordered[:-1]).any():
        raise InvalidState("online vocabulary: a key appears more than once")
    if len(keys) and (counts.min() < 1 or ids.min() < -1 or ids.max() >= capacity):
        raise InvalidState(f"online vocabulary: a count below 1 or an id outside -1 .. {capacity - 1}")
    if admitted.sum() > capacity or (~admitted).sum() > candidates:
        raise InvalidState(f"online vocabulary: more than {capacity} admitted keys or {candidates} candidates")
    if len(np.unique(ids[admitted])) != admitted.sum():
        raise InvalidState("online vocabulary: an id given to two keys")
    if not 0 <= rows <= _MAX_ROWS:
        raise InvalidState(f"online vocabulary: the rows clock {rows} is outside 0 .. 2**63 - 1")
    if (len(last) and last.max() >= rows) or len(np.unique(last)) != len(last):
        raise InvalidState("online vocabulary: 'last' rows not distinct or not before the clock")
    return keys, counts, last, ids, rows


# ---------------------------------------------------------------------------------------------- kernels


@_kernel
def _lt(count1, last1, count2, last2, by_count):
    """(count1, last1) orders before (count2, last2): by count then last, or by last alone."""
    if by_count and count1 != count2:
        return count1 < count2
    return last1 < last2


@_kernel
def _set_row(heap, i, count, last, e, ent):
    heap[i, 0] = count
    heap[i, 1] = last
    heap[i, 2] = e
    ent[e, _POS] = i


@_kernel
def _sift_up(heap, i, ent, by_count):
    count, last, e = heap[i, 0], heap[i, 1], heap[i, 2]
    while i > 0:
        p = (i - 1) >> 1
        if not _lt(count, last, heap[p, 0], heap[p, 1], by_count):
            break
        _set_row(heap, i, heap[p, 0], heap[p, 1], heap[p, 2], ent)
        i = p
    _set_row(heap, i, count, last, e, ent)


@_kernel
def _sift_down(heap, n, i, ent, by_count):
    count, last, e = heap[i, 0], heap[i, 1], heap[i, 2]
    while True:
        j = 2 * i + 1
        if j >= n:
            break
        if j + 1 < n and _lt(heap[j + 1, 0], heap[j + 1, 1], heap[j, 0], heap[j, 1], by_count):
            j += 1
        if not _lt(heap[j, 0], heap[j, 1], count, last, by_count):
            break
        _set_row(heap, i, heap[j, 0], heap[j, 1], heap[j, 2], ent)
        i = j
    _set_row(heap, i, count, last, e, ent)


@_kernel
def _heap_push(heap, n, e, ent, by_count):
    """Place entry ``e`` with its current (count, last) at the end of a heap of ``n`` and sift it up; the new size."""
    _set_row(heap, n, ent[e, _COUNT], ent[e, _LAST], e, ent)
    _sift_up(heap, n, ent, by_count)
    return n + 1


@_kernel
def _heap_remove(heap, n, i, ent, by_count):
    """Remove the row at position ``i`` of a heap of ``n``; returns the new size."""
    n -= 1
    if i < n:
        _set_row(heap, i, heap[n, 0], heap[n, 1], heap[n, 2], ent)
        p = (i - 1) >> 1
        if i > 0 and _lt(heap[i, 0], heap[i, 1], heap[p, 0], heap[p, 1], by_count):
            _sift_up(heap, i, ent, by_count)
        else:
            _sift_down(heap, n, i, ent, by_count)
    return n


@_kernel
def _fresh_top(heap, n, ent, by_count):
    """Bring the heap's top up to date: while the top entry's (count, last) grew since it was placed, place it
    again. Priorities only grow, so a heap ordered by the stored ones has the true minimum on top once the top's
    stored priority is its current one."""
    while True:
        e = heap[0, 2]
        if heap[0, 0] == ent[e, _COUNT] and heap[0, 1] == ent[e, _LAST]:
            return e
        heap[0, 0] = ent[e, _COUNT]
        heap[0, 1] = ent[e, _LAST]
        _sift_down(heap, n, 0, ent, by_count)


@_kernel
def _push_id(heap, n, v):
    i = n
    while i > 0:
        p = (i - 1) >> 1
        if heap[p] <= v:
            break
        heap[i] = heap[p]
        i = p
    heap[i] = v
    return n + 1


@_kernel
def _pop_id(heap, n):
    top = heap[0]
    n -= 1
    v = heap[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and heap[c + 1] < heap[c]:
            c += 1
        if heap[c] >= v:
            break
        heap[i] = heap[c]
        i = c
    if n > 0:
        heap[i] = v
    return top


@_kernel
def _hash(keys, seed_word, out):
    """``out[i]``: the hash of key ``i`` (int64 bits of ``fmix64(key ^ seed_word)``, the hash of Categorify's
    out-of-vocabulary bucket). A bijection of the keys: the hash table holds hashes, not keys."""
    for i in range(len(keys)):
        out[i] = np.int64(fmix64(np.uint64(keys[i]) ^ seed_word))


@_kernel
def _find(slots, h):
    """The slot of the key of hash ``h``, or the empty slot where it would go."""
    mask = len(slots) - 1
    s = h & mask
    while True:
        if slots[s, 1] == 0 or slots[s, 0] == h:
            return s
        s = (s + 1) & mask


@_kernel
def _delete(slots, s):
    """Empty slot ``s``, shifting back the slots after it that probed past it (no tombstones)."""
    mask = len(slots) - 1
    j = s
    while True:
        j = (j + 1) & mask
        if slots[j, 1] == 0:
            break
        home = slots[j, 0] & mask
        if (j > s and (home <= s or home > j)) or (j < s and (home <= s and home > j)):
            slots[s, 0] = slots[j, 0]
            slots[s, 1] = slots[j, 1]
            s = j
    slots[s, 1] = 0


@_kernel
def _record(e, ent, undo, meta):
    """Entry ``e`` is about to change for the first time in this update: record what it holds."""
    ent[e, _LOGGED] = meta[_BATCH] + 1
    u = meta[_N_UNDO]
    undo[u, 0] = e
    for f in range(4):
        undo[u, 1 + f] = ent[e, f]
    meta[_N_UNDO] = u + 1


@_kernel
def _free_entry(e, ent, slots, free_entries, undo, meta):
    """Take entry ``e``'s key out of the hash table and give the entry back (count 0: no queue record is valid)."""
    if len(undo) and ent[e, _LOGGED] != meta[_BATCH] + 1:
        _record(e, ent, undo, meta)
    _delete(slots, _find(slots, ent[e, _HASH]))
    ent[e, _COUNT] = 0
    free_entries[meta[_N_FREE_ENTRIES]] = e
    meta[_N_FREE_ENTRIES] += 1


@_kernel
def _once(ent, f, t):
    """Entry ``f`` is still the count-1 candidate a queue record (``f``, ``t``) was made for."""
    return ent[f, _COUNT] == 1 and ent[f, _ID] < 0 and ent[f, _LAST] == t


@_kernel
def _queue_push(queue, meta, e, t, ent):
    """Append (entry, last) to the queue of count-1 candidates (a ring of at least twice the candidates: full, it
    is first compacted in place to its valid records, at most half of it, in order from its head: a record moves
    only to a place already read)."""
    size = len(queue)
    mask = size - 1
    if meta[_QUEUE_SIZE] == size:
        head = meta[_QUEUE_HEAD]
        kept = 0
        for i in range(size):
            j = (head + i) & mask
            f = queue[j, 0]
            if _once(ent, f, queue[j, 1]):
                k = (head + kept) & mask
                queue[k, 0] = f
                queue[k, 1] = queue[j, 1]
                kept += 1
        meta[_QUEUE_SIZE] = kept
    j = (meta[_QUEUE_HEAD] + meta[_QUEUE_SIZE]) & mask
    queue[j, 0] = e
    queue[j, 1] = t
    meta[_QUEUE_SIZE] += 1


@_kernel
def _queue_pop(queue, meta, ent):
    """The oldest count-1 candidate, taken off the queue (records of entries seen again, admitted or gone are
    skipped); -1 when there is none."""
    mask = len(queue) - 1
    while meta[_QUEUE_SIZE] > 0:
        j = meta[_QUEUE_HEAD]
        meta[_QUEUE_HEAD] = (j + 1) & mask
        meta[_QUEUE_SIZE] -= 1
        f = queue[j, 0]
        if _once(ent, f, queue[j, 1]):
            return f
    return -1


@_kernel
def _prefetch_ahead(r, hashes, ent, slots, queue, meta):
    """Start fetching what rows ahead will touch: the hash slot of row ``r + _AHEAD``, the entry of row
    ``r + _AHEAD // 2`` (its slot is in cache by now), and the entries and slots of the next candidates the queue
    would drop."""
    mask = len(slots) - 1
    if r + _AHEAD < len(hashes):
        prefetch(slots, (hashes[r + _AHEAD] & mask, 0))
    if r + _AHEAD // 2 < len(hashes):
        h = hashes[r + _AHEAD // 2]
        s = h & mask
        if slots[s, 1] > 0 and slots[s, 0] == h:
            prefetch(ent, (slots[s, 1] - 1, 0))
    if meta[_QUEUE_SIZE] > _AHEAD:
        ring = len(queue) - 1
        prefetch(ent, (queue[(meta[_QUEUE_HEAD] + _AHEAD) & ring, 0], 0))
        prefetch(slots, (ent[queue[(meta[_QUEUE_HEAD] + _AHEAD // 2) & ring, 0], _HASH] & mask, 0))


@_kernel
def _update(keys, hashes, valid, out, events, counts, ent, free_entries, admitted, cands, queue, free_ids, cooling, slots,
            undo, meta, admit_after, lfu, ttl_rows, first_id, oov_n):  # fmt: skip
    batch = meta[_BATCH]
    meta[_N_UNDO] = 0
    record = len(undo) > 0
    far = meta[_N_ADMITTED] + meta[_N_CANDIDATES] > _FAR
    n_adm = 0
    n_ev = 0
    for r in range(len(keys)):
        t = meta[_CLOCK]
        meta[_CLOCK] = t + 1
        if far:
            _prefetch_ahead(r, hashes, ent, slots, queue, meta)
        if not valid[r]:
            out[r] = MISSING
            continue
        h = hashes[r]
        s = _find(slots, h)
        e = slots[s, 1] - 1
        if e >= 0:
            if record and ent[e, _LOGGED] != batch + 1:
                _record(e, ent, undo, meta)
            ent[e, _COUNT] += 1
            ent[e, _LAST] = t
            if ent[e, _ID] >= 0:
                out[r] = first_id + ent[e, _ID]
                continue
            in_heap = ent[e, _COUNT] > 2  # candidates seen once wait in the queue, the others in the heap
        else:
            if meta[_N_CANDIDATES] == len(cands):  # drop the lowest (count, last) candidate
                d = _queue_pop(queue, meta, ent)
                if d < 0:
                    d = _fresh_top(cands, meta[_N_HEAP], ent, True)
                    meta[_N_HEAP] = _heap_remove(cands, meta[_N_HEAP], 0, ent, True)
                meta[_N_CANDIDATES] -= 1
                _free_entry(d, ent, slots, free_entries, undo, meta)
                s = _find(slots, h)
            meta[_N_FREE_ENTRIES] -= 1
            e = free_entries[meta[_N_FREE_ENTRIES]]
            if record and ent[e, _LOGGED] != batch + 1:
                _record(e, ent, undo, meta)
            ent[e, _KEY] = keys[r]
            ent[e, _COUNT] = 1
            ent[e, _LAST] = t
            ent[e, _ID] = -1
            ent[e, _WAITS] = 0
            ent[e, _HASH] = h
            slots[s, 0] = h
            slots[s, 1] = e + 1
            meta[_N_CANDIDATES] += 1
            _queue_push(queue, meta, e, t, ent)
            in_heap = False
        count = ent[e, _COUNT]
        new_id = -1
        if count >= admit_after:
            if meta[_N_FREE_IDS] > 0:
                new_id = _pop_id(free_ids, meta[_N_FREE_IDS])
                meta[_N_FREE_IDS] -= 1
            elif ent[e, _WAITS] != batch + 1 and meta[_N_ADMITTED] > 0:  # every id may be cooling
                v = _fresh_top(admitted, meta[_N_ADMITTED], ent, lfu)
                if (count > ent[v, _COUNT]) if lfu else (t - ent[v, _LAST] >= ttl_rows):
                    if record and ent[v, _LOGGED] != batch + 1:
                        _record(v, ent, undo, meta)
                    events[2, n_ev] = first_id + ent[v, _ID]
                    events[3, n_ev] = ent[v, _KEY]
                    n_ev += 1
                    cooling[meta[_N_COOLING]] = ent[v, _ID]
                    meta[_N_COOLING] += 1
                    ent[e, _WAITS] = batch + 1
                    meta[_N_ADMITTED] = _heap_remove(admitted, meta[_N_ADMITTED], 0, ent, lfu)
                    ent[v, _ID] = -1
                    _free_entry(v, ent, slots, free_entries, undo, meta)
        if new_id < 0:
            if not in_heap and count == 2:  # seen again: from the queue to the heap
                meta[_N_HEAP] = _heap_push(cands, meta[_N_HEAP], e, ent, True)
            out[r] = RESERVED + reduce_range(np.uint64(h), oov_n)
            continue
        if in_heap:
            meta[_N_HEAP] = _heap_remove(cands, meta[_N_HEAP], ent[e, _POS], ent, True)
        meta[_N_CANDIDATES] -= 1
        ent[e, _ID] = new_id
        meta[_N_ADMITTED] = _heap_push(admitted, meta[_N_ADMITTED], e, ent, lfu)
        events[0, n_adm] = first_id + new_id
        events[1, n_adm] = keys[r]
        n_adm += 1
        out[r] = first_id + new_id
    for i in range(meta[_N_COOLING]):  # the batch is over: its evicted ids are free
        meta[_N_FREE_IDS] = _push_id(free_ids, meta[_N_FREE_IDS], cooling[i])
    meta[_N_COOLING] = 0
    meta[_BATCH] = batch + 1
    counts[0] = n_adm
    counts[1] = n_ev


@_jit
def _load(keys, hashes, counts, lasts, idv, ent, free_entries, admitted, cands, queue, free_ids, slots, meta, lfu):
    """Fill empty tables with entries sorted by key (count-1 candidates queued in ``last`` order)."""
    taken = np.zeros(len(free_ids), np.bool_)
    once = np.empty(len(keys), np.int64)
    once_last = np.empty(len(keys), np.int64)
    n_once = 0
    for i in range(len(keys)):
        meta[_N_FREE_ENTRIES] -= 1
        e = free_entries[meta[_N_FREE_ENTRIES]]
        ent[e, _KEY] = keys[i]
        ent[e, _COUNT] = counts[i]
        ent[e, _LAST] = lasts[i]
        ent[e, _ID] = idv[i]
        ent[e, _HASH] = hashes[i]
        s = _find(slots, hashes[i])
        slots[s, 0] = hashes[i]
        slots[s, 1] = e + 1
        if idv[i] >= 0:
            taken[idv[i]] = True
            meta[_N_ADMITTED] = _heap_push(admitted, meta[_N_ADMITTED], e, ent, lfu)
            continue
        meta[_N_CANDIDATES] += 1
        if counts[i] == 1:
            once[n_once] = e
            once_last[n_once] = lasts[i]
            n_once += 1
        else:
            meta[_N_HEAP] = _heap_push(cands, meta[_N_HEAP], e, ent, True)
    for i in np.argsort(once_last[:n_once]):
        _queue_push(queue, meta, once[i], once_last[i], ent)
    nf = 0
    for i in range(len(free_ids)):  # ascending: a valid heap
        if not taken[i]:
            free_ids[nf] = i
            nf += 1
    meta[_N_FREE_IDS] = nf
