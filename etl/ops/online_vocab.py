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

The per-row loop is a numba kernel over a hash table (linear probing, backward-shift deletion), a queue of the
candidates seen once (oldest first: they are the lowest (count, last) candidates, so dropping one is O(1)) and
three binary min-heaps (admitted keys by eviction order, candidates seen more than once by (count, last), free
ids). A sighting of a key in the table only bumps its count and ``last``; the heaps hold the priorities their
entries had when placed, and an entry found stale on top is placed again before the top is used (priorities only
grow, so the top is then the true minimum): admissions, evictions and drops cost O(log C) amortised.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from etl.backends.cpu import _fmix64, _reduce
from etl.backends.hashing import check_buckets, check_seed, seed_word
from etl.ids import MISSING, RESERVED
from etl.ops.base import InvalidState

#: Eviction policies: least frequently used, or not seen in the last ``ttl_rows`` rows.
EVICT = ("lfu", "ttl")

_jit = nb.njit(nogil=True, cache=True)

# meta slots
_CLOCK, _N_ADMITTED, _N_CANDIDATES, _N_FREE_IDS, _N_FREE_ENTRIES, _N_HEAP, _QUEUE_HEAD, _QUEUE_SIZE, _N_COOLING, _BATCH = range(10)


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
        self._key = np.zeros(e, np.uint64)
        self._count = np.zeros(e, np.int64)
        self._last = np.zeros(e, np.int64)
        self._hc = np.zeros(e, np.int64)  # count and last as the entry's heap last ordered it (see _fresh_top)
        self._hl = np.zeros(e, np.int64)
        self._id = np.full(e, -1, np.int64)
        self._pos = np.zeros(e, np.int64)  # position of an entry in its heap
        self._free_entries = np.arange(e - 1, -1, -1, dtype=np.int64)  # a stack: entry 0 on top
        self._admitted = np.zeros(c, np.int64)  # heap of entries
        self._cands = np.zeros(k, np.int64)  # heap of the entries of candidates seen more than once
        self._queue = np.zeros((2 * k, 2), np.int64)  # ring of (entry, last) of candidates seen once, oldest first
        self._free_ids = np.arange(c, dtype=np.int64)  # heap of ids (sorted: a valid heap)
        self._cooling = np.zeros(c, np.int64)  # ids evicted in the current batch, free from the next one
        self._waits = np.full(e, -1, np.int64)  # the batch in which a candidate evicted a key it waits to replace
        size = 1 << max(4, int(2 * e - 1).bit_length())
        self._slots = np.full(size, -1, np.int64)
        self._meta = np.array([0, 0, 0, c, e, 0, 0, 0, 0, 0], np.int64)

    # ------------------------------------------------------------------ update
    def update(self, keys: np.ndarray, valid: np.ndarray | None = None) -> tuple[np.ndarray, VocabEvents]:
        """The ids (int64) of the rows of one batch, ``keys`` (uint64; ``valid`` False: missing, id 1), updating the
        vocabulary row by row, and the events of the batch. The ids it evicts become free once it returns (for the
        next batch)."""
        n = len(keys)
        keys = np.ascontiguousarray(keys).view(np.uint64)
        valid = np.ones(n, np.bool_) if valid is None else np.ascontiguousarray(valid, np.bool_)
        out = np.empty(n, np.int64)
        events = np.empty((4, n), np.int64)
        counts = np.zeros(2, np.int64)
        _update(keys, valid, out, events, counts, self._key, self._count, self._last, self._hc, self._hl, self._id, self._pos,
                self._free_entries, self._admitted, self._cands, self._queue, self._free_ids, self._cooling, self._waits,
                self._slots, self._meta, self.admit_after, self.evict == "lfu", self.ttl_rows, self.first_id, self.oov_buckets,
                np.uint64(seed_word(self.seed)))  # fmt: skip
        a, v = int(counts[0]), int(counts[1])
        ev = VocabEvents(events[0, :a].copy(), events[1, :a].copy().view(np.uint64), events[2, :v].copy(), events[3, :v].copy().view(np.uint64))
        return out, ev

    # ------------------------------------------------------------------ state
    def export(self, canonical: bool = True) -> dict[str, np.ndarray | int]:
        """The state: ``rows`` (the clock) and the arrays ``key``, ``count``, ``last``, ``id`` of every key in the
        table, sorted by key (see the module docstring); ``canonical=False``: in no particular order (a quicker copy
        that ``restore`` takes as well)."""
        n_free = int(self._meta[_N_FREE_ENTRIES])
        used = np.ones(len(self._key), np.bool_)
        used[self._free_entries[:n_free]] = False
        entries = np.flatnonzero(used)
        state: dict[str, np.ndarray | int] = {"rows": self.rows}
        state |= {"key": self._key[entries], "count": self._count[entries], "last": self._last[entries], "id": self._id[entries]}
        return canonical_state(state) if canonical else state

    def restore(self, state: dict[str, np.ndarray | int]) -> None:
        """Take a state ``export`` gave (``InvalidState`` when it cannot be one of this vocabulary's)."""
        keys, counts, last, ids, rows = _checked(state, self.capacity, self.candidates)
        self._reset()
        _load(keys, counts, last, ids, self._key, self._count, self._last, self._hc, self._hl, self._id, self._pos, self._free_entries,
              self._admitted, self._cands, self._queue, self._free_ids, self._slots, self._meta, self.evict == "lfu")  # fmt: skip
        self._meta[_CLOCK] = rows

    def seed_from(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """Start from a fitted vocabulary (its keys and counts in id order): the first ``capacity`` keys admitted
        with ids 0, 1, ... (relative to the first vocabulary id: Categorify's ids), nothing else in the table."""
        n = min(len(keys), self.capacity)
        k = np.asarray(keys[:n], np.uint64)
        order = np.argsort(k, kind="stable")
        ranks = np.arange(n, dtype=np.int64)[order]
        self.restore({"rows": 0, "key": k[order], "count": np.asarray(counts[:n], np.int64)[order], "last": ranks - n, "id": ranks})


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
    if rows < 0 or (len(last) and last.max() >= rows) or len(np.unique(last)) != len(last):
        raise InvalidState("online vocabulary: 'last' rows not distinct or not before the clock")
    return keys, counts, last, ids, rows


# ---------------------------------------------------------------------------------------------- kernels


@_jit
def _less(a, b, count, last, by_count):
    if by_count and count[a] != count[b]:
        return count[a] < count[b]
    return last[a] < last[b]


@_jit
def _fresh_top(heap, n, pos, count, last, hc, hl, by_count):
    """Bring the heap's top up to date: while the top entry's (count, last) grew since it was placed, place it
    again. Priorities only grow, so a heap ordered by the stored ones (``hc``, ``hl``) has the true minimum on top
    once the top's stored priority is its current one."""
    while True:
        e = heap[0]
        if hc[e] == count[e] and hl[e] == last[e]:
            return e
        hc[e] = count[e]
        hl[e] = last[e]
        _sift_down(heap, n, 0, pos, hc, hl, by_count)


@_jit
def _sift_up(heap, i, pos, count, last, by_count):
    e = heap[i]
    while i > 0:
        p = (i - 1) >> 1
        if not _less(e, heap[p], count, last, by_count):
            break
        heap[i] = heap[p]
        pos[heap[i]] = i
        i = p
    heap[i] = e
    pos[e] = i


@_jit
def _sift_down(heap, n, i, pos, count, last, by_count):
    e = heap[i]
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _less(heap[c + 1], heap[c], count, last, by_count):
            c += 1
        if not _less(heap[c], e, count, last, by_count):
            break
        heap[i] = heap[c]
        pos[heap[i]] = i
        i = c
    heap[i] = e
    pos[e] = i


@_jit
def _heap_remove(heap, n, i, pos, count, last, by_count):
    """Remove the entry at position ``i`` of a heap of ``n``; returns the new size."""
    n -= 1
    if i < n:
        heap[i] = heap[n]
        pos[heap[i]] = i
        if i > 0 and _less(heap[i], heap[(i - 1) >> 1], count, last, by_count):
            _sift_up(heap, i, pos, count, last, by_count)
        else:
            _sift_down(heap, n, i, pos, count, last, by_count)
    return n


@_jit
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


@_jit
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


@_jit
def _find(slots, keys, k):
    mask = len(slots) - 1
    s = np.int64(_fmix64(k) & np.uint64(mask))
    while True:
        e = slots[s]
        if e < 0 or keys[e] == k:
            return s
        s = (s + 1) & mask


@_jit
def _delete(slots, keys, s):
    """Empty slot ``s``, shifting back the entries after it that probed past it (no tombstones)."""
    mask = len(slots) - 1
    j = s
    while True:
        j = (j + 1) & mask
        e = slots[j]
        if e < 0:
            break
        home = np.int64(_fmix64(keys[e]) & np.uint64(mask))
        if (j > s and (home <= s or home > j)) or (j < s and (home <= s and home > j)):
            slots[s] = e
            s = j
    slots[s] = -1


@_jit
def _free_entry(e, key, count, slots, free_entries, meta):
    """Take entry ``e``'s key out of the hash table and give the entry back (count 0: no queue record is valid)."""
    _delete(slots, key, _find(slots, key, key[e]))
    count[e] = 0
    free_entries[meta[_N_FREE_ENTRIES]] = e
    meta[_N_FREE_ENTRIES] += 1


@_jit
def _queue_push(queue, meta, e, t, count, last, ids):
    """Append (entry, last) to the queue of count-1 candidates (a ring of twice the candidates: full, it is first
    compacted to its valid records, at most half of it)."""
    size = len(queue)
    if meta[_QUEUE_SIZE] == size:
        kept = 0
        for i in range(size):
            j = (meta[_QUEUE_HEAD] + i) % size
            f = queue[j, 0]
            if count[f] == 1 and ids[f] < 0 and last[f] == queue[j, 1]:
                queue[kept, 0] = f
                queue[kept, 1] = queue[j, 1]
                kept += 1
        meta[_QUEUE_HEAD] = 0
        meta[_QUEUE_SIZE] = kept
    j = (meta[_QUEUE_HEAD] + meta[_QUEUE_SIZE]) % size
    queue[j, 0] = e
    queue[j, 1] = t
    meta[_QUEUE_SIZE] += 1


@_jit
def _queue_pop(queue, meta, count, last, ids):
    """The oldest count-1 candidate, taken off the queue (records of entries seen again, admitted or gone are
    skipped); -1 when there is none."""
    size = len(queue)
    while meta[_QUEUE_SIZE] > 0:
        j = meta[_QUEUE_HEAD]
        meta[_QUEUE_HEAD] = (j + 1) % size
        meta[_QUEUE_SIZE] -= 1
        f = queue[j, 0]
        if count[f] == 1 and ids[f] < 0 and last[f] == queue[j, 1]:
            return f
    return -1


@_jit
def _update(keys, valid, out, events, counts, key, count, last, hc, hl, ids, pos, free_entries, admitted, cands, queue,
            free_ids, cooling, waits, slots, meta, admit_after, lfu, ttl_rows, first_id, oov_n, seed_word):  # fmt: skip
    batch = meta[_BATCH]
    n_adm = 0
    n_ev = 0
    for r in range(len(keys)):
        t = meta[_CLOCK]
        meta[_CLOCK] = t + 1
        if not valid[r]:
            out[r] = MISSING
            continue
        k = keys[r]
        s = _find(slots, key, k)
        e = slots[s]
        if e >= 0:
            count[e] += 1
            last[e] = t
            if ids[e] >= 0:
                out[r] = first_id + ids[e]
                continue
            in_heap = count[e] > 2  # candidates seen once wait in the queue, the others in the heap
        else:
            if meta[_N_CANDIDATES] == len(cands):  # drop the lowest (count, last) candidate
                d = _queue_pop(queue, meta, count, last, ids)
                if d < 0:
                    d = _fresh_top(cands, meta[_N_HEAP], pos, count, last, hc, hl, True)
                    meta[_N_HEAP] = _heap_remove(cands, meta[_N_HEAP], 0, pos, hc, hl, True)
                meta[_N_CANDIDATES] -= 1
                _free_entry(d, key, count, slots, free_entries, meta)
                s = _find(slots, key, k)
            meta[_N_FREE_ENTRIES] -= 1
            e = free_entries[meta[_N_FREE_ENTRIES]]
            key[e] = k
            count[e] = 1
            last[e] = t
            ids[e] = -1
            waits[e] = -1
            slots[s] = e
            meta[_N_CANDIDATES] += 1
            _queue_push(queue, meta, e, t, count, last, ids)
            in_heap = False
        new_id = -1
        if count[e] >= admit_after:
            if meta[_N_FREE_IDS] > 0:
                new_id = _pop_id(free_ids, meta[_N_FREE_IDS])
                meta[_N_FREE_IDS] -= 1
            elif waits[e] != batch and meta[_N_ADMITTED] > 0:  # every id may be cooling
                v = _fresh_top(admitted, meta[_N_ADMITTED], pos, count, last, hc, hl, lfu)
                if (count[e] > count[v]) if lfu else (t - last[v] >= ttl_rows):
                    events[2, n_ev] = first_id + ids[v]
                    events[3, n_ev] = np.int64(key[v])
                    n_ev += 1
                    cooling[meta[_N_COOLING]] = ids[v]
                    meta[_N_COOLING] += 1
                    waits[e] = batch
                    meta[_N_ADMITTED] = _heap_remove(admitted, meta[_N_ADMITTED], 0, pos, hc, hl, lfu)
                    ids[v] = -1
                    _free_entry(v, key, count, slots, free_entries, meta)
        if new_id < 0:
            if not in_heap and count[e] == 2:  # seen again: from the queue to the heap
                hc[e] = count[e]
                hl[e] = last[e]
                nh = meta[_N_HEAP]
                cands[nh] = e
                pos[e] = nh
                meta[_N_HEAP] = nh + 1
                _sift_up(cands, nh, pos, hc, hl, True)
            out[r] = RESERVED + _reduce(_fmix64(k ^ seed_word), oov_n)
            continue
        if in_heap:
            meta[_N_HEAP] = _heap_remove(cands, meta[_N_HEAP], pos[e], pos, hc, hl, True)
        meta[_N_CANDIDATES] -= 1
        ids[e] = new_id
        hc[e] = count[e]
        hl[e] = last[e]
        na = meta[_N_ADMITTED]
        admitted[na] = e
        pos[e] = na
        meta[_N_ADMITTED] = na + 1
        _sift_up(admitted, na, pos, hc, hl, lfu)
        events[0, n_adm] = first_id + new_id
        events[1, n_adm] = np.int64(k)
        n_adm += 1
        out[r] = first_id + new_id
    for i in range(meta[_N_COOLING]):  # the batch is over: its evicted ids are free
        meta[_N_FREE_IDS] = _push_id(free_ids, meta[_N_FREE_IDS], cooling[i])
    meta[_N_COOLING] = 0
    meta[_BATCH] = batch + 1
    counts[0] = n_adm
    counts[1] = n_ev


@_jit
def _load(keys, counts, lasts, idv, key, count, last, hc, hl, ids, pos, free_entries, admitted, cands, queue, free_ids,
          slots, meta, lfu):  # fmt: skip
    """Fill empty tables with entries sorted by key (count-1 candidates queued in ``last`` order)."""
    taken = np.zeros(len(free_ids), np.bool_)
    once = np.empty(len(keys), np.int64)
    n_once = 0
    for i in range(len(keys)):
        meta[_N_FREE_ENTRIES] -= 1
        e = free_entries[meta[_N_FREE_ENTRIES]]
        key[e] = keys[i]
        count[e] = hc[e] = counts[i]
        last[e] = hl[e] = lasts[i]
        ids[e] = idv[i]
        slots[_find(slots, key, keys[i])] = e
        if idv[i] >= 0:
            taken[idv[i]] = True
            na = meta[_N_ADMITTED]
            admitted[na] = e
            pos[e] = na
            meta[_N_ADMITTED] = na + 1
            _sift_up(admitted, na, pos, hc, hl, lfu)
            continue
        meta[_N_CANDIDATES] += 1
        if counts[i] == 1:
            once[n_once] = e
            n_once += 1
        else:
            nh = meta[_N_HEAP]
            cands[nh] = e
            pos[e] = nh
            meta[_N_HEAP] = nh + 1
            _sift_up(cands, nh, pos, hc, hl, True)
    once = once[:n_once]
    for e in once[np.argsort(last[once])]:
        _queue_push(queue, meta, e, last[e], count, last, ids)
    nf = 0
    for i in range(len(free_ids)):  # ascending: a valid heap
        if not taken[i]:
            free_ids[nf] = i
            nf += 1
    meta[_N_FREE_IDS] = nf
