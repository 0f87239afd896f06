"""Fitting that keeps what it read for the transform: each shard is read and decoded once (``etl preprocess``).

The first fitting stage reads every row group whole (every schema column), runs the label check and the ops that
feed the stage (``fit_plan``: Decode...), and puts the result in a ``Stash`` (``etl.pipeline.stash``):

- the prepared batch (those ops applied, every other column as read), when no row was rejected and running those
  ops first is the same as running every op in pipeline order (``runs_first``: no earlier op reads or writes what
  they write, nor writes what they read);
  When the shard is a local file, only the columns some fitting stage reads are read and stashed; the
  transform reads the others (``Plan.reread``: in Criteo's pipeline, the dense columns) from the shard again,
  which costs less time than holding them costs memory;
- otherwise the row group as read (``RawRows``): later stages and the transform then treat it exactly as a
  two-pass run treats the source. A pipeline with reshaping stages (``etl.pipeline.stages``) stashes every row
  group this way: the fit and the transform each run the stages on it, as a two-pass run does, and the transform
  has their row counts for the manifest.

Later stages fit from the stash, never from the shards: from a prepared batch by running the feeding ops not yet
run (label check and the first stage's feeding ops already passed on every row), from raw rows as a fit from the
source does. The statistics are therefore computed over the rows a two-pass fit counts, and the fitted state is
the same, to the byte.

``transform_stashed`` then transforms a stashed row group with the ops left (``Plan.rest``, in pipeline order)
and the output check. A prepared batch where one of them rejects a row is transformed again from the source the
two-pass way (its rows are read again: bad rows are rare, and the quarantine keeps the raw rows with the first
reason in pipeline order), so the output, quarantine included, has the bytes of a two-pass run. A shard that is no
longer the file the fit read (``etl.io.fs.identity``: replaced or rewritten between fit and transform) is refused
with an ``InputError`` naming it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pyarrow as pa

from etl.batch import Batch, Column
from etl.errors import InputError, RowError
from etl.io.fs import Location, Url, current_identity, identity
from etl.io.parquet import Shard, open_shard
from etl.io.processed import StageRows
from etl.ops import Op
from etl.pipeline.column_groups import ColumnGroup, column_groups, read_by_groups
from etl.pipeline.core import OnError, Pipeline, Transformed
from etl.pipeline.fit import emit_prepared, fit_batches, rows_of
from etl.pipeline.plan import fit_plan, fit_stages, stage_name
from etl.pipeline.stages import staged_batch
from etl.pipeline.stash import Key, RawRows, Stash
from etl.runtime.progress import Progress


@dataclass(frozen=True)
class Plan:
    """What the transform of stashed row groups runs: the ops the first fitting stage ran before its statistics
    (``first``; prepared batches hold their output), the others in pipeline order (``rest``). ``reread``: the
    schema columns a prepared batch lacks, which the transform reads from the shard again (local shards);
    ``versions``: each stashed shard (by path) with its ``identity`` before the fit read it (a shard changed since
    is refused rather than mixed with what the fit read, or recorded in the manifest as the file it is now)."""

    first: list[Op]
    rest: list[Op]
    reread: tuple[str, ...] = ()
    versions: dict[str, tuple[int, ...]] = field(default_factory=dict)


def runs_first(ops: list[Op], first: list[Op]) -> bool:
    """Whether running the ops ``first`` (some of ``ops``, in order) before the others gives what running ``ops``
    in order gives: no op outside ``first`` that comes before one of them reads or writes a column it writes, or
    writes a column it reads."""
    chosen = {id(op) for op in first}
    for i, early in enumerate(ops):
        if id(early) in chosen:
            continue
        touched = set(early.columns) | set(early.outputs)
        for late in ops[i + 1 :]:
            if id(late) in chosen and (touched & set(late.outputs) or set(early.outputs) & set(late.columns)):
                return False
    return True


def fit_stashing(
    pipeline: Pipeline,
    shards: list[Location],
    stash: Stash,
    stashed: set[int],
    workers: int = 1,
    on_error: OnError = "raise",
    progress: Progress | None = None,
) -> Plan:
    """Fit every fittable op of ``pipeline`` (threads, as ``etl.pipeline.fit.fit_shards``: the same fitted state),
    reading each shard once: the row groups of the shards whose index is in ``stashed`` are kept in ``stash``
    under (shard index, row group), and later stages fit from it; the other shards are read as a two-pass fit
    reads them (their output is not to be redone: the caller found it complete). Returns the plan of
    ``transform_stashed``."""
    lock = threading.Lock()
    stages = fit_stages(pipeline.ops)
    if not stages:
        return Plan([], list(pipeline.ops))
    first, columns = fit_plan(pipeline, stages[0])
    exact = runs_first(pipeline.ops, first)
    keys: list[Key] = []
    # a prepared batch holds the columns some stage reads; the transform reads the others from the shard again
    read = {c for stage in stages for c in fit_plan(pipeline, stage)[1]}
    kept = [c for c in pipeline.schema.names if c in read]
    reread = tuple(c for c in pipeline.schema.names if c not in read) if exact and not pipeline.stages else ()
    versions: dict[str, tuple[int, ...]] = {}

    def prepare_first(item: tuple[int, Location], emit: Callable[[Transformed], None], stop: threading.Event) -> None:
        index, path = item
        if index not in stashed:
            emit_prepared(pipeline, path, columns, first, on_error, emit, stop)
            return
        shard = open_shard(path, pipeline.schema)
        version = identity(path)  # before any row group is read
        with lock:
            versions[str(path)] = version
        partial = bool(reread) and not isinstance(path, Url)  # a re-read from object storage costs requests
        groups = column_groups(pipeline, ops=first, columns=kept) if partial and exact else None
        for i in range(shard.num_row_groups):
            if stop.is_set():
                return
            if groups is not None:
                try:
                    t = read_by_groups(pipeline, groups, shard, i, output=False)
                except RowError:
                    pass  # read whole below: rows are rejected (or the error raised) as a whole row group has them
                else:
                    stash.put((index, i), t.batch)
                    with lock:
                        keys.append((index, i))
                    emit(t)
                    del t
                    continue
            raw = RawRows(shard.read_table(i, kept if partial else None), str(path), i, shard.row_group_starts[i])
            batch, staged = _staged(pipeline, raw, kept if partial else None)
            t = pipeline.run_ops(batch, first, on_error, labels=True, output=False)
            t.stages = staged
            if t.rejected or not exact or pipeline.stages:
                if partial:  # rows were rejected: the transform takes the row group whole, as read
                    raw = RawRows(shard.read_table(i), raw.source, i, raw.first_row)
                stash.put((index, i), raw)
            else:
                stash.put((index, i), t.batch)
            with lock:
                keys.append((index, i))
            emit(t)
            del raw, batch, t  # one row group held at a time: this one goes before the next is read

    items = list(enumerate(shards))
    rows = rows_of(shards)
    report = None if progress is None else functools.partial(progress, stage_name(0, len(stages)))
    fit_batches(pipeline, stages[0], items, prepare_first, workers, report, lock, rows)
    keys.sort()
    unstashed = [p for i, p in items if i not in stashed]
    for k, stage in enumerate(stages[1:], 1):
        report = None if progress is None else functools.partial(progress, stage_name(k, len(stages)))
        _fit_from_stash(pipeline, stage, first, stash, [*keys, *unstashed], workers, on_error, report, lock, rows)
    return Plan(first, [op for op in pipeline.ops if op not in first], reread, versions)


def _fit_from_stash(
    pipeline: Pipeline,
    stage: list[Op],
    first: list[Op],
    stash: Stash,
    sources: list[Key | Location],
    workers: int,
    on_error: OnError,
    progress: Callable[[int], None] | None,
    lock: threading.Lock,
    rows: int | None,
) -> None:
    """Fit a later stage over ``sources``: stashed row groups by key (prepared batches, on which the ops of
    ``first`` ran, or raw rows), and shards not stashed, read from the source (``rows`` in all, when known)."""
    prep, columns = fit_plan(pipeline, stage)
    more = [op for op in prep if op not in first]

    def prepare(item: Key | Location, emit: Callable[[Transformed], None], stop: threading.Event) -> None:
        if isinstance(item, tuple):  # a stashed row group
            entry = stash.get(item)
            if isinstance(entry, RawRows):
                batch, staged = _staged(pipeline, entry, columns)
                t = pipeline.run_ops(batch, prep, on_error, labels=True, output=False)
                t.stages = staged
                emit(t)
            else:
                emit(pipeline.run_ops(entry, more, on_error, labels=False, output=False))
            return
        emit_prepared(pipeline, item, columns, prep, on_error, emit, stop)

    fit_batches(pipeline, stage, sources, prepare, workers, progress, lock, rows)


def transform_stashed(
    pipeline: Pipeline, plan: Plan, entry: Batch | RawRows, shard: Shard, on_error: OnError, training: bool = False
) -> tuple[int, Transformed, pa.Table | None]:
    """Transform a stashed row group of ``shard`` as ``pipeline.transform`` transforms it from the source (as
    training rows when ``training``): the number of rows it holds, the transformed batch, and the raw rows when a
    row was rejected (for the quarantine; else None, so that they are freed before the output is written). A
    prepared batch in which a row is rejected is transformed again from the source. When the ops left are
    columnwise (``column_groups``), a prepared batch is transformed a group of columns at a time, its columns
    consumed as they go. ``InputError`` when the shard is no longer the file the fit read (checked at its first row
    group, where its output begins, and before each read from it)."""
    if entry.row_group == 0:
        _check_unchanged(plan, shard, 0)
    if isinstance(entry, RawRows):
        t = _transform_raw(pipeline, entry, on_error, training)
        return entry.table.num_rows, t, entry.table if t.rejected else None
    groups = column_groups(pipeline, ops=plan.rest)
    n = entry.num_rows
    try:
        if groups is None:
            t = pipeline.run_ops(_completed(plan, entry, shard), plan.rest, "raise", labels=False, output=True, training=training)
        else:
            t = _by_groups(pipeline, plan, entry, shard, groups, training)
        return n, t, None
    except RowError:
        pass  # transformed again from the source below: the error raised, or the rows quarantined, as a two-pass run has them
    raw = RawRows(shard.read_table(entry.row_group), entry.source, entry.row_group, shard.row_group_starts[entry.row_group])
    return raw.table.num_rows, _transform_raw(pipeline, raw, on_error, training), raw.table


def _by_groups(pipeline: Pipeline, plan: Plan, entry: Batch, shard: Shard, groups: list[ColumnGroup], training: bool) -> Transformed:
    """The prepared batch ``entry`` transformed by the ops left a group of columns at a time, each group's columns
    not stashed read from the shard then (``_completed``); ``entry``'s columns are taken out of it as their group is
    done, so that their memory goes as the output's comes. ``RowError`` for the first invalid row."""
    columns: dict[str, Column] = {}
    for g in groups:
        part = replace(entry, columns={c: entry.columns.pop(c) for c in g.columns if c in entry.columns})
        t = pipeline.run_ops(_completed(plan, part, shard, [c for c in plan.reread if c in g.columns]), list(g.ops), "raise",
                             labels=False, output=True, training=training)  # fmt: skip
        columns.update((c, t.batch[c]) for c in g.columns)
        del part, t
    return Transformed(replace(entry, columns=columns))


def _check_unchanged(plan: Plan, shard: Shard, row_group: int) -> None:
    """``InputError`` when ``shard`` is no longer the file the fit read (``Plan.versions``)."""
    if current_identity(shard.path) != plan.versions.get(str(shard.path)):
        raise InputError(str(shard.path), "the file changed while it was preprocessed (after the fit read it); run again", row_group=row_group)


def _completed(plan: Plan, entry: Batch, shard: Shard, reread: list[str] | None = None) -> Batch:
    """The prepared batch ``entry`` of ``shard`` with the columns ``reread`` (default: every column the fit did not
    stash, ``plan.reread``) read from the shard again, in the columns' order of a batch prepared from the whole row
    group. ``InputError`` when the shard changed since the fit read it."""
    reread = [c for c in (plan.reread if reread is None else reread) if c not in entry.columns]  # none: stashed whole
    if not reread:
        return entry
    _check_unchanged(plan, shard, entry.row_group)
    more = shard.read(entry.row_group, reread)
    if more.num_rows != entry.num_rows:
        raise InputError(entry.source, f"row group {entry.row_group} holds {more.num_rows} rows, the fit read {entry.num_rows}; "
                         "was the file replaced while it was preprocessed?", row_group=entry.row_group)  # fmt: skip
    names = shard.schema.names
    columns = {c: entry.columns[c] if c in entry.columns else more.columns[c] for c in names if c in entry.columns or c in more.columns}
    columns.update((c, col) for c, col in entry.columns.items() if c not in columns)
    return Batch(columns, entry.num_rows, entry.source, entry.row_group, entry.row_ids)


def _staged(pipeline: Pipeline, raw: RawRows, columns: list[str] | None = None) -> tuple[Batch, tuple[StageRows, ...]]:
    """The rows of ``raw`` (its ``columns``, default all) that the pipeline's reshaping stages pass on, as a batch,
    and the stages' rows in and out."""
    return staged_batch(pipeline.stages, pipeline.schema, raw.table, raw.source, raw.row_group, raw.first_row, columns)


def _transform_raw(pipeline: Pipeline, raw: RawRows, on_error: OnError, training: bool) -> Transformed:
    """``raw`` through the reshaping stages, then ``pipeline.transform`` (``training``: of training rows)."""
    batch, staged = _staged(pipeline, raw)
    t = pipeline.transform(batch, on_error, training=training)
    t.stages = staged
    return t
