"""Fitting one stage on a Dask cluster, in memory that does not grow with the vocabulary in any one process.

1. **Count.** The shards are cut into tasks of whole row groups (at most ``TASK_ROWS`` rows, at least one row
   group). A task runs the stage's feeding ops and counts its rows exactly as the threaded fit does, then turns
   its accumulators into partials (``Op.partials``). A count table (``KeyCounts``, Categorify) is spilled to the
   work directory in the order of the partition hash's top bits (``etl.pipeline.spill``), so that any partition
   of it is a run of rows to read, whatever ``P`` is chosen next; any other partial (Normalize's
   triples: a few numbers per row group) comes back with the task's row count. The client counts rows for the
   progress bar as tasks complete.
2. **Merge by partition.** Each count-table column is cut into ``P`` partitions by a hash of the key
   (``etl.ops.counts.partition_of``). ``P`` is ``partitions`` when given, else one per ``KEYS_PER_PARTITION``
   estimated distinct keys, at least one; the estimate is the sum over tasks of their distinct keys (an upper
   bound of the column's distinct keys). One task per (column, partition) reads that partition's run from every
   spilled partial, merges the counts, ranks them (``Op.rank``: threshold, count descending then key ascending,
   cut to ``max_size``) and writes the ranked partition. Dask spreads these tasks over the workers, so a worker's
   memory holds about (distinct keys) / P entries at a time (a counting task: the distinct keys of at most
   ``TASK_ROWS`` rows).
3. **Assign ids.** The client merges the ranked partitions of a column with a k-way merge, chunk by chunk
   (``etl.ops.counts.merge_ranked``), stopping at ``max_size``, and the op assigns ids in that order
   (``Op.finalize_ranked``). The other partials are merged with ``Op.merge`` and finalized.

Why spilled Parquet rather than Dask's shuffle: a count table is written once and read once per partition from
storage every worker sees anyway (the shards are there), the partition count is chosen after counting (from the
measured distinct keys) without rewriting anything, and nothing is kept in worker memory between the two steps.
A rerun task (a lost worker) rewrites its file whole (atomic rename), so results do not change. The work
directory is a temporary directory (``temporary_path`` naming) inside ``workdir``, which must be on storage
shared by the client and every worker; it is removed when the stage ends, by success or by error.

The result is the same state, to the byte, as the threaded fit's: merging is exact (integer counts, the
order-independent Normalize sums), and the merged ranking is the ranking of the merged counts.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING, Any

from etl.errors import ConfigError, EtlError
from etl.io.files import temporary_path
from etl.io.fs import Location
from etl.io.parquet import open_shard
from etl.ops import Op
from etl.ops.counts import KeyCounts, merge_counts, merge_ranked
from etl.pipeline.fit import fit_plan
from etl.pipeline.spill import read_partition, read_ranked, write_partial, write_ranked

if TYPE_CHECKING:
    from distributed import Client, Future

    from etl.pipeline.core import OnError, Pipeline

#: The most rows one counting task reads (whole row groups, at least one).
TASK_ROWS = 1 << 20
#: Default partitioning: one partition per this many estimated distinct keys of a column.
KEYS_PER_PARTITION = 1 << 22


@dataclass(frozen=True)
class Piece:
    """Row groups ``[first, stop)`` of the shard at ``path``: the rows of one counting task."""

    path: Location
    first: int
    stop: int


@dataclass
class Counted:
    """What a counting task returns: rows read (rejected ones included), the partials that are not count tables,
    and (distinct keys, missing values) of each spilled count table, by (op position in the pipeline, column)."""

    rows: int
    partials: dict[tuple[int, str], Any] = field(default_factory=dict)
    spilled: dict[tuple[int, str], tuple[int, int]] = field(default_factory=dict)


def plan_pieces(pipeline: Pipeline, shards: list[Location]) -> list[Piece]:
    """The counting tasks over ``shards``, in shard order (each shard is opened and checked against the schema)."""
    pieces = []
    for path in shards:
        shard = open_shard(path, pipeline.schema)
        md = shard.file.metadata
        first, rows = 0, 0
        for i in range(shard.num_row_groups):
            n = md.row_group(i).num_rows
            if i > first and rows + n > TASK_ROWS:
                pieces.append(Piece(path, first, i))
                first, rows = i, 0
            rows += n
        if shard.num_row_groups:
            pieces.append(Piece(path, first, shard.num_row_groups))
    return pieces


def default_partitions(estimate: int) -> int:
    """Partitions of a count table with about ``estimate`` distinct keys: one per ``KEYS_PER_PARTITION``, at
    least one."""
    return max(1, math.ceil(estimate / KEYS_PER_PARTITION))


def fit_stage_on_cluster(
    pipeline: Pipeline,
    stage: list[Op],
    shards: list[Location],
    client: Client,
    on_error: OnError,
    progress: Callable[[int], None] | None,
    partitions: int | None,
    workdir: Path,
) -> None:
    """Fit the ops of ``stage`` over ``shards`` with the workers of ``client`` (see the module docstring);
    ``progress`` hears the rows of each counting task as it completes."""
    pieces = plan_pieces(pipeline, shards)
    if not pieces:  # no row group to count: the state of no rows, as the threaded fit gives it
        for op in stage:
            op.finalize(op.new_stats(pipeline.xp), pipeline.xp)
        return
    positions = [pipeline.ops.index(op) for op in stage]
    with _work_directory(workdir) as work, _cancelled_on_exit(client) as futures:
        (work / "counts").mkdir()
        (work / "ranked").mkdir()
        shipped = client.scatter(pipeline, broadcast=True, hash=False)
        for j, piece in enumerate(pieces):
            futures.append(client.submit(_task, _count_piece, shipped, positions, piece, on_error, str(work), j, pure=False))
        results: list[Counted] = _gather_in_order(futures, progress)
        tables = sorted({key for r in results for key in r.spilled}, key=lambda ic: (ic[0], pipeline.ops[ic[0]].columns.index(ic[1])))
        merging = {}
        for i, c in tables:  # every partition task is submitted before any result is awaited
            n = partitions or default_partitions(sum(r.spilled[(i, c)][0] for r in results))
            _column_dir(work / "ranked", pipeline.ops[i], i, c).mkdir()
            merging[(i, c)] = [client.submit(_task, _merge_partition, shipped, i, c, len(pieces), p, n, str(work), pure=False) for p in range(n)]
            futures.extend(merging[(i, c)])
        for (i, c), fs in merging.items():
            _gather_in_order(fs, None)
            _assign_ids(pipeline, i, c, work, len(fs), sum(r.spilled[(i, c)][1] for r in results))
    for i in positions:
        op = pipeline.ops[i]
        merged = {c: reduce(op.merge, (r.partials[(i, c)] for r in results)) for c in op.columns if (i, c) in results[0].partials}
        if merged:
            op.finalize_partials(merged, pipeline.xp)


def _assign_ids(pipeline: Pipeline, i: int, c: str, work: Path, partitions: int, nulls: int) -> None:
    """Finalize column ``c`` of the op at position ``i`` from the k-way merge of its ranked partitions."""
    op, where = pipeline.ops[i], _column_dir(work / "ranked", pipeline.ops[i], i, c)
    with_texts = _with_texts(op, c)
    ranked = merge_ranked([read_ranked(where / _file(p), with_texts) for p in range(partitions)], op.max_size, with_texts)
    ranked.nulls = nulls
    op.finalize_ranked(c, ranked, pipeline.xp)


def _gather_in_order(futures: list[Future], progress: Callable[[int], None] | None) -> list[Any]:
    """The results of ``_task`` futures in their order, reporting the rows of each ``Counted`` result to
    ``progress`` as it completes. The first task that failed raises its error here: a user error (``EtlError``)
    as the task raised it, any other exception as Dask reports it."""
    from distributed import as_completed

    index = {f.key: j for j, f in enumerate(futures)}
    out: list[Any] = [None] * len(futures)
    for f in as_completed(futures):
        r = f.result()
        if isinstance(r, _Failed):
            raise r.error
        out[index[f.key]] = r
        if progress is not None:
            progress(r.rows)
    return out


@contextlib.contextmanager
def _work_directory(workdir: Path) -> Iterator[Path]:
    """A fresh temporary directory inside ``workdir``, removed on exit (whatever ends the block)."""
    work = temporary_path(Path(workdir) / "fit")
    try:
        work.mkdir(parents=True)
    except OSError as e:
        raise ConfigError(f"cannot create the fit work directory {work}: {e}") from None
    try:
        yield work
    finally:
        _remove(work)


def _remove(work: Path, attempts: int = 100) -> None:
    """Remove the work directory. A task cancelled by an error may still be writing in it (Dask cannot stop a
    running task); once the directory is gone, such a task finds nowhere to write (tasks never create parent
    directories), so removal is retried until it succeeds (up to ``attempts`` tenths of a second)."""
    for _ in range(attempts):
        shutil.rmtree(work, ignore_errors=True)
        if not work.exists():
            return
        time.sleep(0.1)


@contextlib.contextmanager
def _cancelled_on_exit(client: Client) -> Iterator[list[Future]]:
    """A list to put futures in; those still pending when the block exits (an error, Ctrl-C) are cancelled."""
    futures: list[Future] = []
    try:
        yield futures
    finally:
        pending = [f for f in futures if not f.done()]
        if pending:
            client.cancel(pending)


def _column_dir(root: Path, op: Op, i: int, c: str) -> Path:
    """The directory under ``root`` of column ``c`` of the op at position ``i`` (column names need not be file
    names)."""
    return root / f"{i:02d}-{op.columns.index(c)}"


def _file(j: int) -> str:
    return f"{j:06d}.parquet"


def _with_texts(op: Op, c: str) -> bool:
    """Whether the count table of column ``c`` keeps texts (string keys)."""
    return op.specs[c].encoding == "string"


# ---------------------------------------------------------------- tasks (run in the workers)


@dataclass
class _Failed:
    """A task stopped by a user error (bad input): returned, not raised, so that the worker does not log it as a
    failed computation and Dask does not retry it; the client raises it."""

    error: EtlError


def _task(work: Callable[..., Any], *args: Any) -> Any:
    """``work(*args)``, or ``_Failed`` holding the ``EtlError`` it raised."""
    try:
        return work(*args)
    except EtlError as e:
        return _Failed(e)


def _count_piece(pipeline: Pipeline, positions: list[int], piece: Piece, on_error: OnError, work: str, j: int) -> Counted:
    """Count the rows of ``piece`` for the ops at ``positions``; spill count tables as piece ``j``."""
    stage = [pipeline.ops[i] for i in positions]
    prep, columns = fit_plan(pipeline, stage)
    xp = pipeline.xp
    stats = [op.new_stats(xp) for op in stage]
    shard = open_shard(piece.path, pipeline.schema)
    out = Counted(0)
    for g in range(piece.first, piece.stop):
        t = pipeline.run_ops(shard.read(g, columns), prep, on_error, labels=True, output=False)
        for op, st in zip(stage, stats):
            op.partial_fit(st, t.batch, xp)
        out.rows += t.batch.num_rows + t.num_rejected
    for i, op, st in zip(positions, stage, stats):
        for c, part in op.partials(st, xp).items():
            if isinstance(part, KeyCounts):
                where = _column_dir(Path(work) / "counts", op, i, c)
                where.mkdir(exist_ok=True)  # not its parents: a task outliving its fit finds no directory to write in
                write_partial(where / _file(j), part)
                out.spilled[(i, c)] = (len(part), part.nulls)
            else:
                out.partials[(i, c)] = part
    return out


def _merge_partition(pipeline: Pipeline, i: int, c: str, pieces: int, p: int, partitions: int, work: str) -> int:
    """Merge partition ``p`` of ``partitions`` of column ``c`` of the op at position ``i`` over the spilled
    partials of every piece, rank it and write it; returns its number of entries."""
    op = pipeline.ops[i]
    with_texts = _with_texts(op, c)
    spilled = _column_dir(Path(work) / "counts", op, i, c)
    ranked = op.rank(merge_counts(read_partition(spilled / _file(j), p, partitions, with_texts) for j in range(pieces)))
    write_ranked(_column_dir(Path(work) / "ranked", op, i, c) / _file(p), ranked)
    return len(ranked)
