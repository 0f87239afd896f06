"""Fitting one stage on a Dask cluster, in memory that does not grow with the vocabulary in any one process.

1. **Count.** The shards are cut into tasks of whole row groups (at most ``TASK_ROWS`` rows, at least one row
   group). A task runs the stage's feeding ops and counts its rows exactly as the threaded fit does, then turns
   its accumulators into partials (``Op.partials``). A count table (``KeyCounts``, Categorify) is spilled to the
   work directory in the order of the partition hash's top bits (``etl.pipeline.spill``), so that any partition
   of it is a run of rows to read, whatever ``P`` is chosen next; any other partial (Normalize's
   triples: a few numbers per row group) comes back with the task's row count. Tasks report the rows of each row
   group they count as progress.
2. **Merge by partition.** Each count-table column is cut into ``P`` partitions by a hash of the key
   (``etl.ops.counts.partition_of``). ``P`` is ``partitions`` when given, else one per ``KEYS_PER_PARTITION``
   estimated distinct keys, at least one; the estimate is the sum over tasks of their distinct keys (an upper
   bound of the column's distinct keys). One task per (column, partition) reads that partition's run from every
   spilled partial, merges the counts, ranks them (``Op.rank``: threshold, count descending then key ascending,
   cut to ``max_size``) and writes the ranked partition. Dask spreads these tasks over the workers, so a worker's
   memory holds about (distinct keys) / P entries at a time (a counting task: the distinct keys of at most
   ``TASK_ROWS`` rows). The merge is a progress pass of its own over the rows counted.
3. **Assign ids.** The client merges the ranked partitions of a column with a k-way merge, chunk by chunk
   (``etl.ops.counts.merge_ranked``), stopping at ``max_size``, and the op assigns ids in that order
   (``Op.finalize_ranked``), column after column as their partitions are merged, while the workers merge the
   next. The other partials are merged with ``Op.merge`` and finalized.

Both kinds of task run through ``etl.runtime.cluster_tasks.run_tasks``: the first error stops the others, a user error
reaches the client as itself, and a task whose workers keep dying is a ``ClusterError`` naming its piece or
partition.

Why spilled Parquet rather than Dask's shuffle: a count table is written once and read once per partition from
storage every worker sees anyway (the shards are there), the partition count is chosen after counting (from the
measured distinct keys) without rewriting anything, and nothing is kept in worker memory between the two steps.
A rerun task (a lost worker) rewrites its file whole (atomic rename; in object storage, one upload), so results do
not change. The work directory is a temporary directory (``temporary_path`` naming) inside ``workdir``, which must be
on storage shared by the client and every worker: a shared file system, or an object-storage prefix (an
``etl.io.fs.Url``: what the tasks spill travels through the store); it is removed when the stage ends, by success or
by error.

The result is the same state, to the byte, as the threaded fit's: merging is exact (integer counts, the
order-independent Normalize sums), and the merged ranking is the ranking of the merged counts.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial, reduce
from typing import TYPE_CHECKING, Any, cast

from etl.errors import ConfigError
from etl.io.files import temporary_path
from etl.io.fs import Location, remove_tree
from etl.io.parquet import open_shard
from etl.ops import Op
from etl.ops.counts import KeyCounts, merge_counts, merge_ranked
from etl.pipeline.plan import fit_plan
from etl.pipeline.spill import read_partition, read_ranked, write_partial, write_ranked
from etl.pipeline.stages import read_staged
from etl.runtime.cluster_tasks import Stop, run_tasks, share

if TYPE_CHECKING:
    from distributed import Client, Future

    from etl.pipeline.core import OnError, Pipeline
    from etl.runtime.progress import Progress

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


@dataclass(frozen=True)
class _Partition:
    """Partition ``index`` of ``partitions`` of the count table of column ``column`` of the op at ``position``: the
    rows of one merging task, which stands for ``rows`` rows of the merge pass's progress."""

    position: int
    column: str
    index: int
    partitions: int
    rows: int

    def __str__(self) -> str:
        return f"partition {self.index} of {self.partitions} of the counts of column '{self.column}' (op {self.position})"


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
    progress: Progress | None,
    name: str,
    partitions: int | None,
    workdir: Location,
) -> None:
    """Fit the ops of ``stage`` over ``shards`` with the workers of ``client`` (see the module docstring).
    ``progress`` hears of two passes: ``name`` (the rows of each row group counted) and ``name + " merge"`` (the
    rows whose counts are merged: each partition task stands for an equal share of the rows counted, reported as
    it reads the spilled counts of each piece)."""
    pieces = plan_pieces(pipeline, shards)
    if not pieces:  # no row group to count: the state of no rows, as the threaded fit gives it
        for op in stage:
            op.finalize(op.new_stats(pipeline.xp), pipeline.xp)
        return
    positions = [pipeline.ops.index(op) for op in stage]
    with _work_directory(workdir) as work:
        (work / "counts").mkdir()
        (work / "ranked").mkdir()
        shipped = share(client, pipeline, f"pipeline {pipeline.name}")
        results = _count(client, shipped, positions, pieces, on_error, work, _pass(progress, name))
        tables = sorted({key for r in results for key in r.spilled}, key=lambda ic: (ic[0], pipeline.ops[ic[0]].columns.index(ic[1])))
        if tables:
            counts = [partitions or default_partitions(sum(r.spilled[t][0] for r in results)) for t in tables]
            nulls = [sum(r.spilled[t][1] for r in results) for t in tables]
            rows = sum(r.rows for r in results)
            _merge(client, shipped, pipeline, tables, counts, nulls, len(pieces), rows, work, _pass(progress, f"{name} merge"))
    for i in positions:
        op = pipeline.ops[i]
        names = [c for j, c in results[0].partials if j == i]  # the op's accumulators (per column, or per output: TargetEncode)
        merged = {c: reduce(op.merge, (r.partials[(i, c)] for r in results)) for c in names}
        if merged:
            op.finalize_partials(merged, pipeline.xp)


def _describe_piece(item: tuple[int, Piece]) -> str:
    """A counting task's item, as errors name it: the shard and its row groups."""
    piece = item[1]
    return f"{piece.path}, row groups {piece.first}-{piece.stop - 1}"


def _pass(progress: Progress | None, name: str) -> Callable[[int], None] | None:
    """``progress`` of the pass ``name``."""
    return None if progress is None else partial(progress, name)


def _count(
    client: Client,
    shipped: Future,
    positions: list[int],
    pieces: list[Piece],
    on_error: OnError,
    work: Location,
    progress: Callable[[int], None] | None,
) -> list[Counted]:
    """Run the counting tasks of ``pieces``; their results in piece order."""
    results: list[Counted | None] = [None] * len(pieces)
    task = partial(_count_piece, positions, on_error, work)
    run_tasks(client, task, list(enumerate(pieces)), results.__setitem__, progress, shared=(shipped,), describe=_describe_piece)
    return cast("list[Counted]", results)


def _merge(
    client: Client,
    shipped: Future,
    pipeline: Pipeline,
    tables: list[tuple[int, str]],
    partitions: list[int],
    nulls: list[int],
    pieces: int,
    rows: int,
    work: Location,
    progress: Callable[[int], None] | None,
) -> None:
    """Merge every partition of every count table of ``tables`` (column ``c`` of the op at position ``i``, cut into
    ``partitions[t]`` partitions) in tasks, all submitted at once; the ids of each table are assigned here, in table
    order, as soon as its partitions and those of the tables before it are merged."""
    for i, c in tables:
        _column_dir(work / "ranked", pipeline.ops[i], i, c).mkdir()
    shares = iter(_shares(rows, sum(partitions)))
    items = [_Partition(i, c, p, n, next(shares)) for (i, c), n in zip(tables, partitions) for p in range(n)]
    left = dict(zip(tables, partitions))  # partitions of each table still merging
    assigned = 0

    def merged(k: int, entries: int) -> None:
        nonlocal assigned
        left[(items[k].position, items[k].column)] -= 1
        while assigned < len(tables) and not left[tables[assigned]]:
            i, c = tables[assigned]
            _assign_ids(pipeline, i, c, work, partitions[assigned], nulls[assigned])
            assigned += 1

    run_tasks(client, partial(_merge_partition, pieces, work), items, merged, progress, shared=(shipped,))


def _shares(total: int, n: int) -> list[int]:
    """``total`` cut into ``n`` integer shares as equal as can be (they sum to ``total``)."""
    return [total * (k + 1) // n - total * k // n for k in range(n)]


def _assign_ids(pipeline: Pipeline, i: int, c: str, work: Location, partitions: int, nulls: int) -> None:
    """Finalize column ``c`` of the op at position ``i`` from the k-way merge of its ranked partitions."""
    op, where = pipeline.ops[i], _column_dir(work / "ranked", pipeline.ops[i], i, c)
    with_texts = _with_texts(op, c)
    ranked = merge_ranked([read_ranked(where / _file(p), with_texts) for p in range(partitions)], op.max_size, with_texts)
    ranked.nulls = nulls
    op.finalize_ranked(c, ranked, pipeline.xp)


@contextlib.contextmanager
def _work_directory(workdir: Location) -> Iterator[Location]:
    """A fresh temporary directory inside ``workdir``, removed on exit (whatever ends the block)."""
    work = temporary_path(workdir / "fit")
    try:
        work.mkdir(parents=True)
    except OSError as e:
        raise ConfigError(f"cannot create the fit work directory {work}: {e}") from None
    try:
        yield work
    finally:
        _remove(work)


def _remove(work: Location, attempts: int = 100) -> None:
    """Remove the work directory. A task cancelled by an error may still be writing in it (Dask cannot stop a
    running task); once the directory is gone, such a task finds nowhere to write (tasks never create parent
    directories), so removal is retried until it succeeds (up to ``attempts`` tenths of a second). In object
    storage, where a key needs no directory, such a task's file may appear after the removal, under the work
    directory's temporary name: the next fit into the same place removes it (``etl.io.files.remove_temporaries``)."""
    for _ in range(attempts):
        remove_tree(work)
        if not work.exists():
            return
        time.sleep(0.1)


def _column_dir(root: Location, op: Op, i: int, c: str) -> Location:
    """The directory under ``root`` of column ``c`` of the op at position ``i`` (column names need not be file
    names)."""
    return root / f"{i:02d}-{op.columns.index(c)}"


def _file(j: int) -> str:
    return f"{j:06d}.parquet"


def _with_texts(op: Op, c: str) -> bool:
    """Whether the count table of column ``c`` keeps texts (string keys)."""
    return op.specs[c].encoding == "string"


# ---------------------------------------------------------------- tasks (run in the workers)


def _count_piece(
    positions: list[int], on_error: OnError, work: Location, pipeline: Pipeline, item: tuple[int, Piece], stop: Stop, progress: Callable[[int], None]
) -> Counted | None:
    """Count the rows of piece ``j`` (``item`` = (j, piece)) for the ops at ``positions``, reporting the rows of
    each row group to ``progress``; spill count tables as piece ``j``. None, and nothing spilled, when ``stop`` is
    set before the last row group."""
    j, piece = item
    stage = [pipeline.ops[i] for i in positions]
    prep, columns = fit_plan(pipeline, stage)
    xp = pipeline.xp
    stats = [op.new_stats(xp) for op in stage]
    shard = open_shard(piece.path, pipeline.schema)
    out = Counted(0)
    for g in range(piece.first, piece.stop):
        if stop.is_set():
            return None
        batch, stages = read_staged(pipeline.stages, shard, g, columns)
        t = pipeline.run_ops(batch, prep, on_error, labels=True, output=False)
        t.stages = stages
        for op, st in zip(stage, stats):
            op.partial_fit(st, t.batch, xp)
        rows = t.rows_read
        out.rows += rows
        progress(rows)
    for i, op, st in zip(positions, stage, stats):
        for c, part in op.partials(st, xp).items():
            if isinstance(part, KeyCounts):
                where = _column_dir(work / "counts", op, i, c)
                where.mkdir(exist_ok=True)  # not its parents: a task outliving its fit finds no directory to write in
                write_partial(where / _file(j), part)
                out.spilled[(i, c)] = (len(part), part.nulls)
            else:
                out.partials[(i, c)] = part
    return out


def _merge_partition(pieces: int, work: Location, pipeline: Pipeline, part: _Partition, stop: Stop, progress: Callable[[int], None]) -> int:
    """Merge ``part`` over the spilled partials of every piece, rank it and write it; returns its number of entries.
    ``progress`` hears of ``part.rows`` in equal shares, one as the counts of each piece are read. A merging task
    is short (one partition's run of each spilled file) and does not check ``stop``."""
    op = pipeline.ops[part.position]
    with_texts = _with_texts(op, part.column)
    spilled = _column_dir(work / "counts", op, part.position, part.column)
    shares = _shares(part.rows, pieces)

    def read(j: int) -> KeyCounts:
        counts = read_partition(spilled / _file(j), part.index, part.partitions, with_texts)
        if shares[j]:
            progress(shares[j])
        return counts

    ranked = op.rank(merge_counts(read(j) for j in range(pieces)))
    write_ranked(_column_dir(work / "ranked", op, part.position, part.column) / _file(part.index), ranked)
    return len(ranked)
