"""One shard of ``etl preprocess``: its row groups transformed (``RowGroupTransform``) and written under temporary
names (``process_shard``: the Parquet file, the quarantine file, the npy chunks, with exact row accounting), then
renamed onto their final names (``commit_shard``) or removed (``discard_shard``). Used by the run in threads
(``etl.preprocess.run``), the tasks on a cluster (``etl.preprocess.tasks``) and the following run
(``etl.preprocess.follow``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from etl.errors import InputError, RowError
from etl.io.files import ExclusiveParquetWriter, HashingFile, buffered_stream, temporary_path
from etl.io.fs import Location, current_identity, fingerprint, identity
from etl.io.fs import replace as replace_file
from etl.io.npy import ChunkWriter, FixedColumns, NpySpec
from etl.io.parquet import Shard, footer_sha256, open_shard
from etl.io.processed import (
    FORMATS,
    ManifestEntry,
    StageRows,
    quarantine_name,
)
from etl.pipeline import OnError, Pipeline, Transformed
from etl.pipeline.column_groups import column_groups, read_by_groups
from etl.pipeline.stages import stage_totals, staged_batch
from etl.runtime.cluster_tasks import Stop

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class Formats:
    """What a run writes for each shard: its Parquet file (``parquet``) and/or its npy chunks of ``npy``'s spec
    (None: none)."""

    parquet: bool = True
    npy: NpySpec | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The formats as the manifest lists them."""
        return tuple(f for f in FORMATS if (f == "parquet" and self.parquet) or (f == "npy" and self.npy is not None))


def _quarantine_table(raw: pa.Table, source_schema: pa.Schema, first_row: int, t: Transformed) -> pa.Table:
    """The rejected rows as they were in the source (its column types), with _row, _column and _reason."""
    raw = raw.cast(pa.schema([source_schema.field(c) for c in raw.column_names]))
    rows = np.concatenate([r.rows for r in t.rejected])
    columns = np.concatenate([[r.column] * len(r.rows) for r in t.rejected])
    reasons = np.concatenate([[r.reason] * len(r.rows) for r in t.rejected])
    order = np.argsort(rows, kind="stable")
    rows = rows[order]
    q = raw.take(pa.array(rows - first_row))
    q = q.append_column("_row", pa.array(rows, pa.int64()))
    q = q.append_column("_column", pa.array(columns[order].tolist(), pa.string()))
    return q.append_column("_reason", pa.array(reasons[order].tolist(), pa.string()))


@dataclass(frozen=True)
class WrittenShard:
    """The output of one shard, complete under temporary names and not yet committed: ``output`` and
    ``quarantine`` (None when no row was rejected) are the temporary files of ``entry.output`` and
    ``entry.quarantine`` (``output`` is None when the Parquet file is not written); ``npy`` pairs the temporary
    file of each npy chunk with its final name (relative to the output directory)."""

    entry: ManifestEntry
    output: Location | None
    quarantine: Location | None
    npy: tuple[tuple[Location, str], ...] = ()


#: How one row group of an open shard becomes output: its number of rows, the transformed batch, and, when a row was
#: rejected, its rows as read from the source (what the quarantine takes the rejected ones from; else None, so that
#: they are freed before the output is written).
RowGroupTransform = Callable[[Shard, int], tuple[int, Transformed, pa.Table | None]]


def transform_read(pipeline: Pipeline, on_error: OnError, training: bool = False) -> RowGroupTransform:
    """The ``RowGroupTransform`` that reads the row group from the shard, runs the pipeline's reshaping stages and
    ``pipeline.transform`` (``training``: of training rows, ``Pipeline.transform``). A pipeline that
    ``column_groups`` cuts into groups of columns has its row groups read and transformed a group at a time; a row
    group where a row is invalid is then transformed again whole, which raises the error or quarantines the rows."""
    groups = column_groups(pipeline) if pipeline.is_fitted else None

    def run(shard: Shard, i: int) -> tuple[int, Transformed, pa.Table | None]:
        if groups is not None:
            try:
                t = read_by_groups(pipeline, groups, shard, i, output=True, training=training)
                return t.batch.num_rows, t, None
            except RowError:
                pass  # transformed whole below: the same error, or the rows quarantined as a whole row group has them
        raw = shard.read_table(i)
        batch, stages = staged_batch(pipeline.stages, pipeline.schema, raw, str(shard.path), i, shard.row_group_starts[i])
        t = pipeline.transform(batch, on_error, training=training)
        t.stages = stages
        return raw.num_rows, t, raw if t.rejected else None

    return run


def process_shard(
    pipeline: Pipeline,
    source: Location,
    out: Location,
    on_error: OnError,
    stop: Stop,
    compression: str = "none",
    progress: Callable[[int], None] | None = None,
    transform: RowGroupTransform | None = None,
    formats: Formats = Formats(),
    training: bool = False,
) -> WrittenShard | None:
    """Transform one shard into a temporary file of ``out`` (and rejected rows into one of its quarantine file);
    returns them with the shard's manifest entry (without ``artifacts_sha256``) for ``commit_shard``, or None when
    ``stop`` was set before the end. The temporary files are removed when it stops or fails. ``progress`` is called
    with the number of rows of each row group transformed. ``transform`` makes each row group's output (default:
    ``transform_read``, of training rows when ``training``; the single pass gives one that takes it from its stash).
    ``formats``: whether the Parquet file is written, and the npy chunks of which spec (none by default).

    Output columns are written with plain encoding (no dictionary: ids and floats decode at memcpy speed in the
    loader), without column statistics (nothing reads them; computing them cost ~5 % of the write), and
    ``compression`` (none by default; zstd or snappy trade write speed for size). The checksum is computed while
    the file is written."""
    quarantine = out.parent / quarantine_name(out.name)
    out_tmp, q_tmp = temporary_path(out), temporary_path(quarantine)
    chunks = None if formats.npy is None else ChunkWriter(out.parent, out.name, formats.npy)
    entry = None
    run = transform or transform_read(pipeline, on_error, training)
    try:
        entry = _write_shard(pipeline, source, out, out_tmp if formats.parquet else None, q_tmp, run, stop, compression, progress, chunks)
        if entry is None:
            return None
        return WrittenShard(entry, out_tmp if formats.parquet else None, q_tmp if entry.quarantine is not None else None,
                            tuple(chunks.written) if chunks is not None else ())  # fmt: skip
    finally:
        if entry is None:  # stopped or failed
            out_tmp.unlink(missing_ok=True)
            q_tmp.unlink(missing_ok=True)
            if chunks is not None:
                chunks.discard()


def commit_shard(directory: Location, written: WrittenShard) -> ManifestEntry:
    """Rename the temporary files of ``written`` onto their final names in ``directory`` (in object storage: copy
    them there); returns its entry."""
    if written.quarantine is not None and written.entry.quarantine is not None:
        replace_file(written.quarantine, directory / written.entry.quarantine)
    for tmp, name in written.npy:
        replace_file(tmp, directory / name)
    if written.output is not None:
        replace_file(written.output, directory / written.entry.output)
    return written.entry


def discard_shard(written: WrittenShard) -> None:
    """Remove the temporary files of ``written`` instead of committing them."""
    for tmp in (written.output, written.quarantine, *(t for t, _ in written.npy)):
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def _write_shard(
    pipeline: Pipeline,
    source: Location,
    out: Location,
    out_tmp: Location | None,
    q_tmp: Location,
    transform: RowGroupTransform,
    stop: Stop,
    compression: str,
    progress: Callable[[int], None] | None,
    chunks: ChunkWriter | None,
) -> ManifestEntry | None:
    """``process_shard``'s writing, into ``out_tmp`` (None: no Parquet file), ``q_tmp`` and ``chunks``. Each read
    of a row group (or of a group of its columns) opens the file again: a file replaced or rewritten while it is
    read could give rows of two versions, so its ``identity`` is taken before the first read and checked after the
    last (``InputError`` naming it when it changed: nothing of it is committed)."""
    before = identity(source)
    size, mtime_ns = fingerprint(source)
    footer = footer_sha256(source)
    shard = open_shard(source, pipeline.schema)
    schema = pipeline.output_schema()
    columns = fixed_columns(pipeline) if chunks is not None else None
    rows_in = rows_out = rows_q = 0
    staged: list[tuple[StageRows, ...]] = []  # the reshaping stages' rows of each row group
    q_writer: ExclusiveParquetWriter | None = None
    sink = HashingFile(out_tmp) if out_tmp is not None else None
    try:
        with contextlib.ExitStack() as stack:
            writer = None
            if sink is not None:
                stream = stack.enter_context(buffered_stream(stack.enter_context(sink)))
                writer = stack.enter_context(pq.ParquetWriter(stream, schema, use_dictionary=False, compression=compression, write_statistics=False))
            for i in range(shard.num_row_groups):
                if stop.is_set():
                    return None
                n, t, raw = transform(shard, i)
                table = pipeline.to_arrow(t.batch)
                if writer is not None:
                    writer.write_table(table)
                if chunks is not None and columns is not None:
                    chunks.write(columns.arrays(table))
                rows_in += n
                rows_out += t.batch.num_rows
                if pipeline.stages:
                    staged.append(t.stages)
                if t.rejected:
                    if raw is None:
                        raise RuntimeError(f"{source}: rows of row group {i} were rejected without their raw rows")
                    q = _quarantine_table(raw, shard.file.schema_arrow, shard.row_group_starts[i], t)
                    if q_writer is None:
                        q_tmp.parent.mkdir(exist_ok=True)
                        q_writer = ExclusiveParquetWriter(q_tmp, q.schema)
                    q_writer.write_table(q)
                    rows_q += q.num_rows
                    del q
                if progress is not None:
                    progress(n)
                del t, raw, table  # a worker holds one row group at a time: this one goes before the next is read
    finally:
        if q_writer is not None:
            q_writer.close()
    stages = stage_totals(pipeline.stages, staged)
    removed = sum(s.rows_in - s.rows_out for s in stages or ())
    if rows_in != rows_out + rows_q + removed or (stages and stages[0].rows_in != rows_in):
        raise RuntimeError(f"{source}: row accounting broke: {rows_in} in, {rows_out} out, {rows_q} quarantined, stages {stages}")
    if current_identity(source) != before:
        raise InputError(str(source), "the file changed while it was preprocessed (replaced, rewritten or removed): run again")
    if chunks is not None:
        chunks.close()
    return ManifestEntry(
        output=out.name,
        source=str(source.resolve()),
        source_bytes=size,
        source_mtime_ns=mtime_ns,
        source_footer_sha256=footer,
        rows_in=rows_in,
        rows_out=rows_out,
        rows_quarantined=rows_q,
        quarantine=quarantine_name(out.name) if rows_q else None,
        sha256=sink.hexdigest() if sink is not None else None,
        npy_chunks=tuple(chunks.chunks) if chunks is not None else None,
        stages=stages,
    )


def fixed_columns(pipeline: Pipeline) -> FixedColumns:
    """The output columns of ``pipeline`` (fitted: its id dtype depends on the fit) behind each batch field."""
    return FixedColumns.of(pipeline.output_schema(), pipeline.schema.by_role("label")[0], pipeline.passthrough)
