"""``etl preprocess`` of a pipeline with a keyed step (``History``, ``etl.ops.history``; ``Groupby``,
``etl.pipeline.groupby``): fit, exchange by key, then transform each partition in key and order.

1. Fit: the fittable ops are fitted on the raw shards as by ``Pipeline.fit`` (threads; their statistics do not
   depend on row order), unless artifacts are given; the artifacts are saved.
2. Exchange (``etl.pipeline.exchange``): each row group is read, run through the row-scope stages (Filter), and its
   rows spilled, with their key's hash (``KeyedStep.key_hashes``) and input position (shard index in input order,
   row number in the file), to a temporary directory inside the output directory (the system's temporary
   directory for an output in object storage), removed when the run ends, however it ends. The buckets are then
   cut into partitions by the bytes of their rows: at most ``PARTITION_BYTES`` (16 MiB) each, so that the workers
   share the transform of a few million rows, or a quarter of the memory budget (``--memory-budget``) when less.
3. Transform: each partition is read whole, sorted by (key hash, the step's order columns, input position) and
   given to the step (``etl.preprocess.keyed_step``: History's in ``etl.preprocess.keyed_history``, Groupby's in
   ``etl.preprocess.keyed_groupby``), which runs the ops over it and yields the output slice by slice. Partition
   ``p`` becomes output file ``p`` (``part-0000p.parquet``, one row group per slice), in ``workers`` threads,
   each partition committed with the manifest as ``etl preprocess`` commits a shard.

Memory: a partition being sorted is held about twice (``etl.pipeline.exchange``); a thread takes a partition only
while the partitions in progress stay within the budget (or none is in progress), so a run holds at most the
budget, whatever ``workers``; a partition holds at least one key's rows (a key larger than a partition's bytes is a
partition of its own).

The output: rows in the order of the partitions (key hash ranges ascending), each partition in its sort order, so the
output files taken in order hold the rows (History) or groups (Groupby) by key hash, then order, whatever the number
of partitions, workers or shards; the same bytes for any number of workers and any cut of the same rows into shards
(the partitions depend on the rows and the budget only, never on the workers). Each manifest entry describes a
partition: its ``source`` is ``<exchange by key 'K': partition p of P>`` (no single shard: ``source_bytes`` is 0),
``rows_in`` counts the rows read whose key falls in it, and its stages list the row-scope stages' rows in and out,
then the step's: the rows that reached the exchange, and those it passed on (written or quarantined; Groupby's also
count ``groups_dropped``). Its quarantine file holds the rejected rows in their raw-layout types
(``etl.io.text.raw_arrow_schema``) with ``_source`` (the shard), ``_row``, ``_column`` and ``_reason``, ordered by
shard and row; errors name the shard, row group and row.

A rerun transforms everything again (every output depends on every shard). With a Dask client (``--cluster``) the
fit runs on the cluster and the exchange through Dask's shuffle, cut into the same partitions, written by the same
code: the same bytes (``etl.preprocess.keyed_cluster``). The npy format is not available with a keyed step
(``ConfigError``; ``ListColumnsError`` when it writes lists, which have no fixed width).
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from etl.errors import ConfigError
from etl.io.files import temporary_path
from etl.io.fs import Location, remove_tree
from etl.io.npy import ListColumnsError
from etl.io.parquet import open_shard
from etl.io.processed import ManifestEntry, Totals, part_path
from etl.ops.history import History
from etl.ops.target import TargetEncode
from etl.pipeline import Pipeline, check_match
from etl.pipeline.exchange import plan, read_partition, write_spilled
from etl.preprocess.keyed_groupby import GroupbyStep
from etl.preprocess.keyed_history import HistoryStep
from etl.preprocess.keyed_partition import BucketCounts, KeyedJob, PartitionCommits, spill_row_group, write_partition
from etl.preprocess.keyed_step import KeyedStep
from etl.preprocess.output import previous_run, save_artifacts
from etl.preprocess.run import RunSettings, Summary  # it imports this module when it runs
from etl.runtime.workers import run_workers

#: A partition holds at most this many bytes of rows (``row_bytes``), so that several workers share the transform
#: of a few million rows; and ...
PARTITION_BYTES = 16 << 20
#: ... at most this fraction of the memory budget (a thread holds it about twice while sorting).
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


def check_keyed(pipeline: Pipeline, formats: tuple[str, ...]) -> bool:
    """Whether ``pipeline`` has a keyed step, checked to run here: ``ConfigError`` with more than one keyed step,
    ``ListColumnsError`` with the npy format (``ConfigError`` when the step writes no lists)."""
    step = keyed_step(pipeline)
    if step is None:
        return False
    if "npy" in formats:
        if step.lists:
            raise ListColumnsError(f"{step.name} writes list columns ({', '.join(step.lists)}): the npy format holds fixed-width columns only")
        raise ConfigError(f"etl preprocess writes the output of {step.name} as Parquet only: leave out --format npy")
    return True


def partition_bytes(memory_budget: int) -> int:
    """The most bytes of rows (``etl.pipeline.exchange.row_bytes``) a partition holds with ``memory_budget``:
    ``PARTITION_BYTES``, or ``PARTITION_FRACTION`` of the budget when that is less."""
    return max(1, min(PARTITION_BYTES, int(memory_budget * PARTITION_FRACTION)))


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
        pipeline.fit(run.shards, workers=run.workers, on_error=run.on_error, progress=run.progress, client=run.client, partitions=run.partitions,
                     workdir=run.out_dir if run.client is not None else None)  # fmt: skip
        fit_seconds = time.perf_counter() - t0
    step = keyed_step(pipeline)  # of the fitted pipeline: its output types are known now
    if step is None:
        raise ValueError("the pipeline has no keyed step")
    run = replace(run, training=run.training if run.training is not None else fit_seconds is not None)
    _check_training_folds(pipeline, step, bool(run.training))
    previous, _ = previous_run(run.out_dir)
    sha = save_artifacts(pipeline, run.out_dir)
    t1 = time.perf_counter()
    target = partition_bytes(memory_budget)
    if run.client is not None:
        from etl.preprocess.keyed_cluster import transform_on_cluster  # Dask is imported only for a cluster

        entries = transform_on_cluster(run, pipeline, step, target, previous, sha)
    else:
        local = run.out_dir if isinstance(run.out_dir, Path) else Path(tempfile.gettempdir())
        work = temporary_path(local / "exchange")
        work.mkdir()
        try:
            files, counts = _exchange(run, pipeline, step, work)
            entries = _transform(run, pipeline, step, files, counts, plan(counts.sizes, target), previous, sha, memory_budget)
        finally:
            remove_tree(work)
    totals = Totals.of(entries)
    return Summary(files=len(entries), files_skipped=0, rows_in=totals.rows_in, rows_out=totals.rows_out, rows_quarantined=totals.rows_quarantined,
                   rows_processed=totals.rows_in, fit_seconds=fit_seconds, transform_seconds=time.perf_counter() - t1,
                   memory_budget=memory_budget, stages=totals.stages)  # fmt: skip


def _check_training_folds(pipeline: Pipeline, step: KeyedStep, training: bool) -> None:
    """``ConfigError`` when training rows are to be transformed by a TargetEncode whose folds follow the input
    position: the exchange by key regroups the rows, whose file and row are not at hand where the ops run."""
    for op in pipeline.ops if training else []:
        if isinstance(op, TargetEncode) and op.fold_by is None:
            raise ConfigError(f"{pipeline.path}: TargetEncode ({', '.join(op.names)}) gives training rows out-of-fold values by the fold "
                              f"of their input position, which {step.name}'s exchange by key does not keep: give it fold_by "
                              "(a column such as the user id)")  # fmt: skip


def _exchange(run: RunSettings, pipeline: Pipeline, step: KeyedStep, work: Path) -> tuple[list[Path], BucketCounts]:
    """Spill every row group of every shard into ``work`` (in ``run.workers`` threads): the spilled files, in name
    order, and the counts per bucket."""
    files: list[Path] = []
    counts = BucketCounts.zeros(len(pipeline.stages))
    lock = threading.Lock()

    def work_shard(_w: int, index: int, stop: threading.Event) -> None:
        path = run.shards[index]
        shard = open_shard(path, pipeline.schema)
        for i in range(shard.num_row_groups):
            if stop.is_set():
                return
            table = shard.read_table(i)
            rows, counted = spill_row_group(pipeline, step, table, str(path), index, i, shard.row_group_starts[i])
            target = work / f"{index:06d}-{i:06d}.arrow"
            write_spilled(target, rows)
            with lock:
                files.append(target)
                counts.add(counted)
            if run.progress is not None:
                run.progress("exchange", table.num_rows)
            del table, rows  # one row group held at a time: this one goes before the next is read

    run_workers(list(range(len(run.shards))), run.workers, work_shard)
    return sorted(files), counts


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


def _transform(run: RunSettings, pipeline: Pipeline, step: KeyedStep, files: list[Path], counts: BucketCounts, ranges: list[tuple[int, int]],
               previous: dict[str, ManifestEntry], sha: str, budget: int) -> list[ManifestEntry]:  # fmt: skip
    """Transform every partition (``ranges``), committing each with the manifest; the entries, in output order."""
    outputs = [part_path(run.out_dir, p) for p in range(len(ranges))]
    commits = PartitionCommits(run.out_dir, pipeline.name, len(ranges), previous, sha, bool(run.training) if pipeline.training_differs else None)
    gate = _ByteGate(budget)
    job = KeyedJob(run.shards, run.on_error, run.compression, bool(run.training), run.split_stage)
    progress = None if run.progress is None else functools.partial(run.progress, "transform")

    def work(_w: int, p: int, stop: threading.Event) -> None:
        lo, hi = ranges[p]
        with gate.holding(2 * int(counts.sizes[lo:hi].sum()), stop) as go:
            if not go:
                return
            table = read_partition(files, lo, hi, pipeline.schema, len(run.shards), step.order)
            written = write_partition(job, pipeline, step, table, counts.of(lo, hi, pipeline), p, len(ranges), outputs[p], stop, progress)
        if written is not None:
            commits.commit(written, stop)

    run_workers(list(range(len(ranges))), run.workers, work)
    return [commits.entries[o.name] for o in outputs]
