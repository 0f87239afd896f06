"""Fitting a pipeline over shards: the threaded executor (the Dask executor is ``etl.pipeline.distributed``; the
stages and the plan of each, which both follow, are ``etl.pipeline.plan``). For each stage the executor streams
the shards once, row group by row group.

Statistics are sums (counts, exact float sums) and ``finalize`` orders everything canonically, so the fitted
state (and the artifact bytes) do not depend on shard order, batch order or worker count.
"""

from __future__ import annotations

import functools
import itertools
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from etl.backends.hashing import MAX_BUCKETS
from etl.errors import ConfigError, InputError
from etl.io.fs import Location, Url, location
from etl.io.parquet import open_shard, read_footer
from etl.ops import Op
from etl.pipeline.plan import fit_plan, fit_stages, stage_name
from etl.pipeline.stages import read_staged
from etl.runtime.progress import Progress
from etl.runtime.workers import run_staged, run_workers

if TYPE_CHECKING:
    from distributed import Client

    from etl.pipeline.core import Backend, OnError, Pipeline, Transformed

T = TypeVar("T")

#: An (op, accumulator of one of its columns) pair: the unit of work of the fitting threads.
Unit = tuple[Op, dict[str, Any]]


def fit_shards(
    pipeline: Pipeline,
    shards: list[Location],
    workers: int = 1,
    on_error: OnError = "raise",
    progress: Progress | None = None,
    client: Client | None = None,
    partitions: int | None = None,
    workdir: str | Location | None = None,
) -> None:
    """Fit every fittable op of ``pipeline``, streaming over ``shards`` row group by row group in bounded memory,
    one pass per stage. Invalid rows raise ``RowError`` or, with ``on_error="quarantine"``, are left out of the
    statistics. ``progress`` (``etl.runtime.progress``) is called with the pass name (``"fit"``, or ``"fit 1/2"``,
    ``"fit 2/2"``... with several stages) and the rows of each row group read; on a cluster, a stage with count
    tables has a second pass, ``"fit merge"`` (``"fit 1/2 merge"``...), while their partitions are merged.

    Without ``client``, the work runs in ``workers`` threads of this process. With a Dask ``client``, it runs on
    the cluster's workers (``etl.pipeline.distributed``): count tables are cut into ``partitions`` partitions
    (default: from the estimated distinct keys) and spilled to a temporary directory inside ``workdir`` (a local
    directory or an object-storage URL; default: the system's temporary directory; on a cluster of several
    machines, a directory every worker sees, or object storage), removed when fitting ends. The fitted state is the
    same, to the byte, either way."""
    if partitions is not None:
        if client is None:
            raise ConfigError("--partitions applies to a fit on a Dask cluster (--cluster); threads keep one count table per column")
        if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= MAX_BUCKETS:
            raise ConfigError(f"--partitions {partitions!r}: expected an integer in [1, 2**31]")
    lock = threading.Lock()
    stages = fit_stages(pipeline.ops)
    for k, stage in enumerate(stages):
        name = stage_name(k, len(stages))
        report = None if progress is None else functools.partial(progress, name)
        if client is None:
            _fit_stage(pipeline, stage, shards, workers, on_error, report, lock)
        else:
            from etl.pipeline.distributed import fit_stage_on_cluster

            work = Path(tempfile.gettempdir()) if workdir is None else location(workdir)
            fit_stage_on_cluster(pipeline, stage, shards, client, on_error, progress, name, partitions, work)


def _fit_stage(
    pipeline: Pipeline,
    stage: list[Op],
    shards: list[Location],
    workers: int,
    on_error: OnError,
    progress: Callable[[int], None] | None,
    lock: threading.Lock,
) -> None:
    """Fit the ops of ``stage`` in one pass over ``shards`` (``lock`` serializes the calls to ``progress``):
    ``fit_batches`` over the row groups of the shards, each read (the columns of ``fit_plan``) and run through
    the label check and the ops that feed the stage (Decode...)."""
    prep, columns = fit_plan(pipeline, stage)

    def prepare(path: Location, emit: Callable[[Transformed], None], stop: threading.Event) -> None:
        emit_prepared(pipeline, path, columns, prep, on_error, emit, stop)

    fit_batches(pipeline, stage, shards, prepare, workers, progress, lock, rows_of(shards))


def rows_of(shards: list[Location]) -> int | None:
    """The rows of ``shards`` in all, from their footers, when they are local files (a footer read costs next to
    nothing there); None for shards in object storage, where it would cost a request each, and when a footer
    cannot be read (a sizing hint: the fit's own reading reports what is wrong with the shard)."""
    if any(isinstance(p, Url) for p in shards):
        return None
    try:
        return sum(read_footer(p).num_rows for p in shards)
    except InputError:
        return None


def emit_prepared(
    pipeline: Pipeline,
    path: Location,
    columns: list[str],
    prep: list[Op],
    on_error: OnError,
    emit: Callable[[Transformed], None],
    stop: threading.Event,
) -> None:
    """Read ``columns`` of each row group of shard ``path``, run the pipeline's reshaping stages, the label check
    and the ops ``prep`` on it (as ``fit_plan`` says) and ``emit`` the result, until the shard ends or ``stop`` is
    set."""
    shard = open_shard(path, pipeline.schema)
    for i in range(shard.num_row_groups):
        if stop.is_set():
            return
        batch, stages = read_staged(pipeline.stages, shard, i, columns)
        t = pipeline.run_ops(batch, prep, on_error, labels=True, output=False)
        t.stages = stages
        emit(t)
        del batch, t  # one row group held at a time: this one goes before the next is read


def fit_batches(
    pipeline: Pipeline,
    stage: list[Op],
    items: list[T],
    prepare: Callable[[T, Callable[[Transformed], None], threading.Event], None],
    workers: int,
    progress: Callable[[int], None] | None,
    lock: threading.Lock,
    rows: int | None = None,
) -> None:
    """Fit the ops of ``stage`` on the batches ``prepare(item, emit, stop)`` emits for every item of ``items``
    (prepared batches: rows rejected before fitting listed in them), then finalize them. ``progress`` hears of
    the rows each batch was read from (``Transformed.rows_read``: rejected ones, and those reshaping stages
    removed, included; ``lock`` serializes its calls). ``rows``: the rows of all the batches, when known (the
    accumulators' sizing hint, ``Op.new_stats``).

    ``prepare`` runs in ``workers`` threads. Every prepared batch then goes to ``workers`` fitting threads that
    share its (op, column) units: each thread claims the next unclaimed unit of the batch and adds it to that
    column's accumulator, under the column's lock (one accumulator per column: no duplicated count tables; a busy
    column is put off while the thread claims others, so the work balances whatever the columns cost). Once every
    batch is counted, the units are finalized in as many threads."""
    xp = pipeline.xp
    fitters = max(1, workers)
    stats = [op.new_stats(xp, rows) for op in stage]
    units: list[Unit] = [(op, _columns_of(st, c)) for op, st in zip(stage, stats) for c in st]
    unit_locks = [threading.Lock() for _ in units]

    def produce(item: T, emit: Callable[[Any], None], stop: threading.Event) -> None:
        def emit_claimed(t: Transformed) -> None:
            emit((t, itertools.count()))  # the batch and its unit claims, shared by the fitting threads
            if progress is not None:
                with lock:
                    progress(t.rows_read)

        prepare(item, emit_claimed, stop)

    def gather(f: int, item: tuple[Transformed, Iterator[int]]) -> None:
        t, claims = item
        later = []
        for u in claims:  # next() on itertools.count is atomic: each unit is claimed once per batch
            if u >= len(units):
                break
            if unit_locks[u].acquire(blocking=False):
                _fit_unit(units[u], unit_locks[u], t, xp)
            else:
                later.append(u)
        for u in later:
            unit_locks[u].acquire()
            _fit_unit(units[u], unit_locks[u], t, xp)

    run_staged(items, workers, fitters, produce, gather)
    _finalize_units(units, fitters, xp)


def _finalize_units(units: list[Unit], workers: int, xp: Backend) -> None:
    """Finalize every (op, column) unit, in ``workers`` threads (columns are independent: a vocabulary's sort
    releases the GIL). An error is raised as a sequential finalize raises it: the first in unit order."""

    def finalize(_w: int, unit: Unit, _stop: threading.Event) -> BaseException | None:
        op, acc = unit
        try:
            op.finalize(acc, xp)
        except Exception as e:  # noqa: BLE001 - raised below, the first in unit order
            return e
        return None

    for error in run_workers(units, workers, finalize):
        if error is not None:
            raise error


def _fit_unit(unit: Unit, held: threading.Lock, t: Transformed, xp: Backend) -> None:
    """Add batch ``t`` to one column's accumulator (``unit``: the op and its one-column stats), then release
    the column's lock ``held``."""
    try:
        op, acc = unit
        op.partial_fit(acc, t.batch, xp)
    finally:
        held.release()




def _columns_of(stats: dict[str, Any], column: str) -> dict[str, Any]:
    """The accumulator of an op restricted to one column (the same per-column entry, so updates are shared)."""
    return {column: stats[column]}
