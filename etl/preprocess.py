"""Offline preprocessing: raw Parquet shards → processed Parquet shards and/or npy chunks, resumable.

The output directory is a processed output (layout and manifest: ``etl.io.processed``): one processed file per
input shard (input order) with one row group per input row group, and/or, with the npy format, the same rows as
fixed-width .npy chunks (``etl.io.npy``); the quarantine files hold the rejected raw rows with _row (row number in
the source), _column and _reason. The Parquet files are the same bytes whether or not the npy chunks are written.

Every file is written under a unique temporary name; the driver (the process that called ``preprocess``, sole
owner of the manifest and of the directory's lock) renames it onto its final name and rewrites the manifest
(atomically) after each shard. The manifest written last is the commit record: readers trust only the files it
lists. Shards are transformed by worker threads, or, given a Dask ``client`` (``etl.runtime.cluster``), by tasks on its
workers, each loading the fitted pipeline from the artifacts this run saved (``etl.preprocess_tasks``): the input and output
paths must then name the same files on every worker (shared storage). A task whose worker dies is run again
elsewhere, and what the killed attempt left under a temporary name is removed at the end of the run. In threads,
the fitted artifacts are saved (in a thread of their own) while the first shards are transformed; a shard is
committed only once they are saved, and a rerun, which must compare their checksum with the manifest's first,
waits for the save.

A fit in threads reads each shard once (``etl.pipeline.single_pass``): it stashes the row groups it read
(``etl.pipeline.stash``: in memory within ``memory_budget``, beyond it in a temporary directory inside the output
directory, removed when the run ends, however it ends), and each shard's output is written from its stash, the
same bytes as a transform that reads the shard again; a row group where the stashed transform rejects a row is
read again and transformed the two-pass way. A fit on a Dask cluster, and a run without a fit, read each shard
for the transform (``transform_read``).

A rerun skips the shards whose manifest entry still matches (``_complete``: the same source file by path, size,
modification time and footer checksum, the output present with the recorded checksum, and no quarantined row when
the rerun's ``on_error`` is "raise"; and the same fitted artifacts), so a run killed at any point and rerun ends
with the same bytes as an uninterrupted run. A rerun that fits again stashes only the shards it has to redo. Rows
are accounted exactly: rows_in = rows_out + rows_quarantined + the rows the pipeline's reshaping stages removed
(``etl.pipeline.stages``; each stage's rows in and out are in the manifest).

In object storage (``etl.io.fs``) the "rename" is a copy onto the final key, where the file appears whole.
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from etl.errors import ConfigError, InputError, OutputError
from etl.io.files import ExclusiveParquetWriter, HashingFile, buffered_stream, is_shard_name, remove_temporaries, sha256_file, temporary_path
from etl.io.fs import Location, Url, fingerprint, is_within
from etl.io.fs import replace as replace_file
from etl.io.lock import locked
from etl.io.npy import DEFAULT_CHUNK_ROWS, NPY_DIR, ChunkWriter, FixedColumns, NpySpec, chunk_dir, chunk_file, chunk_files
from etl.io.parquet import Shard, footer_sha256, open_shard
from etl.io.processed import (
    ARTIFACTS,
    FORMATS,
    QUARANTINE,
    Manifest,
    ManifestEntry,
    StageRows,
    Totals,
    part_path,
    quarantine_name,
    read_manifest,
    write_manifest,
)
from etl.ops.stream import stream_specs
from etl.pipeline import ON_ERROR, OnError, Pipeline, Transformed, check_match
from etl.pipeline.single_pass import Plan, fit_stashing, transform_stashed
from etl.pipeline.stages import stage_totals, staged_batch
from etl.pipeline.stash import Stash, default_budget, parse_budget
from etl.runtime.cluster_tasks import Stop, run_tasks
from etl.runtime.progress import Progress
from etl.runtime.workers import run_workers

if TYPE_CHECKING:
    from distributed import Client

COMPRESSIONS = ("none", "snappy", "lz4", "zstd")


@dataclass
class Summary:
    """Totals over all shards (skipped ones included); ``rows_processed`` counts the shards transformed now.
    ``fit_seconds`` is None when this run fitted nothing (artifacts given, or a pipeline without ops to fit).
    ``stages``: the rows in and out of each reshaping stage (None without stages): ``rows_in = rows_out +
    rows_quarantined`` plus the rows they removed."""

    files: int
    files_skipped: int
    rows_in: int
    rows_out: int
    rows_quarantined: int
    rows_processed: int
    fit_seconds: float | None
    transform_seconds: float
    #: the single pass's stash: the most bytes it held in memory at once, the bytes it wrote to disk, its budget
    stash_peak_bytes: int = 0
    stash_spilled_bytes: int = 0
    memory_budget: int = 0
    stages: tuple[StageRows, ...] | None = None

    @property
    def rows_per_second(self) -> float:
        """Rows transformed in this run per second of transform (fit excluded)."""
        return self.rows_processed / self.transform_seconds if self.transform_seconds > 0 else 0.0


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


def parse_formats(text: str) -> tuple[str, ...]:
    """``--format``'s value (comma-separated, such as ``parquet,npy``) as formats in ``FORMATS`` order; ValueError
    for an unknown or missing one."""
    names = {f.strip() for f in text.split(",") if f.strip()}
    unknown = sorted(names - set(FORMATS))
    if unknown or not names:
        raise ValueError(f"format must be one or more of {', '.join(FORMATS)} separated by commas, got {text!r}")
    return tuple(f for f in FORMATS if f in names)


def _previous(out_dir: Location) -> tuple[dict[str, ManifestEntry], Formats | None]:
    """The entries of the manifest an earlier run left in ``out_dir`` by output name, and the formats it wrote;
    none when there is no usable manifest (missing, unreadable, of another format or version, malformed)."""
    try:
        manifest = read_manifest(out_dir)
    except InputError:
        return {}, None
    return {e.output: e for e in manifest.files}, Formats("parquet" in manifest.formats, manifest.npy)


def _complete(e: ManifestEntry, source: Location, out: Location, on_error: OnError, parquet: bool, npy: bool) -> bool:
    """Whether the earlier run's entry ``e`` stands for what this run would write to ``out`` from ``source`` as a
    Parquet file (``parquet``) and/or npy chunks (``npy``), the earlier run's formats being the same, if the fitted
    artifacts are the same too (``e.artifacts_sha256``, checked once they are saved): the same source file (path,
    size, modification time, footer checksum), the output present with its recorded checksums, and a rerun with
    ``on_error="raise"`` only over a shard that quarantined nothing (otherwise the shard is redone, and its first
    invalid row raises). In object storage the size and modification time come from the object's metadata
    (``etl.io.fs.fingerprint``)."""
    size, mtime_ns = fingerprint(source)
    return (
        e.source == str(source.resolve())
        and e.source_bytes == size
        and e.source_mtime_ns == mtime_ns
        and e.source_footer_sha256 == footer_sha256(source)
        and (on_error == "quarantine" or e.rows_quarantined == 0)
        and (not parquet or (out.exists() and sha256_file(out) == e.sha256))
        and (not npy or _chunks_present(e, out.parent))
    )


def _chunks_present(e: ManifestEntry, out_dir: Location) -> bool:
    """Whether every npy chunk file of ``e`` is in ``out_dir`` with its recorded checksum."""
    if e.npy_chunks is None:
        return False
    for i, chunk in enumerate(e.npy_chunks):
        for field, digest in chunk.sha256.items():
            path = out_dir / chunk_file(e.output, field, i)
            if not path.exists() or sha256_file(path) != digest:
                return False
    return True


def check_apart(out_dir: Location, inputs: list[Location]) -> None:
    """Raise OutputError when ``out_dir`` overlaps one of ``inputs`` (shards or directories of shards, symlinks
    resolved; URLs compared by prefix): equal to an input directory or to the directory of an input shard, inside
    an input directory, or containing an input. A local directory and a URL never overlap."""
    out = out_dir.resolve()
    for src in inputs:
        p = src.resolve()
        if isinstance(p, Url) != isinstance(out, Url):
            continue
        inside = is_within(out, p) if p.is_dir() else out == p.parent
        if inside or is_within(p, out):
            raise OutputError(f"{out_dir}: output directory overlaps the input {src}; choose a directory apart from the inputs")


def _remove_stale(out_dir: Location, previous: dict[str, ManifestEntry], keep: set[str]) -> None:
    """Remove the files of the earlier run's entries that this run does not keep as they are: outputs it no
    longer makes (fewer shards) and outputs it redoes, with their quarantine files (a redone shard may quarantine
    nothing now), and the npy directories they leave empty. Only names this module makes (a shard name, its
    quarantine name, its chunk directory), so a tampered manifest cannot point elsewhere. Called before the new
    manifest replaces the old one, which is the proof the files are ours."""
    for e in previous.values():
        if e.output in keep or not is_shard_name(e.output):
            continue
        (out_dir / e.output).unlink(missing_ok=True)
        if e.quarantine == quarantine_name(e.output):
            (out_dir / e.quarantine).unlink(missing_ok=True)
        for name in chunk_files(e.output, len(e.npy_chunks or ())):
            (out_dir / name).unlink(missing_ok=True)
        if e.npy_chunks is not None:
            _remove_empty_dir(out_dir / chunk_dir(e.output))
    _remove_empty_dir(out_dir / NPY_DIR)


def _remove_empty_dir(directory: Location) -> None:
    """Remove ``directory`` when it is a local directory left empty (object storage has no directories)."""
    if isinstance(directory, Path) and directory.is_dir() and not directory.is_symlink() and not any(directory.iterdir()):
        directory.rmdir()


def _remove_artifact_temporaries(artifacts: Location) -> None:
    """Remove what a run killed while it saved the artifacts left under temporary names in ``artifacts`` and its
    table directories (not following symlinks)."""
    if _is_symlink(artifacts) or not artifacts.is_dir():
        return
    remove_temporaries(artifacts)
    for d in artifacts.iterdir():
        if d.is_dir() and not _is_symlink(d):
            remove_temporaries(d)


def _is_symlink(path: Location) -> bool:
    return isinstance(path, Path) and path.is_symlink()  # object storage has none


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


#: How one row group of an open shard becomes output: its number of rows, the transformed batch, and its rows as read
#: from the source (what the quarantine takes the rejected ones from; None when none was rejected and they were not
#: read).
RowGroupTransform = Callable[[Shard, int], tuple[int, Transformed, pa.Table | None]]


def transform_read(pipeline: Pipeline, on_error: OnError) -> RowGroupTransform:
    """The ``RowGroupTransform`` that reads the row group from the shard, runs the pipeline's reshaping stages and
    ``pipeline.transform``."""

    def run(shard: Shard, i: int) -> tuple[int, Transformed, pa.Table | None]:
        raw = shard.read_table(i)
        batch, stages = staged_batch(pipeline.stages, pipeline.schema, raw, str(shard.path), i, shard.row_group_starts[i])
        t = pipeline.transform(batch, on_error)
        t.stages = stages
        return raw.num_rows, t, raw

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
) -> WrittenShard | None:
    """Transform one shard into a temporary file of ``out`` (and rejected rows into one of its quarantine file);
    returns them with the shard's manifest entry (without ``artifacts_sha256``) for ``commit_shard``, or None when
    ``stop`` was set before the end. The temporary files are removed when it stops or fails. ``progress`` is called
    with the number of rows of each row group transformed. ``transform`` makes each row group's output (default:
    ``transform_read``; the single pass gives one that takes it from its stash). ``formats``: whether the Parquet
    file is written, and the npy chunks of which spec (none by default).

    Output columns are written with plain encoding (no dictionary: ids and floats decode at memcpy speed in the
    loader), without column statistics (nothing reads them; computing them cost ~5 % of the write), and
    ``compression`` (none by default; zstd or snappy trade write speed for size). The checksum is computed while
    the file is written."""
    quarantine = out.parent / quarantine_name(out.name)
    out_tmp, q_tmp = temporary_path(out), temporary_path(quarantine)
    chunks = None if formats.npy is None else ChunkWriter(out.parent, out.name, formats.npy)
    entry = None
    run = transform or transform_read(pipeline, on_error)
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
    """``process_shard``'s writing, into ``out_tmp`` (None: no Parquet file), ``q_tmp`` and ``chunks``."""
    size, mtime_ns = fingerprint(source)
    footer = footer_sha256(source)
    shard = open_shard(source, pipeline.schema)
    schema = pipeline.output_schema()
    columns = _fixed_columns(pipeline) if chunks is not None else None
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
                if progress is not None:
                    progress(n)
    finally:
        if q_writer is not None:
            q_writer.close()
    stages = stage_totals(pipeline.stages, staged)
    removed = sum(s.rows_in - s.rows_out for s in stages or ())
    if rows_in != rows_out + rows_q + removed or (stages and stages[0].rows_in != rows_in):
        raise RuntimeError(f"{source}: row accounting broke: {rows_in} in, {rows_out} out, {rows_q} quarantined, stages {stages}")
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


def preprocess(
    pipeline: Pipeline,
    shards: list[Location],
    out_dir: Location,
    *,
    artifacts: Location | None = None,
    workers: int = 1,
    on_error: OnError = "raise",
    compression: str = "none",
    progress: Progress | None = None,
    client: Client | None = None,
    partitions: int | None = None,
    memory_budget: int | str | None = None,
    formats: tuple[str, ...] = ("parquet",),
    npy_chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> Summary:
    """Fit (unless ``artifacts`` holds a fitted state of this pipeline), then transform every shard: in
    ``workers`` threads, or, given a Dask ``client``, on its cluster (the fit as ``Pipeline.fit`` does it with a
    client, count tables in ``partitions`` partitions spilled inside ``out_dir``; then one task per shard). The
    output bytes are the same either way.

    In threads, a fit reads each shard once: what the transform needs is stashed while fitting
    (``etl.pipeline.single_pass``), in memory up to ``memory_budget`` bytes (an int, or text such as ``"512M"``,
    ``"2G"``; default ``etl.pipeline.stash.default_budget()``, a quarter of the memory), beyond it in a
    temporary directory inside ``out_dir`` (the system's temporary directory when ``out_dir`` is in object
    storage), removed when the run ends, however it ends. A fit on a Dask cluster reads the shards twice (fit,
    then transform); with artifacts, or a pipeline with nothing to fit, there is one pass anyway.

    ``progress`` (``etl.runtime.progress``) hears of the fitting passes and of the ``"transform"`` pass, which counts the
    rows of the shards a previous run completed (skipped now) at its start.

    ``out_dir`` must lie apart from the inputs (OutputError otherwise, see ``check_apart``). The run holds
    ``out_dir``'s lock (``etl.io.lock``) throughout: a second run into the same directory raises
    OutputError at once (object storage has no such lock: one run at a time is up to the user there). A pipeline
    with a streaming state (``etl.ops.stream``: an online vocabulary, Categorify ``online: true``) is refused
    (``ConfigError``) before anything is written.

    ``formats``: some of ``etl.io.processed.FORMATS``: ``"parquet"`` (the default), ``"npy"`` (chunks of
    ``npy_chunk_rows`` rows, see ``etl.io.npy``; a pipeline with list columns raises ``ListColumnsError`` once it is
    fitted, before any shard is written), or both.
    A rerun with other formats (or chunk rows) than the earlier run's redoes every shard."""
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    if not formats or list(formats) != [f for f in FORMATS if f in formats]:
        raise ValueError(f"formats must be some of {FORMATS}, in that order, got {formats!r}")
    budget = default_budget() if memory_budget is None else parse_budget(memory_budget)
    streamed = stream_specs(pipeline.ops)
    if streamed:
        raise ConfigError(f"{', '.join(f'{s.describe()} ({s.op})' for s in streamed)}: such values are given by etl.Loader as it "
                          "streams rows, not by etl preprocess")  # fmt: skip
    check_apart(out_dir, shards)
    out_dir.mkdir(parents=True, exist_ok=True)
    with locked(out_dir):
        return _preprocess(pipeline, shards, out_dir, artifacts, workers, on_error, compression, progress, client, partitions, budget,
                           formats, npy_chunk_rows)  # fmt: skip


def _fixed_columns(pipeline: Pipeline) -> FixedColumns:
    """The output columns of ``pipeline`` (fitted: its id dtype depends on the fit) behind each batch field."""
    return FixedColumns.of(pipeline.output_schema(), pipeline.schema.by_role("label")[0], pipeline.passthrough)


def _npy_spec(pipeline: Pipeline, chunk_rows: int) -> NpySpec:
    """The npy spec of the output of the fitted ``pipeline``; ``ListColumnsError`` when it has list columns."""
    return NpySpec.of(_fixed_columns(pipeline), chunk_rows)


def _preprocess(
    pipeline: Pipeline,
    shards: list[Location],
    out_dir: Location,
    artifacts: Location | None,
    workers: int,
    on_error: OnError,
    compression: str,
    progress: Progress | None,
    client: Client | None,
    partitions: int | None,
    memory_budget: int,
    format_names: tuple[str, ...],
    npy_chunk_rows: int,
) -> Summary:
    """``preprocess`` once the arguments are checked and ``out_dir`` is locked."""
    remove_temporaries(out_dir)  # left by an interrupted run (a stash's spill directory among them)
    remove_temporaries(out_dir / QUARANTINE)
    if (out_dir / NPY_DIR).is_dir():
        for d in (out_dir / NPY_DIR).iterdir():
            remove_temporaries(d)
    previous, before = _previous(out_dir)
    outputs = [part_path(out_dir, i) for i in range(len(shards))]
    # the shards whose earlier output may be kept; whether the npy spec is the earlier run's is known once the fit
    # has fixed the id dtype (then ``same_formats``)
    parquet, npy = "parquet" in format_names, "npy" in format_names
    complete = set()
    if before is not None and before.parquet == parquet and (before.npy is not None) == npy:
        for i, (src, out) in enumerate(zip(shards, outputs)):
            e = previous.get(out.name)
            if e is not None and _complete(e, src, out, on_error, parquet, npy):
                complete.add(i)
    with Stash(memory_budget, out_dir if isinstance(out_dir, Path) else Path(tempfile.gettempdir())) as stash, \
            ThreadPoolExecutor(1, thread_name_prefix="etl-save") as saver:  # fmt: skip
        pipeline, plan, fit_seconds = _fitted(pipeline, shards, out_dir, artifacts, workers, on_error, progress, client, partitions, stash, complete)
        formats = Formats(parquet, _npy_spec(pipeline, npy_chunk_rows) if npy else None)
        saved = saver.submit(_save_artifacts, pipeline, out_dir)
        # Threads transform while the artifacts are saved (a shard is committed once they are); a rerun needs
        # their checksum first to know which shards it keeps, and tasks on a cluster load them.
        same_formats = formats == before  # the npy spec's id dtype is final now that the pipeline is fitted
        reused = [i for i in sorted(complete) if same_formats and previous[outputs[i].name].artifacts_sha256 == saved.result()]
        todo = [i for i in range(len(shards)) if i not in reused]
        if client is not None or not todo:
            saved.result()

        def transform(i: int) -> RowGroupTransform | None:
            """How the row groups of shard ``i`` are transformed: from the stash when the fit stashed them."""
            if plan is None or i in complete:
                return None
            return functools.partial(_transform_from_stash, pipeline, plan, stash, i, on_error)

        summary = _transform(pipeline, shards, outputs, out_dir, {outputs[i].name: previous[outputs[i].name] for i in reused}, previous,
                             todo, saved.result, workers, on_error, compression, progress, client, transform, formats)  # fmt: skip
        saved.result()  # its error, when no shard was committed to raise it
        return replace(summary, fit_seconds=fit_seconds, stash_peak_bytes=stash.peak_bytes, stash_spilled_bytes=stash.spilled_bytes,
                       memory_budget=memory_budget)  # fmt: skip


def _save_artifacts(pipeline: Pipeline, out_dir: Location) -> str:
    """Save the fitted state of ``pipeline`` in ``out_dir``'s artifacts directory (removing first what a killed
    save left there); returns the checksum its manifest entries record (``artifacts_sha256``)."""
    _remove_artifact_temporaries(out_dir / ARTIFACTS)
    pipeline.save(out_dir / ARTIFACTS)
    return sha256_file(out_dir / ARTIFACTS / "pipeline.json")


def _fitted(
    pipeline: Pipeline,
    shards: list[Location],
    out_dir: Location,
    artifacts: Location | None,
    workers: int,
    on_error: OnError,
    progress: Progress | None,
    client: Client | None,
    partitions: int | None,
    stash: Stash,
    complete: set[int],
) -> tuple[Pipeline, Plan | None, float | None]:
    """The fitted pipeline (loaded from ``artifacts``, or ``pipeline`` fitted now unless it is fitted already),
    the plan of the transform from ``stash`` (None when nothing was stashed) and the seconds the fit took (None
    when nothing was fitted). Without ``client``, the fit stashes the row groups of the shards not ``complete``."""
    if artifacts is not None:
        fitted = Pipeline.load(artifacts)
        check_match(fitted, pipeline, artifacts)
        return fitted, None, None
    if pipeline.is_fitted:
        return pipeline, None, None
    t0 = time.perf_counter()
    plan = None
    if client is None:
        plan = fit_stashing(pipeline, shards, stash, set(range(len(shards))) - complete, workers, on_error, progress)
    else:
        # the count tables spill inside out_dir (a URL too)
        pipeline.fit(shards, workers=workers, on_error=on_error, progress=progress, client=client, partitions=partitions, workdir=out_dir)
    return pipeline, plan, time.perf_counter() - t0


def _transform_from_stash(
    pipeline: Pipeline, plan: Plan, stash: Stash, index: int, on_error: OnError, shard: Shard, i: int
) -> tuple[int, Transformed, pa.Table | None]:
    """The ``RowGroupTransform`` of shard ``index``'s row groups stashed by the fit (each taken out of ``stash``)."""
    return transform_stashed(pipeline, plan, stash.pop((index, i)), shard, on_error)


def _transform(
    pipeline: Pipeline,
    shards: list[Location],
    outputs: list[Location],
    out_dir: Location,
    entries: dict[str, ManifestEntry],
    previous: dict[str, ManifestEntry],
    todo: list[int],
    artifacts_sha: Callable[[], str],
    workers: int,
    on_error: OnError,
    compression: str,
    progress: Progress | None,
    client: Client | None,
    transform: Callable[[int], RowGroupTransform | None],
    formats: Formats,
) -> Summary:
    """Write the shards ``todo`` (``entries``: those of the others, kept from the earlier run's ``previous``
    ones), with ``transform(i)`` for shard ``i`` in threads, or on the cluster of ``client``. ``artifacts_sha()``
    is the checksum of the saved artifacts: the first shard committed waits for it (the save may still run while
    shards are transformed), so a manifest lists a shard only once the artifacts it was made with are saved; it
    raises what failed the save."""
    lock = threading.Lock()

    def save_manifest() -> None:
        files = list(entries.values())  # Manifest.of puts them in shard order
        write_manifest(out_dir, Manifest.of(pipeline.name, files, complete=len(files) == len(shards), formats=formats.names, npy=formats.npy))

    transformed = None if progress is None else functools.partial(progress, "transform")
    if transformed is not None and len(entries):
        transformed(sum(e.rows_in for e in entries.values()))

    def record(i: int, written: WrittenShard | None) -> None:
        """Commit the output of shard ``i`` and list it in the manifest (nothing when it was stopped)."""
        if written is None:
            return
        if written.entry.output != outputs[i].name:
            raise RuntimeError(f"{shards[i]}: its task wrote {written.entry.output}, expected {outputs[i].name}")
        try:
            sha = artifacts_sha()
        except BaseException:  # the save failed: the shard is not committed
            for tmp in (written.output, written.quarantine, *(t for t, _ in written.npy)):
                if tmp is not None:
                    tmp.unlink(missing_ok=True)
            raise
        with lock:
            entry = commit_shard(out_dir, written)
            entries[entry.output] = replace(entry, artifacts_sha256=sha)
            save_manifest()

    def work(w: int, i: int, stop: threading.Event) -> None:
        record(i, process_shard(pipeline, shards[i], outputs[i], on_error, stop, compression, transformed, transform(i), formats))

    t1 = time.perf_counter()
    _remove_stale(out_dir, previous, set(entries))
    save_manifest()
    if client is None:
        run_workers(todo, workers, work)
    else:
        from etl.preprocess_tasks import shard_task  # it imports this module

        task = functools.partial(shard_task, out_dir / ARTIFACTS, artifacts_sha(), uuid.uuid4().hex, on_error, compression, formats)
        try:
            run_tasks(client, task, [(shards[i], outputs[i]) for i in todo], lambda k, w: record(todo[k], w), transformed,
                      describe=lambda shard: str(shard[0]))  # fmt: skip
        finally:  # what the attempts of tasks whose worker died, or that were stopped, left behind
            remove_temporaries(out_dir)
            remove_temporaries(out_dir / QUARANTINE)
    seconds = time.perf_counter() - t1
    totals = Totals.of(list(entries.values()))
    return Summary(
        files=len(shards),
        files_skipped=len(shards) - len(todo),
        rows_in=totals.rows_in,
        rows_out=totals.rows_out,
        rows_quarantined=totals.rows_quarantined,
        stages=totals.stages,
        fit_seconds=None,
        transform_seconds=seconds,
        rows_processed=sum(entries[outputs[i].name].rows_in for i in todo),
    )
