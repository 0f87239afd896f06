"""The per-key state of ``History`` (``etl.ops.history``): each key's latest events, updated row by row.

``HistoryState(spec, key, time, columns, max_len, ttl, max_keys)`` takes rows in order, each a key (uint64: the
key's hash, ``History.key_hashes``), a time (int64) and the values of the listed columns (int64), and gives each row
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

As a streaming state (``etl.ops.stream``): ``advance`` gives per listed column ``{prefix}{c}`` (the
``spec.outputs`` but the last): the rows' histories one after the other (the first row's values, then the
second's...: a list column whose lengths are the last output), and ``{prefix}len`` (the last output, int32: each
row's history length). The tables and the per-row loop are numba kernels (``etl.ops.history_kernels``). The state
exports as one table of its entries (``key`` uint64, ``last`` int64: the rows clock when the key was last seen, the same on each of
its entries; ``time`` int64; one int64 array per listed column, named ``value.{c}``), each key's entries in time
order, canonically by key ascending; scalars ``rows`` (the rows clock: rows taken so far) and ``evictions``. Its
undo record of a batch holds, for each key the batch touched or evicted, the key's entries as they were before
(or that it was absent), so that the state before a few batches is the state now with their records laid over it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from etl.ops.base import InvalidState
from etl.ops.history_kernels import (
    BATCH,
    CLOCK,
    DONE,
    EVICTIONS,
    LATE,
    LRU_HEAD,
    LRU_TAIL,
    NEED_OUT,
    NEED_SLOTS,
    OUT,
    R_KEY,
    R_LAST,
    R_N,
    R_PRESENT,
    R_START,
    RECORD_ENTRIES,
    RECORDS,
    USED,
    advance_rows,
    fill_table,
    gather_entries,
    load_slots,
)
from etl.ops.stream import Carried, RowRejected, StateArrays, StreamSpec, StreamState, StreamStep

#: Keys the tables hold at first (they double as keys come, up to ``max_keys``).
_FIRST_SLOTS = 1024
#: Entries per row the output buffer of a first batch has room for.
_FIRST_PER_ROW = 4


class LateRow(RowRejected):
    """A row's time is before its key's latest row by more than the allowed lateness (``row``: its index in the
    batch; ``column``: the time column)."""

    def __init__(self, row: int, column: str, lateness: int):
        beyond = f"by more than allowed_lateness {lateness}" if lateness else "(allowed_lateness 0)"
        super().__init__(row, column, f"the time is before its key's latest event {beyond}: a streaming history takes each key's rows in time order")


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


class HistoryState(StreamState):
    """The state of one ``History`` op (see the module docstring). ``columns``: the listed columns, in order."""

    def __init__(self, spec: StreamSpec, key: str, time: str, columns: Sequence[str], max_len: int, ttl: int | None, max_keys: int,
                 lateness: int = 0):  # fmt: skip
        self.spec = spec
        self.key, self.time, self.columns = key, time, list(columns)
        self.max_len, self.ttl, self.max_keys, self.lateness = max_len, ttl, max_keys, lateness
        self._reset(min(max_keys, _FIRST_SLOTS))
        self._per_row = min(max_len, _FIRST_PER_ROW)  # output room per row: grows to 5/4 of the most a batch needed

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
        self.meta[[LRU_HEAD, LRU_TAIL]] = -1

    def _grow(self, slots: int) -> None:
        """Room for ``slots`` keys (the slots keep their indices; the hash table is rebuilt)."""
        used = int(self.meta[USED])
        old = self._slot_arrays()
        meta = self.meta.copy()
        self._reset(slots)
        for new, kept in zip(self._slot_arrays(), old):
            new[:used] = kept[:used]
        self.meta = meta
        fill_table(self.table, self.keys, used)

    def _slot_arrays(self) -> tuple[np.ndarray, ...]:
        """The arrays of one row per slot."""
        return self.keys, self.last, self.count, self.settled, self.head, self.logged, self.prev, self.next, self.times, self.vals

    @property
    def keys_held(self) -> int:
        """The keys the state holds."""
        return int(self.meta[USED])

    @property
    def evictions(self) -> int:
        """Keys evicted so far (to make room for new ones)."""
        return int(self.meta[EVICTIONS])

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
        out_vals = np.empty((len(self.columns), n * self._per_row + self.max_len), np.int64)
        w = 2 * self.max_len
        rec_heads = np.empty((2 * n + 2 if record else 0, 5), np.int64)
        rec_times = np.empty(min(2 * n * w, 4 * n + 2 * w) if record else 0, np.int64)
        rec_vals = np.empty((len(rec_times), len(self.columns)), np.int64)
        rows, evictions = int(self.meta[CLOCK]), int(self.meta[EVICTIONS])
        self.meta[[OUT, RECORDS, RECORD_ENTRIES]] = 0
        self.meta[BATCH] += 1
        ttl = -1 if self.ttl is None else self.ttl
        r = 0
        while True:
            r, why = advance_rows(keys, times, vals, r, self.max_len, ttl, self.lateness, self.max_keys, self.keys, self.last, self.count,
                                  self.settled, self.head, self.logged, self.prev, self.next, self.times, self.vals, self.table, self.meta,
                                  out_len, out_vals, record, rec_heads, rec_times, rec_vals)  # fmt: skip
            if why == DONE:
                break
            if why == LATE:
                raise LateRow(r, self.time, self.lateness)
            if why == NEED_SLOTS:
                self._grow(min(self.max_keys, 2 * len(self.keys)))
            elif why == NEED_OUT:
                out_vals = _doubled(out_vals, axis=1)
            else:
                rec_heads, rec_times, rec_vals = _doubled(rec_heads), _doubled(rec_times), _doubled(rec_vals)
        used = int(self.meta[OUT])
        self._per_row = min(self.max_len, max(self._per_row, -(-used * 5 // (4 * max(n, 1)))))
        outputs: dict[str, np.ndarray] = {name: out_vals[j, :used] for j, name in enumerate(self.spec.outputs[:-1])}
        outputs[self.spec.outputs[-1]] = out_len
        nrec, nent = int(self.meta[RECORDS]), int(self.meta[RECORD_ENTRIES])
        undo = HistoryUndo(rows, evictions, rec_heads[:nrec].copy(), rec_times[:nent].copy(), rec_vals[:nent].copy())
        return StreamStep(outputs, None, undo, self.evictions - evictions)

    # ------------------------------------------------------------------ export and restore
    def export(self, canonical: bool = True, undo: Sequence[HistoryUndo] = ()) -> StateArrays:
        used = int(self.meta[USED])
        order = np.arange(used, dtype=np.int64)
        total = int(self.count[:used].sum())
        out_keys = np.empty(total, np.uint64)
        out_last = np.empty(total, np.int64)
        out_times = np.empty(total, np.int64)
        out_vals = np.empty((total, len(self.columns)), np.int64)
        gather_entries(order, self.count, self.head, self.times, self.vals, self.keys, self.last, out_keys, out_last, out_times, out_vals)
        state = self._arrays(out_keys, out_last, out_times, out_vals, int(self.meta[CLOCK]), int(self.meta[EVICTIONS]))
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
        load_slots(by_last, ends[np.searchsorted(starts, by_last)], keys, last, times, vals, self.keys, self.last, self.count, self.settled,
              self.prev, self.next, self.times, self.vals, self.table, self.meta)  # fmt: skip
        self.meta[CLOCK] = int(state["rows"])
        self.meta[EVICTIONS] = int(state["evictions"])


def value_array(column: str) -> str:
    """The name of the state array holding the values of listed column ``column``."""
    return f"value.{column}"


def _table_size(slots: int) -> int:
    """A power of two at least twice ``slots``."""
    return 1 << max(4, (2 * slots - 1).bit_length())


def _doubled(a: np.ndarray, axis: int = 0) -> np.ndarray:
    """``a`` in a new array twice as long (and 16 more) along ``axis``, the rest uninitialised."""
    shape = list(a.shape)
    shape[axis] = 2 * shape[axis] + 16
    out = np.empty(shape, a.dtype)
    out[tuple(slice(0, n) for n in a.shape)] = a
    return out


def _undone(state: StateArrays, undo: list[HistoryUndo], columns: list[str]) -> StateArrays:
    """``state`` with the undo records ``undo`` (newest first) laid over it: each key a record names takes what its
    oldest record says it was (present with its entries, or absent)."""
    records = undo[::-1]  # oldest first; within a record, in the order logged
    heads = np.concatenate([u.heads for u in records])
    offsets = np.cumsum([0] + [len(u.times) for u in records[:-1]])
    starts = np.concatenate([u.heads[:, R_START] + o for u, o in zip(records, offsets)])
    times = np.concatenate([u.times for u in records])
    vals = np.concatenate([u.values for u in records])
    keys = heads[:, R_KEY].view(np.uint64)
    named, first = np.unique(keys, return_index=True)  # each key's oldest record
    state_keys = np.asarray(state["key"])
    kept = ~np.isin(state_keys, named)
    present = first[heads[first, R_PRESENT] == 1]
    counts = heads[present, R_N]
    take = np.repeat(starts[present] - np.r_[0, np.cumsum(counts)[:-1]], counts) + np.arange(int(counts.sum()))
    out: StateArrays = {"rows": records[0].rows, "evictions": records[0].evictions}
    out["key"] = np.concatenate([state_keys[kept], np.repeat(keys[present], counts)])
    out["last"] = np.concatenate([np.asarray(state["last"])[kept], np.repeat(heads[present, R_LAST], counts)])
    out["time"] = np.concatenate([np.asarray(state["time"])[kept], times[take]])
    for j, c in enumerate(columns):
        out[value_array(c)] = np.concatenate([np.asarray(state[value_array(c)])[kept], vals[take, j]])
    return out
