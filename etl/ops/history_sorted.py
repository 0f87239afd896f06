"""``History`` (``etl.ops.history``) over rows sorted by key, then time: each row's history by index arithmetic.

``etl preprocess`` gives History each partition of its exchange by key sorted by (key hash, time, tiebreak, input
position) (``etl.preprocess.keyed``): a key's rows are consecutive and in the order of its events. A row's history
is then a range of the rows before it: those of its key (from the key's first row) up to the first row at its own
time (rows at the same time never see each other), the latest ``max_len`` of them, and only those within ``ttl``
(``row time - ttl <= event time``). ``SortedHistory`` finds each row's range in one pass and copies the ranges'
values into the output: no per-key table, no ring of entries. It gives the lists ``HistoryState``
(``etl.ops.history_state``) gives on the same rows, whatever the key's number of rows.

Rows come in slices (``advance``), each continuing the one before; a slice's histories may reach back into earlier
slices, so it keeps the rows a later row of the last row's key may still see: at most ``max_len`` rows before the
first row at the last row's time, and the rows at that time. Memory: 8 bytes per kept row for the key, the time and
each listed column, besides the output.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numba as nb
import numpy as np

from etl.ops.stream import Carried

_jit = nb.njit(nogil=True, cache=True)


@_jit
def _ranges(keys, times, start, max_len, ttl, key_start, group_start, ttl_first, first, lengths):  # pragma: no cover - numba
    """Each row ``i >= start`` of ``keys``/``times`` (sorted by key, then time): the first row of its history
    (``first[i - start]``) and its length (``lengths[i - start]``). ``key_start``, ``group_start`` and
    ``ttl_first`` are those of row ``start - 1`` (its key's first row, the first row at its time, the first row of
    its key within ``ttl`` of it; ``ttl`` < 0: none); returns them for the last row."""
    lowest = np.iinfo(np.int64).min
    for i in range(start, len(keys)):
        if i == 0 or keys[i] != keys[i - 1]:
            key_start = group_start = ttl_first = i
        elif times[i] != times[i - 1]:
            group_start = i
        lo = max(key_start, group_start - max_len)
        if ttl >= 0:
            t = times[i]
            lower = t - ttl if t >= lowest + ttl else lowest
            while ttl_first < group_start and times[ttl_first] < lower:
                ttl_first += 1
            lo = max(lo, ttl_first)
        first[i - start] = lo
        lengths[i - start] = group_start - lo
    return key_start, group_start, ttl_first


@_jit
def _gather(values, first, offsets, out):  # pragma: no cover - numba
    """``out[offsets[r]:offsets[r + 1]] = values[first[r]:...]`` for every row ``r``."""
    for r in range(len(first)):
        f = first[r]
        for o in range(offsets[r], offsets[r + 1]):
            out[o] = values[f]
            f += 1


class SortedHistory:
    """The histories of rows given in key, then time order, slice after slice (see the module docstring).
    ``inputs``: the names of the carried key hash, time and listed columns, in that order (``History.state_spec``'s
    inputs); ``outputs``: the names of the lists (one per listed column) and of the lengths (last)."""

    def __init__(self, inputs: Sequence[str], outputs: Sequence[str], max_len: int, ttl: int | None):
        self.inputs, self.outputs, self.max_len = list(inputs), list(outputs), max_len
        self.ttl = -1 if ttl is None else ttl
        self._kept: list[np.ndarray] = [np.zeros(0, np.uint64), *(np.zeros(0, np.int64) for _ in self.inputs[1:])]
        self._marks = (0, 0, 0)  # key_start, group_start, ttl_first of the last row kept, as indices into the kept rows

    @property
    def rows_kept(self) -> int:
        """The rows kept for the histories of later rows."""
        return len(self._kept[0])

    def advance(self, inputs: Mapping[str, Carried]) -> dict[str, np.ndarray]:
        """The histories of the next rows (``inputs``: carried columns named as ``inputs`` names them; every row
        valid; the rows continue those given before in key, then time order): per list output, the rows' values
        one after the other (int64), and the lengths (int32)."""
        carried = [inputs[c] for c in self.inputs]
        if not all(bool(c.valid.all()) for c in carried):
            raise ValueError("History: every row given to the state needs a key, a time and its values")
        start = len(self._kept[0])
        kept = [np.concatenate([k, np.asarray(c.values, k.dtype)]) for k, c in zip(self._kept, carried)]
        n = len(kept[0]) - start
        first = np.empty(n, np.int64)
        lengths = np.empty(n, np.int32)
        marks = _ranges(kept[0], kept[1], start, self.max_len, self.ttl, *self._marks, first, lengths)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        out: dict[str, np.ndarray] = {}
        for name, values in zip(self.outputs[:-1], kept[2:]):
            out[name] = np.empty(int(offsets[-1]), np.int64)
            _gather(values, first, offsets, out[name])
        out[self.outputs[-1]] = lengths
        self._keep(kept, marks)
        return out

    def _keep(self, kept: list[np.ndarray], marks: tuple[int, int, int]) -> None:
        """Keep of ``kept`` the rows a later row may see: none before the last row's key start, its first row at its
        time less ``max_len``, or (with a ``ttl``) its first row within the ttl: a later row's history starts at or
        after each of them."""
        key_start, group_start, ttl_first = marks
        lo = max(key_start, group_start - self.max_len, ttl_first if self.ttl >= 0 else key_start)
        self._kept = [k[lo:] for k in kept]
        self._marks = (key_start - lo, group_start - lo, max(ttl_first - lo, 0))
