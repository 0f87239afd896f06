"""Synthetic behaviour events: ``etl generate`` of a schema with a ``generate.events`` section (``EventsSpec``).

The rows are one stream of events, written in the order an event log receives them, cut into ``files`` shards of
consecutive rows. The stream is a pure function of (seed, schema, rows): the same arguments give the same bytes,
and the rows do not depend on the number of files (the shards of a 1-file and a 4-file run hold the same rows in
the same order).

How the stream is made:

* Users ``0 .. users-1`` start at times spread uniformly over a span chosen so that, by the last row, most users
  have started; user ``u``'s events are a pure function of ``(seed, u, its event number)``, independent of the
  other users. Events come in sessions: a session has a geometric number of events (mean ``session_events``);
  within a session, the time to the next event is log-normal (``event_gap``), or 0 with probability ``ties`` (events
  at the same time); between sessions it is log-normal (``session_gap``) times the user's activity, a log-normal
  factor (sigma 1) drawn once per user, so that some users are much more active than others. Gaps are whole time
  units, at least 1 (except ties).
* Items: the first event of a session, and others with probability ``1 - follow``, draw the item's popularity rank
  from a Zipf law ``P(r) ∝ (r+1)^-item_skew`` over ``items`` items; with probability ``follow`` an event in a session
  takes one of the two ranks after the previous event's (a series, a related item): a next-item signal that
  sequence models can learn. A category (``categories`` of them) is a fixed function of the item.
* The log: the users' events are merged in time order (ties by user number). An event is late with probability
  ``late``: it is held back by ``d`` in [1, ``lateness``] time units and written after the events up to its time
  plus ``d`` (before any on-time event of that time). So a row's time is never more than ``lateness`` below the
  largest time written before it, and a late row may be older than its own user's previous rows. The rows that
  are still held back after the last row are not written.
* Keys: user, item and category numbers become keys through the bijective permutation of ``etl.tools.synth`` (so
  they are scattered) and are written in the column's encoding; a session is ``user · 2**32 + session number``
  (int64). The schema's other columns are generated as by ``etl.tools.synth``, from the row's position in the
  stream.

Memory: a few numbers per user, plus the late events held back (about ``late · lateness`` times the event rate).
The stream is made by one thread; the shards are written one after the other.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numba as nb
import numpy as np
import pyarrow as pa

from etl.errors import SpecError
from etl.io.fs import Location
from etl.io.text import ROW_GROUP_ROWS, ShardSetWriter, raw_arrow_schema
from etl.schema import ColumnSpec, EventsSpec, Schema
from etl.tools.draws import encode_keys, key_bits, key_space, normal, pareto_consts, permute, stream_key, substream, unif, zipf_rank

__all__ = ["generate_events", "default_users", "default_items"]

#: log-normal sigma of the per-user activity factor of the session gaps
_ACTIVITY_SIGMA = 1.0
#: uniform draws per event of a user (purposes below), so event k of user u uses counters k·_DRAWS + purpose
_DRAWS = 8
_FOLLOW, _NEXT, _ITEM, _TIE, _GAP, _LATE, _DELAY = 0, 1, 2, 3, 4, 6, 7  # _GAP takes two draws (4, 5)
# per-user state columns
_EVENTS, _SESSION, _POS, _LEN, _PREV = 0, 1, 2, 3, 4
# held-back (late) event columns: the heap's order (written at, sequence) then the row
_AT, _SEQ, _USER, _RANK, _TIME, _SESS = 0, 1, 2, 3, 4, 5
# the stream's keys: stream_key(seed, _STREAMS, purpose), apart from the per-column keys stream_key(seed, column index)
_STREAMS = 1 << 40
_USERS, _SESSIONS, _STARTS, _ACTIVITY, _CATEGORIES = 1, 2, 3, 4, 5


class _Shape(NamedTuple):
    """The stream's numbers, as the kernel reads them."""

    user_base: np.uint64  # per-user stream keys derive from it
    session_base: np.uint64
    items: int
    zipf_c: float
    zipf_inv: float
    follow: float
    ties: float
    late: float
    lateness: int
    gap_mu: float
    gap_sigma: float
    session_mu: float
    session_sigma: float
    session_log_q: float  # log(1 - 1/session_events): session lengths are geometric


def default_users(rows: int, max_cardinality: int | None = None) -> int:
    """Users when ``generate.events.users`` is unset: one per 25 rows (at least 1), capped by ``max_cardinality``."""
    return max(1, min(rows // 25, max_cardinality or rows))


def default_items(rows: int, max_cardinality: int | None = None) -> int:
    """Items when ``generate.events.items`` is unset: one per 10 rows (at least 10), capped by ``max_cardinality``."""
    return max(10, min(rows // 10, max_cardinality or rows))


def _span(spec: EventsSpec, rows: int, users: int) -> int:
    """The span of the users' start times: about the time the stream takes to reach ``rows`` events, the users
    arriving at an even pace (their rate r each: rows ≈ users · r · span / 2)."""
    mean_event_gap = (1.0 - spec.ties) * spec.event_gap.median * math.exp(spec.event_gap.sigma**2 / 2)
    mean_session_gap = spec.session_gap.median * math.exp(spec.session_gap.sigma**2 / 2 - _ACTIVITY_SIGMA**2 / 2)
    rate = spec.session_events / ((spec.session_events - 1.0) * mean_event_gap + mean_session_gap)
    return max(1, min(int(2.0 * rows / (users * rate)), 2**52))


# ---------------------------------------------------------------------------------------------------------------------
# numba kernels


@nb.njit(inline="always")
def _draw(ukey, k, purpose):
    return unif(ukey, k * _DRAWS + purpose)


@nb.njit(inline="always")
def _session_length(shape, u, s):
    """Events in session ``s`` of user ``u``: geometric on 1, 2, ... with mean ``session_events``."""
    if shape.session_log_q == 0.0:
        return 1
    key = substream(shape.session_base, u)
    return 1 + np.int64(math.log(unif(key, s)) / shape.session_log_q)


@nb.njit(inline="always")
def _sift_users(ht, hu, i, n):
    """Restore the min-heap of (time, user) below position ``i``."""
    while True:
        m = i
        for c in (2 * i + 1, 2 * i + 2):
            if c < n and (ht[c] < ht[m] or (ht[c] == ht[m] and hu[c] < hu[m])):
                m = c
        if m == i:
            return
        ht[i], ht[m] = ht[m], ht[i]
        hu[i], hu[m] = hu[m], hu[i]
        i = m


@nb.njit(nogil=True, cache=True)
def _start(shape, starts, state, ht, hu):
    """Every user's first session, and the heap of the users by (first event time, user)."""
    n = ht.shape[0]
    for u in range(n):
        state[u, _LEN] = _session_length(shape, u, 0)
        ht[u] = starts[u]
        hu[u] = u
    for i in range(n // 2 - 1, -1, -1):
        _sift_users(ht, hu, i, n)


@nb.njit(inline="always")
def _before(held, a, b):
    return held[a, _AT] < held[b, _AT] or (held[a, _AT] == held[b, _AT] and held[a, _SEQ] < held[b, _SEQ])


@nb.njit(inline="always")
def _swap_rows(held, a, b):
    for j in range(held.shape[1]):
        held[a, j], held[b, j] = held[b, j], held[a, j]


@nb.njit(inline="always")
def _hold(held, n, row):
    """Push ``row`` onto the heap of held-back events ``held[:n]``, ordered by (written at, sequence)."""
    held[n, :] = row
    i = n
    while i > 0 and _before(held, i, (i - 1) // 2):
        _swap_rows(held, i, (i - 1) // 2)
        i = (i - 1) // 2


@nb.njit(inline="always")
def _release(held, n):
    """Pop the first held-back event into ``held[n - 1]`` (the heap is then ``held[:n - 1]``)."""
    _swap_rows(held, 0, n - 1)
    i, n = 0, n - 1
    while True:
        m = i
        for c in (2 * i + 1, 2 * i + 2):
            if c < n and _before(held, c, m):
                m = c
        if m == i:
            return
        _swap_rows(held, i, m)
        i = m


@nb.njit(nogil=True, cache=True)
def _advance(shape, state, activity, ht, hu, held, counters, out):
    """Write the next rows of the stream into ``out`` (columns user, item rank, time, session); return how many.

    Fewer than ``out.shape[0]`` only when ``held`` is full: the caller grows it and calls again. ``counters`` holds
    the number of held-back events and the sequence number of the next event."""
    row = np.empty(6, np.int64)
    produced = 0
    while produced < out.shape[0]:
        n_held = counters[0]
        if n_held > 0 and held[0, _AT] <= ht[0]:
            _release(held, n_held)
            counters[0] = n_held - 1
            out[produced, 0] = held[n_held - 1, _USER]
            out[produced, 1] = held[n_held - 1, _RANK]
            out[produced, 2] = held[n_held - 1, _TIME]
            out[produced, 3] = held[n_held - 1, _SESS]
            produced += 1
            continue
        if n_held == held.shape[0]:
            return produced
        u, t = hu[0], ht[0]
        ukey = substream(shape.user_base, u)
        k = state[u, _EVENTS]
        if state[u, _POS] > 0 and _draw(ukey, k, _FOLLOW) < shape.follow:
            rank = (state[u, _PREV] + 1 + np.int64(_draw(ukey, k, _NEXT) * 2.0)) % shape.items
        else:
            rank = zipf_rank(_draw(ukey, k, _ITEM), shape.items, 0.0, shape.zipf_c, shape.zipf_inv)
        session = (u << 32) | state[u, _SESSION]
        # the user's next event
        state[u, _EVENTS] = k + 1
        state[u, _PREV] = rank
        state[u, _POS] += 1
        z = normal(ukey, (k * _DRAWS + _GAP) // 2)  # from draws k·_DRAWS + 4 and + 5
        if state[u, _POS] < state[u, _LEN]:
            if _draw(ukey, k, _TIE) < shape.ties:
                gap = np.int64(0)
            else:
                gap = max(np.int64(1), np.int64(math.exp(min(shape.gap_mu + shape.gap_sigma * z, 36.0))))
        else:
            state[u, _SESSION] += 1
            state[u, _POS] = 0
            state[u, _LEN] = _session_length(shape, u, state[u, _SESSION])
            log_gap = shape.session_mu + activity[u] + shape.session_sigma * z
            gap = max(np.int64(1), np.int64(math.exp(min(log_gap, 36.0))))
        ht[0] = t + gap
        _sift_users(ht, hu, 0, ht.shape[0])
        seq = counters[1]
        counters[1] = seq + 1
        if _draw(ukey, k, _LATE) < shape.late:
            row[_AT] = t + 1 + np.int64(_draw(ukey, k, _DELAY) * shape.lateness)
            row[_SEQ], row[_USER], row[_RANK], row[_TIME], row[_SESS] = seq, u, rank, t, session
            _hold(held, n_held, row)
            counters[0] = n_held + 1
            continue
        out[produced, 0] = u
        out[produced, 1] = rank
        out[produced, 2] = t
        out[produced, 3] = session
        produced += 1
    return produced


@nb.njit(nogil=True, cache=True)
def _user_starts(key, n, start, span, activity_key, activity_sigma, starts, activity):
    for u in range(n):
        starts[u] = start + np.int64(unif(key, u) * span)
        activity[u] = activity_sigma * normal(activity_key, u)


@nb.njit(nogil=True, cache=True)
def _scatter(numbers, salt, bits, out):
    for i in range(numbers.shape[0]):
        out[i] = permute(numbers[i], salt, bits)


@nb.njit(nogil=True, cache=True)
def _categories(ranks, key, categories, out):
    for i in range(ranks.shape[0]):
        out[i] = np.int64(substream(key, ranks[i]) % np.uint64(categories))


# ---------------------------------------------------------------------------------------------------------------------


class _Stream:
    """The event stream's state; ``take(n)`` gives its next ``n`` rows."""

    def __init__(self, spec: EventsSpec, rows: int, seed: int, users: int, items: int):
        def key(purpose: int) -> np.uint64:
            return np.uint64(stream_key(seed, _STREAMS, purpose))

        zipf_c, zipf_inv = pareto_consts(float(items), spec.item_skew)
        q = 1.0 - 1.0 / spec.session_events
        self.shape = _Shape(
            key(_USERS), key(_SESSIONS), items, zipf_c, zipf_inv, spec.follow, spec.ties, spec.late, spec.lateness,
            math.log(spec.event_gap.median), spec.event_gap.sigma, math.log(spec.session_gap.median), spec.session_gap.sigma,
            math.log(q) if q > 0 else 0.0,
        )
        starts = np.empty(users, np.int64)
        self.activity = np.empty(users, np.float64)
        span = _span(spec, rows, users)
        _user_starts(key(_STARTS), users, spec.start, span, key(_ACTIVITY), _ACTIVITY_SIGMA, starts, self.activity)
        self.state = np.zeros((users, 5), np.int64)
        self.ht, self.hu = np.empty(users, np.int64), np.empty(users, np.int64)
        _start(self.shape, starts, self.state, self.ht, self.hu)
        self.held = np.empty((1024, 6), np.int64)
        self.counters = np.zeros(2, np.int64)

    def take(self, n: int) -> np.ndarray:
        """The next ``n`` rows: an [n, 4] int64 array of user number, item rank, time, session."""
        out = np.empty((n, 4), np.int64)
        done = 0
        while done < n:
            done += _advance(self.shape, self.state, self.activity, self.ht, self.hu, self.held, self.counters, out[done:])
            if done < n:  # the held-back events filled their heap
                self.held = np.concatenate([self.held, np.empty_like(self.held)])
        return out


def _keys(numbers: np.ndarray, c: ColumnSpec, cardinality: int, salt: int) -> pa.Array:
    """Numbers in [0, cardinality) → scattered keys in the encoding of column ``c``."""
    bits = key_bits(c, cardinality)
    keys = np.empty(numbers.shape[0], np.uint64)
    _scatter(numbers, np.uint64(salt & ((1 << bits) - 1)), bits, keys)
    return encode_keys(keys, np.ones(numbers.shape[0], np.uint8), numbers.shape[0], c)


def _sizes(schema: Schema, spec: EventsSpec, rows: int, max_cardinality: int | None) -> dict[str, int]:
    """Users, items and categories, each checked against the key space of its column."""
    sizes = {"user": spec.users or default_users(rows, max_cardinality), "item": spec.items or default_items(rows, max_cardinality),
             "category": spec.categories}
    for (what, n), field in zip(sizes.items(), ("users", "items", "categories")):
        name = spec.filled.get(what)
        if name is not None and n > key_space(schema.column(name)):
            space = key_space(schema.column(name))
            raise SpecError(schema.path, f"generate.events.{field}", f"{n:,} {field} do not fit the key space of column {name!r} ({space:,} keys)")
    return sizes


def generate_events(
    schema: Schema,
    rows: int,
    files: int,
    out_dir: str | Location,
    seed: int,
    other_columns: Callable[[int, int], dict[str, pa.Array]],
    progress: Callable[[int], None] | None = None,
    max_cardinality: int | None = None,
) -> list[Location]:
    """Write ``rows`` events of ``schema`` (which has ``generate.events``) as ``files`` shards; return their paths.

    ``other_columns(i0, n)`` gives the schema's columns that the stream does not fill, for its rows ``i0`` to
    ``i0 + n - 1``, by name (``etl.tools.synth.generate``, which calls this for such schemas, makes them as for any
    schema). The other arguments are ``generate``'s. Raises ``SpecError`` for more users, items or categories than
    their column's key space holds."""
    spec = schema.events
    if spec is None:
        raise SpecError(schema.path, "generate.events", "missing: the schema does not describe events")
    filled = spec.filled
    sizes = _sizes(schema, spec, rows, max_cardinality)
    stream = _Stream(spec, rows, seed, sizes["user"], sizes["item"])
    salts = {what: stream_key(seed, schema.names.index(name), 7) for what, name in filled.items()}
    arrow_schema = raw_arrow_schema(schema)
    category_key = np.uint64(stream_key(seed, _STREAMS, _CATEGORIES))

    def batch(i0: int, n: int) -> pa.RecordBatch:
        events = stream.take(n)
        users, ranks = events[:, 0].copy(), events[:, 1].copy()
        made = {spec.user: _keys(users, schema.column(spec.user), sizes["user"], salts["user"]),
                spec.item: _keys(ranks, schema.column(spec.item), sizes["item"], salts["item"]),
                spec.time: pa.array(events[:, 2].copy())}
        if spec.session is not None:
            made[spec.session] = pa.array(events[:, 3].copy())
        if spec.category is not None:
            cats = np.empty(n, np.int64)
            _categories(ranks, category_key, spec.categories, cats)
            made[spec.category] = _keys(cats, schema.column(spec.category), spec.categories, salts["category"])
        made.update(other_columns(i0, n))
        return pa.RecordBatch.from_arrays([made[name] for name in schema.names], schema=arrow_schema)

    sizes_per_file = [rows // files + (1 if f < rows % files else 0) for f in range(files)]
    with ShardSetWriter(out_dir, arrow_schema) as shards:
        i0 = 0
        for f, nrows in enumerate(sizes_per_file):
            writer = shards.open(f)
            try:
                for j in range(0, nrows, ROW_GROUP_ROWS):
                    n = min(ROW_GROUP_ROWS, nrows - j)
                    writer.write_batch(batch(i0, n), row_group_size=ROW_GROUP_ROWS)
                    i0 += n
                    if progress is not None:
                        progress(n)
            finally:
                writer.close()
        return shards.commit()
