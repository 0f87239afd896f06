"""``etl preprocess`` of a pipeline with a keyed step (``History``, ``etl.ops.history``; ``Groupby``,
``etl.pipeline.groupby``): fit, exchange by key, then transform each partition in key and order.

1. Fit: the fittable ops are fitted on the raw shards as by ``Pipeline.fit`` (threads; their statistics do not
   depend on row order), unless artifacts are given; the artifacts are saved.
2. Exchange (``etl.pipeline.exchange``): each row group is read, run through the row-scope stages (Filter), and its
   rows spilled, with their key's hash (``KeyedStep.key_hashes``) and input position (shard index in input order,
   row number in the file), to a temporary directory inside the output directory (the system's temporary
   directory for an output in object storage), removed when the run ends, however it ends. The buckets are then
   cut into partitions of at most a quarter of the memory budget (``--memory-budget``) each, by the bytes of their
   rows.
3. Transform: each partition is read whole, sorted by (key hash, the step's order columns, input position) and
   given to the step (``etl.preprocess.keyed_step``: History's in ``etl.preprocess.keyed_history``, Groupby's in
   ``etl.preprocess.keyed_groupby``), which runs the ops over it and yields the output slice by slice. Partition
   ``p`` becomes output file ``p`` (``part-0000p.parquet``, one row group per slice), in ``workers`` threads,
   each partition committed with the manifest as ``etl preprocess`` commits a shard.

Memory: a partition being sorted is held about twice (``etl.pipeline.exchange``); a thread takes a partition only
while the partitions in progress stay within the budget (or none is in progress), so a run holds at most the
budget, whatever ``workers``; a partition holds at least one key's rows (a key larger than a quarter of the
budget is a partition of its own).

The output: rows in the order of the partitions (key hash ranges ascending), each partition in its sort order, so
the output files taken in order hold the rows (History) or groups (Groupby) by key hash, then order, whatever the
number of partitions, workers or shards; the same bytes for any number of workers and any cut of the same rows
into shards (the partitions depend on the rows and the budget only). Each manifest entry describes a partition:
its ``source`` is ``<exchange by key 'K': partition p of P>`` (no single shard: ``source_bytes`` is 0),
``rows_in`` counts the rows read whose key falls in it, and its stages list the row-scope stages' rows in and out,
then the step's: the rows that reached the exchange, and those it passed on (written or quarantined; Groupby's
also count ``groups_dropped``). Its quarantine file holds the rejected rows in their raw-layout types
(``etl.io.text.raw_arrow_schema``) with ``_source`` (the shard), ``_row``, ``_column`` and ``_reason``, ordered by
shard and row; errors name the shard, row group and row.

A rerun transforms everything again (every output depends on every shard). ``--cluster`` and the npy format are
not available with a keyed step (``ConfigError``; ``ListColumnsError`` when it writes lists, which have no fixed
width).
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from etl.errors import ConfigError, RowError
from etl.io.arrow import from_numpy, strings
from etl.io.files import ExclusiveParquetWriter, HashingFile, buffered_stream, temporary_path
from etl.io.fs import Location, remove_tree
from etl.io.npy import ListColumnsError
from etl.io.parquet import open_shard
from etl.io.processed import Manifest, ManifestEntry, StageRows, Totals, part_path, quarantine_name, write_manifest
from etl.ops.history import History
from etl.pipeline import Pipeline, check_match
from etl.pipeline.core import Rejected
from etl.pipeline.exchange import BUCKETS, GROUP, HASH, INPUT, ROW, buckets, plan, read_partition, spill
from etl.preprocess.keyed_groupby import GroupbyStep
from etl.preprocess.keyed_history import HistoryStep
from etl.preprocess.keyed_step import KeyedStep, Sliced
from etl.preprocess.output import previous_run, remove_stale, save_artifacts
from etl.preprocess.run import RunSettings, Summary  # it imports this module when it runs
from etl.preprocess.shard import WrittenShard, commit_shard, discard_shard
from etl.runtime.workers import run_workers

#: A partition holds at most this fraction of the memory budget (a thread holds it about twice while sorting).
PARTITION_FRACTION = 0.25


def keyed_step(pipeline: Pipeline) -> KeyedStep | None:
    """The pipeline's keyed step (its History op, or its Groupby), or None; ``ConfigError`` for more than one (each
    needs an exchange by its own key)."""
    keyed = [op for op in pipeline.ops if op.keyed]
    if len(keyed) > 1:
        raise ConfigError(f"{pipeline.path}: {len(keyed)} History ops; a pipeline has at most one")
    if keyed and pipeline.groupby is not None:
        raise ConfigError(f"{pipeline.path}: History and Groupby each need an exchange by their own key; a pipeline has at most one of them")
    if pipeline.groupby is not None:
        return GroupbyStep(pipeline)
    return HistoryStep(keyed[0], pipeline) if keyed and isinstance(keyed[0], History) else None


def check_keyed(pipeline: Pipeline, client: object, formats: tuple[str, ...]) -> bool:
    """Whether ``pipeline`` has a keyed step, checked to run here: ``ConfigError`` with a Dask ``client`` or more
    than one keyed step, ``ListColumnsError`` with the npy format (``ConfigError`` when the step writes no lists)."""
    step = keyed_step(pipeline)
    if step is None:
        return False
    if client is not None:
        raise ConfigError(f"{step.name} needs an exchange by key, which etl preprocess runs in threads: leave out --cluster")
    if "npy" in formats:
        if step.lists:
            raise ListColumnsError(f"{step.name} writes list columns ({', '.join(step.lists)}): the npy format holds fixed-width columns only")
        raise ConfigError(f"etl preprocess writes the output of {step.name} as Parquet only: leave out --format npy")
    return True


@dataclass
class _Exchanged:
    """What the exchange left: the spilled files, the bytes per bucket, and per bucket the rows read and each
    row-scope stage's rows in and out."""

    files: list[Path]
    sizes: np.ndarray
    rows_read: np.ndarray
    stage_in: np.ndarray
    stage_out: np.ndarray


def preprocess_keyed(run: RunSettings, pipeline: Pipeline, artifacts: Location | None, memory_budget: int) -> Summary:
    """``etl preprocess`` of ``pipeline`` (which has a keyed step), with ``run.out_dir`` locked (see the module
    docstring)."""
    t0 = time.perf_counter()
    fit_seconds = None
    if artifacts is not None:
        fitted = Pipeline.load(artifacts)
        check_match(fitted, pipeline, artifacts)
        pipeline = fitted
    elif not pipeline.is_fitted:
        pipeline.fit(run.shards, workers=run.workers, on_error=run.on_error, progress=run.progress)
        fit_seconds = time.perf_counter() - t0
    step = keyed_step(pipeline)  # of the fitted pipeline: its output types are known now
    if step is None:
        raise ValueError("the pipeline has no keyed step")
    previous, _ = previous_run(run.out_dir)
    sha = save_artifacts(pipeline, run.out_dir)
    t1 = time.perf_counter()
    local = run.out_dir if isinstance(run.out_dir, Path) else Path(tempfile.gettempdir())
    work = temporary_path(local / "exchange")
    work.mkdir()
    try:
        exchanged = _exchange(run, pipeline, step, work)
        ranges = plan(exchanged.sizes, max(1, int(memory_budget * PARTITION_FRACTION)))
        entries = _transform(run, pipeline, step, exchanged, ranges, previous, sha, memory_budget)
    finally:
        remove_tree(work)
    totals = Totals.of(entries)
    return Summary(files=len(ranges), files_skipped=0, rows_in=totals.rows_in, rows_out=totals.rows_out, rows_quarantined=totals.rows_quarantined,
                   rows_processed=totals.rows_in, fit_seconds=fit_seconds, transform_seconds=time.perf_counter() - t1,
                   memory_budget=memory_budget, stages=totals.stages)  # fmt: skip


def _exchange(run: RunSettings, pipeline: Pipeline, step: KeyedStep, work: Path) -> _Exchanged:
    """Spill every row group of every shard into ``work`` (in ``run.workers`` threads)."""
    stages = pipeline.stages
    out = _Exchanged([], np.zeros(BUCKETS, np.int64), np.zeros(BUCKETS, np.int64), np.zeros((len(stages), BUCKETS), np.int64),
                     np.zeros((len(stages), BUCKETS), np.int64))  # fmt: skip
    lock = threading.Lock()

    def work_shard(_w: int, index: int, stop: threading.Event) -> None:
        path = run.shards[index]
        shard = open_shard(path, pipeline.schema)
        for i in range(shard.num_row_groups):
            if stop.is_set():
                return
            table = shard.read_table(i)
            hashes, usable = step.key_hashes(table, str(path), i, shard.row_group_starts[i])
            b = buckets(hashes, usable)
            rows = np.arange(table.num_rows, dtype=np.int64)
            stage_in, stage_out = np.zeros_like(out.stage_in), np.zeros_like(out.stage_out)
            for k, stage in enumerate(stages):  # the row-scope stages, counted per bucket
                kept = stage.select(table, rows)
                stage_in[k] = np.bincount(b[rows], minlength=BUCKETS)
                stage_out[k] = np.bincount(b[kept], minlength=BUCKETS)
                rows = kept
            target = work / f"{index:06d}-{i:06d}.parquet"
            sizes = spill(target, table, rows, pipeline.schema, hashes, usable, str(path), index, i, shard.row_group_starts[i])
            with lock:
                out.files.append(target)
                out.sizes += sizes
                out.rows_read += np.bincount(b, minlength=BUCKETS)
                out.stage_in += stage_in
                out.stage_out += stage_out
            if run.progress is not None:
                run.progress("exchange", table.num_rows)

    run_workers(list(range(len(run.shards))), run.workers, work_shard)
    out.files.sort()
    return out


class _ByteGate:
    """Lets a thread take a partition while the partitions in progress hold at most ``budget`` bytes (one always
    may, when none is in progress)."""

    def __init__(self, budget: int):
        self.budget, self.held = budget, 0
        self.cond = threading.Condition()

    @contextlib.contextmanager
    def holding(self, size: int, stop: threading.Event) -> Iterator[bool]:
        with self.cond:
            while self.held and self.held + size > self.budget and not stop.is_set():
                self.cond.wait(0.1)
            self.held += size
        try:
            yield not stop.is_set()
        finally:
            with self.cond:
                self.held -= size
                self.cond.notify_all()


def _transform(run: RunSettings, pipeline: Pipeline, step: KeyedStep, exchanged: _Exchanged, ranges: list[tuple[int, int]],
               previous: dict[str, ManifestEntry], sha: str, budget: int) -> list[ManifestEntry]:  # fmt: skip
    """Transform every partition (``ranges``), committing each with the manifest; the entries, in output order."""
    outputs = [part_path(run.out_dir, p) for p in range(len(ranges))]
    entries: dict[str, ManifestEntry] = {}
    lock = threading.Lock()
    gate = _ByteGate(budget)

    def save_manifest() -> None:
        write_manifest(run.out_dir, Manifest.of(pipeline.name, list(entries.values()), complete=len(entries) == len(ranges)))

    taken_over = False

    def take_over() -> None:
        """Remove the earlier run's files and list this run's (none yet): once, just before the first partition is
        committed, or at once when there is no earlier run (``etl.preprocess.run``'s rule: a run that fails or
        stops before then leaves the earlier output whole)."""
        nonlocal taken_over
        if not taken_over:
            remove_stale(run.out_dir, previous, set())
            save_manifest()
            taken_over = True

    if not previous:
        take_over()

    def work(_w: int, p: int, stop: threading.Event) -> None:
        lo, hi = ranges[p]
        with gate.holding(2 * int(exchanged.sizes[lo:hi].sum()), stop) as go:
            if not go:
                return
            written = _partition(run, pipeline, step, exchanged, (lo, hi), p, len(ranges), outputs[p], stop)
        if written is None:
            return
        with lock:
            if stop.is_set() and not taken_over:  # another partition failed first: keep the earlier output whole
                discard_shard(written)
                return
            take_over()
            entry = commit_shard(run.out_dir, written)
            entries[entry.output] = replace(entry, artifacts_sha256=sha)
            save_manifest()

    run_workers(list(range(len(ranges))), run.workers, work)
    return [entries[o.name] for o in outputs]


def _partition(run: RunSettings, pipeline: Pipeline, step: KeyedStep, exchanged: _Exchanged, span: tuple[int, int], p: int, count: int,
               out: Location, stop: threading.Event) -> WrittenShard | None:  # fmt: skip
    """Write partition ``p`` (of ``count``: the rows of the buckets ``span`` [lo, hi)) to temporary files of ``out``
    and of its quarantine file; None when stopped."""
    lo, hi = span
    table = read_partition(exchanged.files, lo, hi, pipeline.schema, len(run.shards), step.order)
    quarantine = out.parent / quarantine_name(out.name)
    out_tmp, q_tmp = temporary_path(out), temporary_path(quarantine)
    rows_out = rows_q = removed = dropped = 0
    q_writer: ExclusiveParquetWriter | None = None
    done = False
    try:
        schema = pipeline.output_schema()
        with HashingFile(out_tmp) as sink, buffered_stream(sink) as stream, \
                pq.ParquetWriter(stream, schema, use_dictionary=False, compression=run.compression, write_statistics=False) as writer:  # fmt: skip
            for s in _source_errors(run, step, table, p, stop):
                if s is None:
                    return None
                writer.write_table(s.table)
                rows_out += s.table.num_rows
                removed += s.removed
                dropped += s.groups_dropped
                if s.rejected:
                    q = _quarantine_table(run, table, s.rejected, step)
                    if q_writer is None:
                        q_tmp.parent.mkdir(exist_ok=True)
                        q_writer = ExclusiveParquetWriter(q_tmp, q.schema)
                    q_writer.write_table(q)
                    rows_q += q.num_rows
                if run.progress is not None:
                    run.progress("transform", s.rows)
        if q_writer is not None:
            q_writer.close()
            q_writer = None
        rows_in = int(exchanged.rows_read[lo:hi].sum())
        stages = tuple(StageRows(s.name, int(exchanged.stage_in[k, lo:hi].sum()), int(exchanged.stage_out[k, lo:hi].sum()))
                       for k, s in enumerate(pipeline.stages))  # fmt: skip
        stages += (StageRows(step.name, table.num_rows, table.num_rows - removed, dropped if step.groups else None),)
        if rows_in != rows_out + rows_q + sum(s.rows_in - s.rows_out for s in stages) or stages[0].rows_in != rows_in:
            raise RuntimeError(f"partition {p}: row accounting broke: {rows_in} in, {rows_out} out, {rows_q} quarantined, stages {stages}")
        entry = ManifestEntry(output=out.name, source=f"<exchange by key '{step.key}': partition {p} of {count}>", source_bytes=0, rows_in=rows_in,
                              rows_out=rows_out, rows_quarantined=rows_q, quarantine=quarantine_name(out.name) if rows_q else None,
                              sha256=sink.hexdigest(), stages=stages)  # fmt: skip
        done = True
        return WrittenShard(entry, out_tmp, q_tmp if rows_q else None)
    finally:
        if q_writer is not None:
            q_writer.close()
        if not done:
            out_tmp.unlink(missing_ok=True)
            q_tmp.unlink(missing_ok=True)


def _source_errors(run: RunSettings, step: KeyedStep, table: pa.Table, p: int, stop: threading.Event) -> Iterator[Sliced | None]:
    """The slices ``step`` makes of partition ``p`` (``table``), then None once ``stop`` is set; a ``RowError``
    (naming a row by its position in the partition) named by the row's shard, row group and row."""
    slices = step.transform(table, p, run.on_error)
    while not stop.is_set():
        try:
            s = next(slices, None)
        except RowError as e:
            where = [int(table.column(c)[e.row].as_py()) for c in (INPUT, GROUP, ROW)]
            raise RowError(str(run.shards[where[0]]), where[1], where[2], step.column_name(e.column), e.problem) from None
        if s is None:
            return
        yield s
    yield None


def _quarantine_table(run: RunSettings, table: pa.Table, rejected: list[Rejected], step: KeyedStep) -> pa.Table:
    """The rejected rows of a slice of a partition (``table``; ``rejected``: their positions in it) as read, in
    their raw-layout types, with ``_source``, ``_row``, ``_column`` and ``_reason``, ordered by shard and row."""
    positions = np.concatenate([r.rows for r in rejected])
    columns = [step.column_name(r.column) for r in rejected for _ in r.rows]
    reasons = [r.reason for r in rejected for _ in r.rows]
    inputs = np.asarray(table.column(INPUT).to_numpy(), np.int64)[positions]
    rows = np.asarray(table.column(ROW).to_numpy(), np.int64)[positions]
    order = np.lexsort((rows, inputs))
    q = table.select(pipeline_columns(table)).take(from_numpy(positions[order]))
    q = q.append_column("_source", strings([str(run.shards[i]) for i in inputs[order]]))
    q = q.append_column("_row", from_numpy(rows[order]))
    q = q.append_column("_column", strings([columns[i] for i in order]))
    return q.append_column("_reason", strings([reasons[i] for i in order]))


def pipeline_columns(piece: pa.Table) -> list[str]:
    """The schema columns of a spilled table (its position columns left out)."""
    return [c for c in piece.column_names if c not in (HASH, INPUT, GROUP, ROW)]
