"""The first pass of a split run (``etl.preprocess.split``): the split resolved over the rows into the
``etl.pipeline.split_rows.Assignment`` that places every row.

- A split by time with fixed bounds needs no pass.
- A split by time with a quantile bound reads the time column of every row that reaches the split (the rows the
  row-scope stages pass on) and takes the value at ``floor(q * N)`` of them sorted, exactly. Memory: the column's
  values, 8 bytes per row.
- A split by each key's latest events reads the key, time and tiebreak columns of those rows and keeps, per key,
  its latest ``valid + test`` events in History's order (key hash, time, tiebreak columns, input position): each
  thread reduces its shard's rows to them whenever the rows it holds exceed those it keeps (or 1 Mi rows), and the
  shards' results are reduced into one table the same way. Memory: the kept events, ``valid + test`` per key, at
  about 32 bytes each (plus the tiebreak values), and the unreduced rows of one shard per thread. The valid and test
  rows are then known by position (``LatestRoles``).

Rows without a value in a split column stop the pass with a ``RowError`` naming the file, row and column.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.errors import ConfigError, RowError
from etl.io.arrow import from_numpy, to_numpy
from etl.io.fs import Location
from etl.io.parquet import batch_from_arrow, open_shard
from etl.io.text import raw_arrow_schema
from etl.ops.history import event_key_hashes
from etl.pipeline import Pipeline
from etl.pipeline.split import LastSplit, Quantile, Split, TimeSplit
from etl.pipeline.split_rows import TEST, VALID, Assignment, LatestRoles, TimeRoles, position_codes
from etl.pipeline.stages import RowGroupAt, run_stages
from etl.runtime.progress import Progress
from etl.runtime.workers import run_workers

#: The columns of the events a split by latest events keeps (no schema column has a "/" in its name).
HASH, TIME, INPUT, ROW = "/hash", "/time", "/input", "/row"
#: A thread reduces the rows it holds to the latest events once they exceed those it keeps, or this many.
REDUCE_ROWS = 1 << 20

#: What a pass does with the split columns of one row group: (shard index, its rows that reach the split, as read,
#: where it lies, their positions in the row group).
RowGroupWork = Callable[[int, pa.Table, RowGroupAt, np.ndarray], None]


def resolve(pipeline: Pipeline, split: Split, shards: list[Location], workers: int, progress: Progress | None = None) -> Assignment:
    """The assignment of ``split`` over the rows of ``shards`` that ``pipeline``'s row-scope stages pass on, in
    ``workers`` threads; ``progress`` hears of the ``"split"`` pass (when there is one). ``ConfigError`` when a
    resolved ``train_until`` lies after ``valid_until``."""
    if isinstance(split, LastSplit):
        return _latest(pipeline, split, shards, workers, progress)
    bounds = [split.train_until, split.valid_until]
    if any(isinstance(b, Quantile) for b in bounds):
        values = _time_values(pipeline, split, shards, workers, progress)
        bounds = [_at_quantile(values, b) if isinstance(b, Quantile) else b for b in bounds]
    train, valid = bounds
    if not isinstance(train, int | float) or (valid is not None and not isinstance(valid, int | float)):
        raise ValueError(f"unresolved bounds {bounds}")
    if valid is not None and valid < train:
        raise ConfigError(f"split: train_until resolves to {train}, after valid_until {valid} ({split.train_until} and {split.valid_until})")
    return TimeRoles(pipeline.schema, split.column, train, valid)


def _at_quantile(values: np.ndarray, q: Quantile) -> int | float:
    """The value at ``q.index(N)`` of the ``N`` ``values`` sorted ascending (0 when there are none)."""
    if not len(values):
        return 0
    k = q.index(len(values))
    return np.partition(values, k)[k].item()


def each_row_group(pipeline: Pipeline, columns: list[str], shards: list[Location], workers: int, work: RowGroupWork,
                   progress: Progress | None, shard_done: Callable[[int], None] | None = None, name: str = "split") -> None:  # fmt: skip
    """Call ``work`` with ``columns`` (in their raw-layout types, ``etl.io.text.raw_arrow_schema``) of the rows of
    every row group of ``shards`` that ``pipeline``'s row-scope stages pass on, in ``workers`` threads (each
    shard's row groups in turn in one thread, which then calls ``shard_done`` with its index); ``progress`` hears
    of the pass ``name``."""
    stages = pipeline.stages
    read = [c for c in pipeline.schema.names if c in columns or any(c in s.columns for s in stages)]
    raw = raw_arrow_schema(pipeline.schema)
    lock = threading.Lock()

    def shard_work(_w: int, index: int, stop: threading.Event) -> None:
        path = shards[index]
        shard = open_shard(path, pipeline.schema)
        for i in range(shard.num_row_groups):
            if stop.is_set():
                return
            table = shard.read_table(i, read)
            at = RowGroupAt(str(path), i, shard.row_group_starts[i])
            rows, _ = run_stages(stages, table, at)
            part = pa.Table.from_arrays([table.column(c).cast(raw.field(c).type) for c in columns], names=columns)
            work(index, part.take(from_numpy(rows)), at, rows)
            if progress is not None:
                with lock:
                    progress(name, table.num_rows)
            del table, part, rows  # one row group held at a time: this one goes before the next is read
        if shard_done is not None:
            shard_done(index)

    run_workers(list(range(len(shards))), workers, shard_work)


def _time_values(pipeline: Pipeline, split: TimeSplit, shards: list[Location], workers: int, progress: Progress | None) -> np.ndarray:
    """The time column's values over every row that reaches the split (``RowError`` for a row without one)."""
    found: list[list[np.ndarray]] = [[] for _ in shards]

    def work(index: int, part: pa.Table, at: RowGroupAt, rows: np.ndarray) -> None:
        col = batch_from_arrow(part, pipeline.schema, at.source, at.row_group, columns=[split.column])[split.column]
        values = np.asarray(col.values)
        missing = np.zeros(len(values), np.bool_) if col.valid is None else ~np.asarray(col.valid, np.bool_)
        if values.dtype.kind == "f":
            missing |= np.isnan(values)
        _refuse_missing(missing, split.column, "the split's time is missing, so the row has no split", at, rows)
        found[index].append(values)

    each_row_group(pipeline, split.columns, shards, workers, work, progress)
    arrays = [a for per_shard in found for a in per_shard]
    dtype = np.float64 if pipeline.schema.column(split.column).dtype == "float64" else np.int64
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)


def _refuse_missing(missing: np.ndarray, column: str, reason: str, at: RowGroupAt, rows: np.ndarray) -> None:
    """``RowError`` for the first row of ``missing`` (positions ``rows`` of the row group ``at``)."""
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise RowError(at.source, at.row_group, int(at.first_row + rows[i]), column, reason)


def _latest(pipeline: Pipeline, split: LastSplit, shards: list[Location], workers: int, progress: Progress | None) -> LatestRoles:
    """Each key's latest ``valid + test`` events over every row that reaches the split, as ``LatestRoles``."""
    keep = split.valid + split.test
    key_spec = pipeline.schema.column(split.key)
    lock = threading.Lock()
    held: list[pa.Table | None] = [None for _ in shards]
    pending: list[list[pa.Table]] = [[] for _ in shards]
    merged: list[pa.Table] = []

    def work(index: int, part: pa.Table, at: RowGroupAt, rows: np.ndarray) -> None:
        batch = batch_from_arrow(part, pipeline.schema, at.source, at.row_group, columns=[split.key, split.time])
        hashes, usable, malformed = event_key_hashes(batch[split.key], key_spec)
        _refuse_missing(malformed, split.key, f"malformed key (its encoding is {key_spec.encoding})", at, rows)
        _refuse_missing(~usable, split.key, "the split's key is missing, so the row has no split", at, rows)
        time = batch[split.time]
        _refuse_missing(np.zeros(len(rows), np.bool_) if time.valid is None else ~np.asarray(time.valid, np.bool_), split.time,
                        "the split's time is missing, so the row has no split", at, rows)  # fmt: skip
        events = [from_numpy(hashes, pa.uint64()), from_numpy(np.asarray(time.values, np.int64)),
                  *(part.column(c) for c in split.tiebreak),
                  from_numpy(np.full(len(rows), index, np.int64)), from_numpy(at.first_row + rows)]  # fmt: skip
        pending[index].append(pa.Table.from_arrays(events, names=[HASH, TIME, *(f"/tiebreak{k}" for k in range(len(split.tiebreak))), INPUT, ROW]))
        kept = held[index]
        if sum(t.num_rows for t in pending[index]) > max(REDUCE_ROWS, 0 if kept is None else kept.num_rows):
            reduce(index)

    def reduce(index: int) -> pa.Table | None:
        parts = [t for t in [held[index], *pending[index]] if t is not None]
        held[index], pending[index] = (_keep_latest(pa.concat_tables(parts), keep) if parts else None), []
        return held[index]

    def shard_done(index: int) -> None:  # the shard's latest events into those of the shards before
        mine = reduce(index)
        held[index] = None
        if mine is not None:
            with lock:
                merged[:] = [_keep_latest(pa.concat_tables([*merged, mine]), keep)]

    each_row_group(pipeline, split.columns, shards, workers, work, progress, shard_done)
    return _roles(merged[0] if merged else None, split)


def _keep_latest(events: pa.Table, keep: int) -> pa.Table:
    """The latest ``keep`` events of each key hash of ``events``, sorted in History's order (hash, time, tiebreak
    columns, input position; missing values first)."""
    order = pc.sort_indices(events, sort_keys=[(c, "ascending", "at_start") for c in events.column_names])
    events = events.take(order)
    return events.filter(from_numpy(_from_end(to_numpy(events.column(HASH))) < keep))


def _from_end(hashes: np.ndarray) -> np.ndarray:
    """For each of the sorted ``hashes``, how many rows of the same hash follow it (0 for a key's last)."""
    n = len(hashes)
    if not n:
        return np.zeros(0, np.int64)
    ends = np.append(np.flatnonzero(hashes[1:] != hashes[:-1]), n - 1)
    return ends[np.searchsorted(ends, np.arange(n))] - np.arange(n)


def _roles(events: pa.Table | None, split: LastSplit) -> LatestRoles:
    """The valid and test rows among ``events`` (each key's latest, sorted as ``_keep_latest`` sorts them)."""
    if events is None or not events.num_rows:
        return LatestRoles(split, np.zeros(0, np.int64), np.zeros(0, np.int8))
    roles = np.where(_from_end(to_numpy(events.column(HASH))) < split.test, TEST, VALID).astype(np.int8)
    codes = position_codes(to_numpy(events.column(INPUT)), to_numpy(events.column(ROW)))
    order = np.argsort(codes, kind="stable")
    return LatestRoles(split, codes[order], roles[order])
