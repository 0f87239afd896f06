"""The per-key state of ``History`` (``etl.ops.history``): each key's latest events, updated row by row.

``HistoryState(spec, columns, max_len, ttl, max_keys)`` takes rows in order, each a key (uint64: the key's hash,
``etl.ops.history.key_hashes``), a time (int64) and the values of the listed columns (int64), and gives each row
its history: the values of the same key's earlier rows whose time is strictly earlier than its own, the latest
``max_len`` of them, oldest first, and only those within ``ttl`` of its time (``row time - ttl <= event time``;
``ttl`` None: no limit). Rows of one key must come in time order (a row older than its key's latest row is refused:
``LateRow``); rows at the same time do not see each other, whatever their order.

Per key it keeps at most ``2 * max_len`` entries (time and values), in time order: up to ``max_len`` *settled*
ones (their time is before the key's latest time: the ones a row at a later time sees) and up to ``max_len``
*pending* ones (at the key's latest time: seen by no row yet, settled when a later time comes). That is what an
exact answer needs: a row at the latest time sees the settled entries; a row at a later time sees the latest
``max_len`` of all of them. At most ``max_keys`` keys are kept: a new key then evicts the key seen least recently
(its history is forgotten: later rows of it start again from an empty history; ``evictions`` counts them). On
input sorted by key (every row of a key in one run), as ``etl preprocess`` gives it, the key evicted is one whose
rows are all done, so any ``max_keys`` gives the exact histories.

Memory: ``8 * (1 + columns) * 2 * max_len`` bytes per key kept, plus ~80 bytes of bookkeeping per key (the
tables grow with the keys seen, up to ``max_keys``).

As a streaming state (``etl.ops.stream``): ``advance`` gives per listed column ``{prefix}{c}`` (the ``spec.outputs``
but the last): the rows' histories one after the other (the first row's values, then the second's...: a list column
whose lengths are the last output), and ``{prefix}len`` (the last output, int32: each row's history length). The state exports as one table
of its entries (``key`` uint64, ``last`` int64: the rows clock when the key was last seen, the same on each of
its entries; ``time`` int64; one int64 array per listed column, named ``value.{c}``), each key's entries in time
order, canonically by key ascending; scalars ``rows`` (the rows clock: rows taken so far) and ``evictions``. Its
undo record of a batch holds, for each key the batch touched or evicted, the key's entries as they were before
(or that it was absent), so that the state before a few batches is the state now with their records laid over it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numba as nb
import numpy as np

from etl.ops.base import InvalidState
from etl.ops.stream import Carried, StateArrays, StreamSpec, StreamState, StreamStep

_jit = nb.njit(nogil=True, cache=True)

#: Indices into the state's ``meta`` array.
_USED, _LRU_HEAD, _LRU_TAIL, _CLOCK, _EVICTIONS, _BATCH, _OUT, _RECORDS, _RECORD_ENTRIES = range(9)
#: Why the kernel stopped before the end of the batch.
_DONE, _NEED_SLOTS, _NEED_OUT, _NEED_RECORDS, _LATE = range(5)
#: Fields of an undo record's head row: key bits, present (0/1), last, entries, first entry in the record buffers.
_R_KEY, _R_PRESENT, _R_LAST, _R_N, _R_START = range(5)
#: Keys the tables hold at first (they double as keys come, up to ``max_keys``).
_FIRST_SLOTS = 1024


class LateRow(ValueError):
    """A row's time is before its key's latest row (``row``: its index in the batch)."""

    def __init__(self, row: int):
        self.row = row
        super().__init__(f"row {row} of the batch is older than its key's latest row: a history takes each key's rows in time order")


@dataclass(frozen=True)
class HistoryUndo:
    """What one ``advance`` changed: the rows clock and evictions before it, and per key it touched or evicted, in
    the order they were recorded, the key's entries before (``heads``: key bits, present, last, entries, start;
    ``times`` and ``values`` [entries, columns] hold the entries)."""

    rows: int
    evictions: int
    heads: np.ndarray
    times: np.ndarray
    values: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.heads.nbytes + self.times.nbytes + self.values.nbytes)


@_jit
def _find(table, keys, key):
    """The index of ``table`` holding ``key``'s slot, or of the empty place where it would go."""
    mask = len(table) - 1
    i = np.int64(key & np.uint64(mask))
    while True:
        s = table[i] - 1
        if s < 0 or keys[s] == key:
            return i
        i = (i + 1) & mask


@_jit
def _delete(table, keys, i):
    """Remove the entry at index ``i`` of ``table`` (linear probing with backward-shift deletion)."""
    mask = len(table) - 1
    j = i
    while True:
        j = (j + 1) & mask
        s = table[j] - 1
        if s < 0:
            break
        home = np.int64(keys[s] & np.uint64(mask))
        stays = (i < home <= j) if i <= j else (home <= j or home > i)
        if not stays:
            table[i] = table[j]
            i = j
    table[i] = 0


@_jit
def _unlink(s, prev, nxt, meta):
    p, n = prev[s], nxt[s]
    if p >= 0:
        nxt[p] = n
    else:
        meta[_LRU_HEAD] = n
    if n >= 0:
        prev[n] = p
    else:
        meta[_LRU_TAIL] = p


@_jit
def _append(s, prev, nxt, meta):
    t = meta[_LRU_TAIL]
    prev[s] = t
    nxt[s] = -1
    if t >= 0:
        nxt[t] = s
    else:
        meta[_LRU_HEAD] = s
    meta[_LRU_TAIL] = s


@_jit
def _record(s, present, keys, last, count, head, times, vals, rec_heads, rec_times, rec_vals, meta):
    """Log slot ``s``'s key as it is now (``present`` 0: log that it is absent)."""
    r = meta[_RECORDS]
    start = meta[_RECORD_ENTRIES]
    n = count[s] if present else 0
    w = times.shape[1]
    rec_heads[r, _R_KEY] = np.int64(keys[s])
    rec_heads[r, _R_PRESENT] = present
    rec_heads[r, _R_LAST] = last[s] if present else -1
    rec_heads[r, _R_N] = n
    rec_heads[r, _R_START] = start
    for j in range(n):
        idx = (head[s] + j) % w
        rec_times[start + j] = times[s, idx]
        for c in range(vals.shape[2]):
            rec_vals[start + j, c] = vals[s, idx, c]
    meta[_RECORDS] = r + 1
    meta[_RECORD_ENTRIES] = start + n


@_jit
def _advance(in_keys, in_times, in_vals, start, max_len, ttl, max_keys, keys, last, count, settled, head, logged, prev, nxt,
             times, vals, table, meta, out_len, out_vals, record, rec_heads, rec_times, rec_vals):  # fmt: skip
    """Take rows ``start..`` of the batch; returns (the row it stopped at, why: ``_DONE`` at the end of the batch,
    or the buffer to grow, or ``_LATE``). Stops before changing anything for the row it stops at."""
    w = times.shape[1]
    ncols = vals.shape[2]
    for r in range(start, len(in_keys)):
        k = in_keys[r]
        t = in_times[r]
        i = _find(table, keys, k)
        s = table[i] - 1
        if s >= 0 and count[s] > 0 and t < times[s, (head[s] + count[s] - 1) % w]:
            return r, _LATE
        if meta[_OUT] + max_len > len(out_vals):
            return r, _NEED_OUT
        if record and (meta[_RECORDS] + 2 > len(rec_heads) or meta[_RECORD_ENTRIES] + w > len(rec_times)):
            return r, _NEED_RECORDS
        if s < 0:
            if meta[_USED] < len(keys):
                s = meta[_USED]
                meta[_USED] += 1
            elif meta[_USED] < max_keys:
                return r, _NEED_SLOTS
            else:  # evict the key seen least recently
                s = meta[_LRU_HEAD]
                if record and logged[s] != meta[_BATCH]:
                    _record(s, 1, keys, last, count, head, times, vals, rec_heads, rec_times, rec_vals, meta)
                _unlink(s, prev, nxt, meta)
                _delete(table, keys, _find(table, keys, keys[s]))
                meta[_EVICTIONS] += 1
                i = _find(table, keys, k)
            keys[s] = k
            count[s] = 0
            settled[s] = 0
            head[s] = 0
            table[i] = s + 1
            if record:  # undoing this batch removes the key (its earlier records, if any, bring back what it had)
                _record(s, 0, keys, last, count, head, times, vals, rec_heads, rec_times, rec_vals, meta)
            logged[s] = meta[_BATCH]
        else:
            if record and logged[s] != meta[_BATCH]:
                _record(s, 1, keys, last, count, head, times, vals, rec_heads, rec_times, rec_vals, meta)
                logged[s] = meta[_BATCH]
            _unlink(s, prev, nxt, meta)
        _append(s, prev, nxt, meta)
        last[s] = meta[_CLOCK]
        meta[_CLOCK] += 1
        n = count[s]
        h = head[s]
        if n > 0 and t > times[s, (h + n - 1) % w]:  # a later time: every entry is settled, the latest max_len kept
            p = n
            if p > max_len:
                h = (h + p - max_len) % w
                n -= p - max_len
                p = max_len
            settled[s] = p
        p = settled[s]
        first = 0
        if ttl >= 0:
            lower = t - ttl if t >= np.iinfo(np.int64).min + ttl else np.iinfo(np.int64).min
            while first < p and times[s, (h + first) % w] < lower:
                first += 1
        o = meta[_OUT]
        out_len[r] = p - first
        for j in range(first, p):
            idx = (h + j) % w
            for c in range(ncols):
                out_vals[o, c] = vals[s, idx, c]
            o += 1
        meta[_OUT] = o
        if n - p == max_len:  # max_len entries already wait at this time: the oldest of them will never be seen
            for j in range(p - 1, -1, -1):
                a = (h + j) % w
                b = (h + j + 1) % w
                times[s, b] = times[s, a]
                for c in range(ncols):
                    vals[s, b, c] = vals[s, a, c]
            h = (h + 1) % w
            n -= 1
        idx = (h + n) % w
        times[s, idx] = t
        for c in range(ncols):
            vals[s, idx, c] = in_vals[r, c]
        count[s] = n + 1
        head[s] = h
    return len(in_keys), _DONE


@_jit
def _gather(order, count, head, times, vals, keys, last, out_keys, out_last, out_times, out_vals):
    """The entries of the slots ``order``, each slot's in time order, into the ``out_*`` arrays."""
    w = times.shape[1]
    o = 0
    for s in order:
        for j in range(count[s]):
            idx = (head[s] + j) % w
            out_keys[o] = keys[s]
            out_last[o] = last[s]
            out_times[o] = times[s, idx]
            out_vals[o, :] = vals[s, idx, :]
            o += 1


class HistoryState(StreamState):
    """The state of one ``History`` op (see the module docstring). ``columns``: the listed columns, in order."""

    def __init__(self, spec: StreamSpec, key: str, time: str, columns: Sequence[str], max_len: int, ttl: int | None, max_keys: int):
        self.spec = spec
        self.key, self.time, self.columns = key, time, list(columns)
        self.max_len, self.ttl, self.max_keys = max_len, ttl, max_keys
        self._reset(min(max_keys, _FIRST_SLOTS))

    # ------------------------------------------------------------------ tables
    def _reset(self, slots: int) -> None:
        w, c = 2 * self.max_len, len(self.columns)
        self.keys = np.zeros(slots, np.uint64)
        self.last = np.zeros(slots, np.int64)
        self.count = np.zeros(slots, np.int64)
        self.settled = np.zeros(slots, np.int64)
        self.head = np.zeros(slots, np.int64)
        self.logged = np.full(slots, -1, np.int64)
        self.prev = np.full(slots, -1, np.int64)
        self.next = np.full(slots, -1, np.int64)
        self.times = np.zeros((slots, w), np.int64)
        self.vals = np.zeros((slots, w, c), np.int64)
        self.table = np.zeros(_table_size(slots), np.int64)
        self.meta = np.zeros(9, np.int64)
        self.meta[[_LRU_HEAD, _LRU_TAIL]] = -1

    def _grow(self, slots: int) -> None:
        """Room for ``slots`` keys (the slots keep their indices; the hash table is rebuilt)."""
        used = int(self.meta[_USED])
        old = self._slot_arrays()
        meta = self.meta.copy()
        self._reset(slots)
        for new, kept in zip(self._slot_arrays(), old):
            new[:used] = kept[:used]
        self.meta = meta
        _fill_table(self.table, self.keys, used)

    def _slot_arrays(self) -> tuple[np.ndarray, ...]:
        """The arrays of one row per slot."""
        return self.keys, self.last, self.count, self.settled, self.head, self.logged, self.prev, self.next, self.times, self.vals

    @property
    def keys_held(self) -> int:
        """The keys the state holds."""
        return int(self.meta[_USED])

    @property
    def evictions(self) -> int:
        """Keys evicted so far (to make room for new ones)."""
        return int(self.meta[_EVICTIONS])

    # ------------------------------------------------------------------ updates
    def advance(self, inputs: Mapping[str, Carried], record: bool = True) -> StreamStep:
        """Take the rows of one batch in order (``inputs``: the carried key hash, time and listed columns, named as
        ``spec.inputs`` names them; every row valid) and give their histories (see the module docstring).
        ``record``: make the undo record (a run that never goes back, such as ``etl preprocess``, needs none).
        ``LateRow`` for a row older than its key's latest row: the rows before it are taken, not it."""
        names = [i.column for i in self.spec.inputs]
        carried = [inputs[c] for c in names]
        if not all(bool(c.valid.all()) for c in carried):
            raise ValueError("History: every row given to the state needs a key, a time and its values")
        keys = np.ascontiguousarray(carried[0].values, np.uint64)
        times = np.ascontiguousarray(carried[1].values, np.int64)
        n = len(keys)
        vals = np.empty((n, len(self.columns)), np.int64)
        for j, c in enumerate(carried[2:]):
            vals[:, j] = c.values
        out_len = np.zeros(n, np.int32)
        out_vals = np.empty((n * min(self.max_len, 4) + self.max_len, len(self.columns)), np.int64)
        w = 2 * self.max_len
        rec_heads = np.empty((2 * n + 2 if record else 0, 5), np.int64)
        rec_times = np.empty(min(2 * n * w, 4 * n + 2 * w) if record else 0, np.int64)
        rec_vals = np.empty((len(rec_times), len(self.columns)), np.int64)
        rows, evictions = int(self.meta[_CLOCK]), int(self.meta[_EVICTIONS])
        self.meta[[_OUT, _RECORDS, _RECORD_ENTRIES]] = 0
        self.meta[_BATCH] += 1
        ttl = -1 if self.ttl is None else self.ttl
        r = 0
        while True:
            r, why = _advance(keys, times, vals, r, self.max_len, ttl, self.max_keys, self.keys, self.last, self.count, self.settled, self.head,
                              self.logged, self.prev, self.next, self.times, self.vals, self.table, self.meta, out_len, out_vals, record,
                              rec_heads, rec_times, rec_vals)  # fmt: skip
            if why == _DONE:
                break
            if why == _LATE:
                raise LateRow(r)
            if why == _NEED_SLOTS:
                self._grow(min(self.max_keys, 2 * len(self.keys)))
            elif why == _NEED_OUT:
                out_vals = _doubled(out_vals)
            else:
                rec_heads, rec_times, rec_vals = _doubled(rec_heads), _doubled(rec_times), _doubled(rec_vals)
        used = int(self.meta[_OUT])
        outputs: dict[str, np.ndarray] = {name: out_vals[:used, j].copy() for j, name in enumerate(self.spec.outputs[:-1])}
        outputs[self.spec.outputs[-1]] = out_len
        nrec, nent = int(self.meta[_RECORDS]), int(self.meta[_RECORD_ENTRIES])
        undo = HistoryUndo(rows, evictions, rec_heads[:nrec].copy(), rec_times[:nent].copy(), rec_vals[:nent].copy())
        return StreamStep(outputs, None, undo)

    # ------------------------------------------------------------------ export and restore
    def export(self, canonical: bool = True, undo: Sequence[HistoryUndo] = ()) -> StateArrays:
        used = int(self.meta[_USED])
        order = np.arange(used, dtype=np.int64)
        total = int(self.count[:used].sum())
        out_keys = np.empty(total, np.uint64)
        out_last = np.empty(total, np.int64)
        out_times = np.empty(total, np.int64)
        out_vals = np.empty((total, len(self.columns)), np.int64)
        _gather(order, self.count, self.head, self.times, self.vals, self.keys, self.last, out_keys, out_last, out_times, out_vals)
        state = self._arrays(out_keys, out_last, out_times, out_vals, int(self.meta[_CLOCK]), int(self.meta[_EVICTIONS]))
        if undo:
            state = _undone(state, list(undo), self.columns)
        return self.canonical(state) if canonical or undo else state

    def _arrays(self, keys: np.ndarray, last: np.ndarray, times: np.ndarray, vals: np.ndarray, rows: int, evictions: int) -> StateArrays:
        state: StateArrays = {"rows": rows, "evictions": evictions, "key": keys, "last": last, "time": times}
        for j, c in enumerate(self.columns):
            state[value_array(c)] = np.ascontiguousarray(vals[:, j])
        return state

    def canonical(self, state: StateArrays) -> StateArrays:
        keys = np.asarray(state["key"])
        order = np.argsort(keys, kind="stable")  # stable: each key's entries stay in time order
        return {k: (v[order] if isinstance(v, np.ndarray) else v) for k, v in state.items()}

    def check(self, state: StateArrays) -> None:
        rows, evictions = state["rows"], state["evictions"]
        if not isinstance(rows, int) or not isinstance(evictions, int) or rows < 0 or evictions < 0:
            raise InvalidState(f"history: rows {rows!r} and evictions {evictions!r} must be integers >= 0")
        arrays = [np.asarray(state[name]) for name in ("key", "last", "time", *map(value_array, self.columns))]
        if len({len(a) for a in arrays}) > 1:
            raise InvalidState("history: the state's arrays differ in length")
        keys, last, times = arrays[0], arrays[1], arrays[2]
        if not len(keys):
            return
        runs = 1 + int(np.count_nonzero(keys[1:] != keys[:-1]))
        order = np.argsort(keys, kind="stable")  # stable: each key's entries stay in their order
        keys, last, times = keys[order], last[order], times[order]
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        if runs != len(starts):
            raise InvalidState("history: a key's entries are not together")
        if len(starts) > self.max_keys:
            raise InvalidState(f"history: {len(starts)} keys, more than max_keys {self.max_keys}")
        ends = np.r_[starts[1:], len(keys)]
        same_key = np.repeat(np.arange(len(starts)), ends - starts)
        if np.any(last != last[starts][same_key]):
            raise InvalidState("history: a key's entries differ in 'last'")
        key_last = last[starts]
        if np.any(key_last < 0) or np.any(key_last >= rows) or len(np.unique(key_last)) != len(key_last):
            raise InvalidState(f"history: 'last' rows not distinct or not before the rows clock {rows}")
        if np.any((times[1:] < times[:-1]) & (same_key[1:] == same_key[:-1])):
            raise InvalidState("history: a key's entries are not in time order")
        latest = times[ends - 1][same_key]
        pending = np.bincount(same_key, weights=times == latest, minlength=len(starts))
        settled = (ends - starts) - pending
        if np.any(pending > self.max_len) or np.any(settled > self.max_len):
            raise InvalidState(f"history: a key holds more than max_len {self.max_len} settled or pending entries")

    def restore(self, state: StateArrays) -> None:
        self.check(state)
        keys = np.asarray(state["key"], np.uint64)
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
        last = np.asarray(state["last"], np.int64)[order]
        times = np.asarray(state["time"], np.int64)[order]
        vals = np.empty((len(keys), len(self.columns)), np.int64)
        for j, c in enumerate(self.columns):
            vals[:, j] = np.asarray(state[value_array(c)], np.int64)[order]
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else np.zeros(0, np.int64)
        ends = np.r_[starts[1:], len(keys)].astype(np.int64)
        by_last = starts[np.argsort(last[starts], kind="stable")]  # slots in the order keys were last seen
        slots = max(min(self.max_keys, _FIRST_SLOTS), len(starts))
        self._reset(slots)
        _load(by_last, ends[np.searchsorted(starts, by_last)], keys, last, times, vals, self.keys, self.last, self.count, self.settled,
              self.prev, self.next, self.times, self.vals, self.table, self.meta)  # fmt: skip
        self.meta[_CLOCK] = int(state["rows"])
        self.meta[_EVICTIONS] = int(state["evictions"])


def value_array(column: str) -> str:
    """The name of the state array holding the values of listed column ``column``."""
    return f"value.{column}"


def _table_size(slots: int) -> int:
    """A power of two at least twice ``slots``."""
    return 1 << max(4, (2 * slots - 1).bit_length())


def _doubled(a: np.ndarray) -> np.ndarray:
    out = np.empty((2 * len(a) + 16, *a.shape[1:]), a.dtype)
    out[: len(a)] = a
    return out


@_jit
def _fill_table(table, keys, used):
    for s in range(used):
        table[_find(table, keys, keys[s])] = s + 1


@_jit
def _load(firsts, ends, in_keys, in_last, in_times, in_vals, keys, last, count, settled, prev, nxt, times, vals, table, meta):
    """Fill empty tables with the keys starting at ``firsts`` (in the order they were last seen; their entries end
    at ``ends``)."""
    for s in range(len(firsts)):
        a, b = firsts[s], ends[s]
        keys[s] = in_keys[a]
        last[s] = in_last[a]
        count[s] = b - a
        latest = in_times[b - 1]
        p = 0
        for j in range(a, b):
            times[s, j - a] = in_times[j]
            vals[s, j - a, :] = in_vals[j, :]
            if in_times[j] < latest:
                p += 1
        settled[s] = p
        table[_find(table, keys, keys[s])] = s + 1
        _append(s, prev, nxt, meta)
    meta[_USED] = len(firsts)


def _undone(state: StateArrays, undo: list[HistoryUndo], columns: list[str]) -> StateArrays:
    """``state`` with the undo records ``undo`` (newest first) laid over it: each key a record names takes what its
    oldest record says it was (present with its entries, or absent)."""
    records = undo[::-1]  # oldest first; within a record, in the order logged
    heads = np.concatenate([u.heads for u in records])
    offsets = np.cumsum([0] + [len(u.times) for u in records[:-1]])
    starts = np.concatenate([u.heads[:, _R_START] + o for u, o in zip(records, offsets)])
    times = np.concatenate([u.times for u in records])
    vals = np.concatenate([u.values for u in records])
    keys = heads[:, _R_KEY].view(np.uint64)
    named, first = np.unique(keys, return_index=True)  # each key's oldest record
    state_keys = np.asarray(state["key"])
    kept = ~np.isin(state_keys, named)
    present = first[heads[first, _R_PRESENT] == 1]
    counts = heads[present, _R_N]
    take = np.repeat(starts[present] - np.r_[0, np.cumsum(counts)[:-1]], counts) + np.arange(int(counts.sum()))
    out: StateArrays = {"rows": records[0].rows, "evictions": records[0].evictions}
    out["key"] = np.concatenate([state_keys[kept], np.repeat(keys[present], counts)])
    out["last"] = np.concatenate([np.asarray(state["last"])[kept], np.repeat(heads[present, _R_LAST], counts)])
    out["time"] = np.concatenate([np.asarray(state["time"])[kept], times[take]])
    for j, c in enumerate(columns):
        out[value_array(c)] = np.concatenate([np.asarray(state[value_array(c)])[kept], vals[take, j]])
    return out
