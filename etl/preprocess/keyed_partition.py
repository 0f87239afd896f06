"""The pieces of ``etl preprocess``'s exchange by key that run the same in threads (``etl.preprocess.keyed``) and
in tasks on a Dask cluster (``etl.preprocess.keyed_cluster``), so that both write the same bytes:

- ``spill_row_group``: one source row group through the row-scope stages into spilled rows (``etl.pipeline.exchange``),
  with the rows read, kept by each stage and their bytes, counted per key-hash bucket (``BucketCounts``);
- ``write_partition``: one sorted partition through the keyed step (``etl.preprocess.keyed_step``) into the
  temporary files of its output and quarantine files, with its manifest entry;
- ``PartitionCommits``: the partitions written, committed with the manifest one by one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from etl.errors import RowError
from etl.io.arrow import from_numpy, strings
from etl.io.files import ExclusiveParquetWriter, HashingFile, buffered_stream, temporary_path
from etl.io.fs import Location
from etl.io.processed import Manifest, ManifestEntry, StageRows, quarantine_name, write_manifest
from etl.ops.base import InvalidRows
from etl.pipeline import OnError, Pipeline
from etl.pipeline.core import Rejected
from etl.pipeline.exchange import BUCKETS, GROUP, HASH, INPUT, ROW, buckets, spilled
from etl.pipeline.split_rows import SplitStage
from etl.pipeline.stages import RowGroupAt
from etl.preprocess.keyed_step import KeyedStep, Sliced
from etl.preprocess.output import remove_stale
from etl.preprocess.shard import WrittenShard, commit_shard, discard_shard
from etl.runtime.cluster_tasks import Stop


@dataclass(frozen=True)
class KeyedJob:
    """What writing a partition needs of the run: the input ``shards`` (errors and quarantined rows name them by
    their index in this list), the ``on_error`` policy, the Parquet ``compression``, whether the rows are training
    rows (``Pipeline.transform``'s ``training``); ``split_stage``: for one split of a split run, the stage placing
    rows in it, applied to what the step makes of every row (History sees the whole timeline; the rows of other
    splits are then left out, counted as removed by it)."""

    shards: list[Location]
    on_error: OnError
    compression: str
    training: bool = False
    split_stage: SplitStage | None = None


@dataclass
class BucketCounts:
    """Per key-hash bucket (int64 [BUCKETS] each): the bytes spilled (``row_bytes``), the rows read, and per
    row-scope stage (int64 [stages, BUCKETS]) its rows in and out."""

    sizes: np.ndarray
    rows_read: np.ndarray
    stage_in: np.ndarray
    stage_out: np.ndarray

    @classmethod
    def zeros(cls, stages: int) -> BucketCounts:
        return cls(np.zeros(BUCKETS, np.int64), np.zeros(BUCKETS, np.int64), np.zeros((stages, BUCKETS), np.int64),
                   np.zeros((stages, BUCKETS), np.int64))  # fmt: skip

    def add(self, other: BucketCounts) -> None:
        """Add ``other``'s counts to these."""
        self.sizes += other.sizes
        self.rows_read += other.rows_read
        self.stage_in += other.stage_in
        self.stage_out += other.stage_out

    def of(self, lo: int, hi: int, pipeline: Pipeline) -> tuple[int, tuple[StageRows, ...]]:
        """The rows read whose key falls in buckets [lo, hi), and the rows in and out of each row-scope stage of
        ``pipeline`` there."""
        stages = tuple(StageRows(s.name, int(self.stage_in[k, lo:hi].sum()), int(self.stage_out[k, lo:hi].sum()))
                       for k, s in enumerate(pipeline.stages))  # fmt: skip
        return int(self.rows_read[lo:hi].sum()), stages


def spill_row_group(pipeline: Pipeline, step: KeyedStep, table: pa.Table, source: str, index: int, group: int,
                    first_row: int) -> tuple[pa.Table, BucketCounts]:  # fmt: skip
    """Row group ``group`` of ``source`` (the ``index``-th shard; ``table``, as read, starts at row ``first_row``)
    through ``pipeline``'s row-scope stages: the rows they keep as spilled rows (``etl.pipeline.exchange.spilled``,
    keyed by ``step``'s key hash), and the counts per bucket."""
    hashes, usable = step.key_hashes(table, source, group, first_row)
    b = buckets(hashes, usable)
    rows = np.arange(table.num_rows, dtype=np.int64)
    counts = BucketCounts.zeros(len(pipeline.stages))
    at = RowGroupAt(source, group, first_row)
    for k, stage in enumerate(pipeline.stages):
        kept = stage.select(table, rows, at)
        counts.stage_in[k] = np.bincount(b[rows], minlength=BUCKETS)
        counts.stage_out[k] = np.bincount(b[kept], minlength=BUCKETS)
        rows = kept
    out, counts.sizes = spilled(table, rows, pipeline.schema, hashes, usable, source, index, group, first_row)
    counts.rows_read = np.bincount(b, minlength=BUCKETS)
    return out, counts


def write_partition(job: KeyedJob, pipeline: Pipeline, step: KeyedStep, table: pa.Table, counted: tuple[int, tuple[StageRows, ...]], p: int,
                    count: int, out: Location, stop: Stop, progress: Callable[[int], None] | None) -> WrittenShard | None:  # fmt: skip
    """Write partition ``p`` (of ``count``; ``table``: its spilled rows, sorted as ``read_partition`` sorts them;
    ``counted``: its rows read and row-scope stages' rows, ``BucketCounts.of``) to temporary files of ``out`` and
    of its quarantine file; None when stopped. ``progress`` hears of the rows transformed."""
    quarantine = out.parent / quarantine_name(out.name)
    out_tmp, q_tmp = temporary_path(out), temporary_path(quarantine)
    rows_out = rows_q = removed = dropped = 0
    q_writer: ExclusiveParquetWriter | None = None
    done = False
    mine = None if job.split_stage is None else _in_split(job, job.split_stage, table)
    start = 0
    try:
        schema = pipeline.output_schema()
        with HashingFile(out_tmp) as sink, buffered_stream(sink) as stream, \
                pq.ParquetWriter(stream, schema, use_dictionary=False, compression=job.compression, write_statistics=False) as writer:  # fmt: skip
            for s in _source_errors(job, step, table, p, stop):
                if s is None:
                    return None
                if mine is not None:
                    s, start = _routed(s, mine, start), start + s.rows
                writer.write_table(s.table)
                rows_out += s.table.num_rows
                removed += s.removed
                dropped += s.groups_dropped
                if s.rejected:
                    q = _quarantine_table(job, table, s.rejected, step)
                    if q_writer is None:
                        q_tmp.parent.mkdir(exist_ok=True)
                        q_writer = ExclusiveParquetWriter(q_tmp, q.schema)
                    q_writer.write_table(q)
                    rows_q += q.num_rows
                if progress is not None:
                    progress(s.rows)
        if q_writer is not None:
            q_writer.close()
            q_writer = None
        rows_in, stages = counted
        placed = table.num_rows if mine is None else int(mine.sum())
        if job.split_stage is not None:
            stages += (StageRows(job.split_stage.name, table.num_rows, placed),)
        stages += (StageRows(step.name, placed, placed - removed, dropped if step.groups else None),)
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


def _in_split(job: KeyedJob, stage: SplitStage, table: pa.Table) -> np.ndarray:
    """Whether each row of a partition (``table``, spilled rows) lies in the split of ``stage``; a ``RowError``
    naming its shard for a row that cannot be placed."""
    inputs, rows = (np.asarray(table.column(c).to_numpy(), np.int64) for c in (INPUT, ROW))
    columns = stage.assignment.columns
    try:
        roles = stage.assignment.roles(table.select(columns) if columns else None, inputs, rows)
    except InvalidRows as e:
        i = int(np.flatnonzero(e.mask)[0])
        raise RowError(str(job.shards[inputs[i]]), int(table.column(GROUP)[i].as_py()), int(rows[i]), e.column, e.reason) from None
    return roles == stage.code


def _routed(s: Sliced, mine: np.ndarray, start: int) -> Sliced:
    """Slice ``s`` (of the partition rows ``start..``) with only the rows ``mine`` marks in the partition; its
    ``removed``: those of them the step removed."""
    if s.positions is None:
        raise RuntimeError("the keyed step does not say which row each output row is: a split run cannot route its rows")
    keep = mine[s.positions]
    rejected = [Rejected(r.rows[mine[r.rows]], r.column, r.reason) for r in s.rejected]
    rejected = [r for r in rejected if len(r.rows)]
    table = s.table if keep.all() else s.table.filter(from_numpy(keep))
    placed = int(mine[start : start + s.rows].sum())
    return Sliced(s.rows, table, rejected, placed - table.num_rows - sum(len(r.rows) for r in rejected), s.groups_dropped, s.positions[keep])


def _source_errors(job: KeyedJob, step: KeyedStep, table: pa.Table, p: int, stop: Stop) -> Iterator[Sliced | None]:
    """The slices ``step`` makes of partition ``p`` (``table``), then None once ``stop`` is set; a ``RowError``
    (naming a row by its position in the partition) named by the row's shard, row group and row."""
    slices = step.transform(table, p, job.on_error, job.training)
    while not stop.is_set():
        try:
            s = next(slices, None)
        except RowError as e:
            where = [int(table.column(c)[e.row].as_py()) for c in (INPUT, GROUP, ROW)]
            raise RowError(str(job.shards[where[0]]), where[1], where[2], step.column_name(e.column), e.problem) from None
        if s is None:
            return
        yield s
    yield None


def _quarantine_table(job: KeyedJob, table: pa.Table, rejected: list[Rejected], step: KeyedStep) -> pa.Table:
    """The rejected rows of a slice of a partition (``table``; ``rejected``: their positions in it) as read, in
    their raw-layout types, with ``_source``, ``_row``, ``_column`` and ``_reason``, ordered by shard and row."""
    positions = np.concatenate([r.rows for r in rejected])
    columns = [step.column_name(r.column) for r in rejected for _ in r.rows]
    reasons = [r.reason for r in rejected for _ in r.rows]
    inputs = np.asarray(table.column(INPUT).to_numpy(), np.int64)[positions]
    rows = np.asarray(table.column(ROW).to_numpy(), np.int64)[positions]
    order = np.lexsort((rows, inputs))
    q = table.select(pipeline_columns(table)).take(from_numpy(positions[order]))
    q = q.append_column("_source", strings([str(job.shards[i]) for i in inputs[order]]))
    q = q.append_column("_row", from_numpy(rows[order]))
    q = q.append_column("_column", strings([columns[i] for i in order]))
    return q.append_column("_reason", strings([reasons[i] for i in order]))


def pipeline_columns(piece: pa.Table) -> list[str]:
    """The schema columns of a spilled table (its position columns left out)."""
    return [c for c in piece.column_names if c not in (HASH, INPUT, GROUP, ROW)]


class PartitionCommits:
    """The partitions of a run into ``out_dir`` (``count`` of them) committed with the manifest of ``pipeline_name``
    one by one, each with the artifacts' checksum ``sha``. The earlier run's files (``previous``: its manifest
    entries) are removed just before the first partition is committed, or at once when there is no earlier run
    (``etl.preprocess.run``'s rule: a run that fails or stops before then leaves the earlier output whole).
    ``training``: what the manifest records of the rows (``Manifest.training``; None: nothing)."""

    def __init__(self, out_dir: Location, pipeline_name: str, count: int, previous: dict[str, ManifestEntry], sha: str,
                 training: bool | None = None):  # fmt: skip
        self.out_dir, self.name, self.count, self.previous, self.sha = out_dir, pipeline_name, count, previous, sha
        self.training = training
        self.entries: dict[str, ManifestEntry] = {}
        self._lock = threading.Lock()
        self._taken_over = False
        if not previous:
            with self._lock:
                self._take_over()

    def commit(self, written: WrittenShard, stopping: threading.Event | None = None) -> None:
        """Commit ``written`` and list it in the manifest; when the run is ``stopping`` (another partition failed)
        and nothing is committed yet, discard it instead, keeping the earlier output whole."""
        with self._lock:
            if stopping is not None and stopping.is_set() and not self._taken_over:
                discard_shard(written)
                return
            self._take_over()
            entry = commit_shard(self.out_dir, written)
            self.entries[entry.output] = replace(entry, artifacts_sha256=self.sha)
            self._save()

    def _take_over(self) -> None:
        if not self._taken_over:
            remove_stale(self.out_dir, self.previous, set())
            self._save()
            self._taken_over = True

    def _save(self) -> None:
        entries = list(self.entries.values())
        write_manifest(self.out_dir, Manifest.of(self.name, entries, complete=len(entries) == self.count, training=self.training))
