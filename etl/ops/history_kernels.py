"""The numba kernels of History's per-key state (``etl.ops.history_state``, which documents what they keep).

The state is a set of slots, one per key kept: its key, the rows clock when it was last seen (``last``), its entries
in a ring of ``2 * max_len`` (``count`` of them from ``head``; the first ``settled`` ones are before the key's
latest time), its place in a doubly linked list of the slots by last sighting (``prev``/``next``: least recently
seen first) and the batch whose undo record already holds it (``logged``); a hash table (linear probing,
backward-shift deletion) maps keys to slots; ``meta`` holds the counters (indices below). ``advance_rows`` takes a
batch's rows from a given row and stops, before changing anything for the row, when a buffer must grow or a row is
late, so that the caller grows it and goes on.
"""

from __future__ import annotations

import numba as nb
import numpy as np

_jit = nb.njit(nogil=True, cache=True)


#: Indices into the state's ``meta`` array.
USED, LRU_HEAD, LRU_TAIL, CLOCK, EVICTIONS, BATCH, OUT, RECORDS, RECORD_ENTRIES = range(9)
#: Why the kernel stopped before the end of the batch.
DONE, NEED_SLOTS, NEED_OUT, NEED_RECORDS, LATE = range(5)
#: Fields of an undo record's head row: key bits, present (0/1), last, entries, first entry in the record buffers.
R_KEY, R_PRESENT, R_LAST, R_N, R_START = range(5)


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
        meta[LRU_HEAD] = n
    if n >= 0:
        prev[n] = p
    else:
        meta[LRU_TAIL] = p


@_jit
def _append(s, prev, nxt, meta):
    t = meta[LRU_TAIL]
    prev[s] = t
    nxt[s] = -1
    if t >= 0:
        nxt[t] = s
    else:
        meta[LRU_HEAD] = s
    meta[LRU_TAIL] = s


@_jit
def _record(s, present, keys, last, count, head, times, vals, rec_heads, rec_times, rec_vals, meta):
    """Log slot ``s``'s key as it is now (``present`` 0: log that it is absent)."""
    r = meta[RECORDS]
    start = meta[RECORD_ENTRIES]
    n = count[s] if present else 0
    w = times.shape[1]
    rec_heads[r, R_KEY] = np.int64(keys[s])
    rec_heads[r, R_PRESENT] = present
    rec_heads[r, R_LAST] = last[s] if present else -1
    rec_heads[r, R_N] = n
    rec_heads[r, R_START] = start
    for j in range(n):
        idx = (head[s] + j) % w
        rec_times[start + j] = times[s, idx]
        for c in range(vals.shape[2]):
            rec_vals[start + j, c] = vals[s, idx, c]
    meta[RECORDS] = r + 1
    meta[RECORD_ENTRIES] = start + n


@_jit
def _first_within_ttl(times, s, h, upto, t, ttl):
    """The first of slot ``s``'s first ``upto`` entries (from its head ``h``) within ``ttl`` of time ``t``: not
    older than ``t - ttl`` (``upto`` when none is; 0 without a ttl, ``ttl`` < 0)."""
    first = 0
    if ttl >= 0:
        lower = t - ttl if t >= np.iinfo(np.int64).min + ttl else np.iinfo(np.int64).min
        w = times.shape[1]
        while first < upto and times[s, (h + first) % w] < lower:
            first += 1
    return first


@_jit
def _emit(s, h, first, end, vals, out_vals, meta):
    """Append the values of slot ``s``'s entries ``first`` to ``end`` (from its head ``h``) to ``out_vals`` (one
    row per listed column) at ``meta[OUT]``, which moves past them."""
    w = vals.shape[1]
    o = meta[OUT]
    idx = h + first  # both below w
    if idx >= w:
        idx -= w
    for _ in range(first, end):
        for c in range(vals.shape[2]):
            out_vals[c, o] = vals[s, idx, c]
        o += 1
        idx += 1
        if idx == w:
            idx = 0
    meta[OUT] = o


@_jit
def advance_rows(in_keys, in_times, in_vals, start, max_len, ttl, lateness, max_keys, keys, last, count, settled, head, logged, prev,
             nxt, times, vals, table, meta, out_len, out_vals, record, rec_heads, rec_times, rec_vals):  # fmt: skip
    """Take rows ``start..`` of the batch; returns (the row it stopped at, why: ``DONE`` at the end of the batch,
    or the buffer to grow, or ``LATE``: a row older than its key's latest time by more than ``lateness``). Stops
    before changing anything for the row it stops at. A row older than its key's latest time by at most
    ``lateness`` is taken by ``_take_late``."""
    w = times.shape[1]
    ncols = vals.shape[2]
    for r in range(start, len(in_keys)):
        k = in_keys[r]
        t = in_times[r]
        i = _find(table, keys, k)
        s = table[i] - 1
        late = s >= 0 and count[s] > 0 and t < times[s, (head[s] + count[s] - 1) % w]
        if late and times[s, (head[s] + count[s] - 1) % w] - t > lateness:  # no overflow: both are int64, t is smaller
            return r, LATE
        if meta[OUT] + max_len > out_vals.shape[1]:
            return r, NEED_OUT
        if record and (meta[RECORDS] + 2 > len(rec_heads) or meta[RECORD_ENTRIES] + w > len(rec_times)):
            return r, NEED_RECORDS
        if s < 0:
            if meta[USED] < len(keys):
                s = meta[USED]
                meta[USED] += 1
            elif meta[USED] < max_keys:
                return r, NEED_SLOTS
            else:  # evict the key seen least recently
                s = meta[LRU_HEAD]
                if record and logged[s] != meta[BATCH]:
                    _record(s, 1, keys, last, count, head, times, vals, rec_heads, rec_times, rec_vals, meta)
                _unlink(s, prev, nxt, meta)
                _delete(table, keys, _find(table, keys, keys[s]))
                meta[EVICTIONS] += 1
                i = _find(table, keys, k)
            keys[s] = k
            count[s] = 0
            settled[s] = 0
            head[s] = 0
            table[i] = s + 1
            if record:  # undoing this batch removes the key (its earlier records, if any, bring back what it had)
                _record(s, 0, keys, last, count, head, times, vals, rec_heads, rec_times, rec_vals, meta)
            logged[s] = meta[BATCH]
        else:
            if record and logged[s] != meta[BATCH]:
                _record(s, 1, keys, last, count, head, times, vals, rec_heads, rec_times, rec_vals, meta)
                logged[s] = meta[BATCH]
            _unlink(s, prev, nxt, meta)
        _append(s, prev, nxt, meta)
        last[s] = meta[CLOCK]
        meta[CLOCK] += 1
        if late:
            out_len[r] = _take_late(s, t, in_vals[r], max_len, ttl, count, settled, head, times, vals, out_vals, meta)
            continue
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
        first = _first_within_ttl(times, s, h, p, t, ttl)
        out_len[r] = p - first
        _emit(s, h, first, p, vals, out_vals, meta)
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
    return len(in_keys), DONE


@_jit
def _take_late(s, t, row_vals, max_len, ttl, count, settled, head, times, vals, out_vals, meta):
    """A row of slot ``s`` at time ``t`` before the key's latest time: its history is the settled entries strictly
    before ``t`` (within ``ttl``), the latest ``max_len`` the slot holds; its entry joins the settled ones at its
    place in time order (after those at the same time), the oldest settled entry dropped beyond ``max_len`` (the
    row's own entry, when it is older than ``max_len`` settled ones). Returns the history's length."""
    w = times.shape[1]
    ncols = vals.shape[2]
    h, n, p = head[s], count[s], settled[s]
    before = 0  # settled entries strictly before t
    while before < p and times[s, (h + before) % w] < t:
        before += 1
    upto = before  # settled entries at or before t: the new entry goes after them
    while upto < p and times[s, (h + upto) % w] == t:
        upto += 1
    first = _first_within_ttl(times, s, h, before, t, ttl)
    _emit(s, h, first, before, vals, out_vals, meta)
    if p == max_len:
        if upto == 0:  # older than every settled entry kept: no later row's latest max_len holds it
            return before - first
        for j in range(1, upto):  # drop the oldest settled entry, shift the earlier ones down
            a = (h + j) % w
            b = (h + j - 1) % w
            times[s, b] = times[s, a]
            for c in range(ncols):
                vals[s, b, c] = vals[s, a, c]
        at = (h + upto - 1) % w
    else:
        for j in range(n - 1, upto - 1, -1):  # make room at upto: the later entries move up one
            a = (h + j) % w
            b = (h + j + 1) % w
            times[s, b] = times[s, a]
            for c in range(ncols):
                vals[s, b, c] = vals[s, a, c]
        at = (h + upto) % w
        count[s] = n + 1
        settled[s] = p + 1
    times[s, at] = t
    for c in range(ncols):
        vals[s, at, c] = row_vals[c]
    return before - first


@_jit
def gather_entries(order, count, head, times, vals, keys, last, out_keys, out_last, out_times, out_vals):
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



@_jit
def fill_table(table, keys, used):
    for s in range(used):
        table[_find(table, keys, keys[s])] = s + 1


@_jit
def load_slots(firsts, ends, in_keys, in_last, in_times, in_vals, keys, last, count, settled, prev, nxt, times, vals, table, meta):
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
    meta[USED] = len(firsts)

