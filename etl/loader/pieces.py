"""Reading one piece (rows of one row group) into a ``Chunk``, on a loader's worker threads.

One reader per kind of source (``reader_for`` picks it):

- ``ProcessedReader``: the output of ``etl preprocess``, already transformed: read as is;
- ``NpyReader``: the same, written as npy chunks only (``etl.io.npy``);
- ``HostReader``: raw shards, transformed on the host by the whole pipeline;
- ``DeviceInputReader``: raw shards whose transform finishes on the device (``transform_on="device"``): the host
  part of the pipeline, laid out as the inputs of ``etl.loader.device_stage``;
- ``etl.loader.device_columns.DeviceColumnReader``: the same, read and run on the device (``reader="cudf"``).

Each reader adds its read and transform seconds to the loader's stats. ``guarded`` wraps a read function so that
an unexpected failure reaches the training process as ``LoaderError`` naming the file, row group and rows.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import torch

from etl.batch import Batch
from etl.errors import EtlError, InputError, LoaderError
from etl.io.arrivals import CountedFiles
from etl.io.fs import Location, Url, fingerprint, identity
from etl.io.npy import FIELDS, NpySpec, field_file
from etl.io.npy import read_rows as read_npy_rows
from etl.io.parquet import batch_from_arrow, read_rows
from etl.io.processed import MANIFEST, ManifestEntry, ProcessedOutput, check_npy_layout, fetch_part, verify_chunk, verify_part
from etl.loader.chunk import Chunk, Layout
from etl.loader.device_columns import DeviceColumnReader, ReadColumns
from etl.loader.device_stage import DeviceStage
from etl.loader.order import Piece, RowGroup
from etl.loader.stats import LoaderStats
from etl.ops.history import History
from etl.pipeline import Pipeline

T = TypeVar("T")


class PieceReader:
    """Reads ``columns`` of a piece and converts them (``convert``, per kind of source); a callable piece → chunk."""

    def __init__(self, columns: list[str], stats: LoaderStats):
        self.columns, self.stats = columns, stats

    def __call__(self, piece: Piece) -> Chunk:
        return self.read(piece, piece.group.path)

    def read(self, piece: Piece, path: Location) -> Chunk:
        """The chunk of ``piece``, its rows read from ``path``: its file, or a copy of it."""
        g = piece.group
        t0 = time.perf_counter()
        table = read_rows(path, self.columns, g.first_row + piece.start, piece.length, g.index, g.footer)
        t1 = time.perf_counter()
        chunk = self.convert(table, piece)
        t2 = time.perf_counter()
        self.stats.add_read(t1 - t0, t2 - t1)
        return chunk

    def convert(self, table: pa.Table, piece: Piece) -> Chunk:
        """The rows of ``table`` (the piece's columns) as a chunk."""
        raise NotImplementedError


class ProcessedReader(PieceReader):
    """A shard of ``etl preprocess`` output: its columns already are the layout's. Before its first rows are
    read, each file is checked against the sha256 its manifest entry records: once per file and reader. Files are
    verified concurrently (one lock per file), so that from object storage the download of one does not hold up
    the others. A following loader's reader (``counted``: the record its polls fill, ``etl.io.arrivals.CountedFiles``)
    checks each file against the entry the poll that counted it read, not the manifest as it is later: a file
    rewritten since (with its entry) fails the check (``InputError`` naming it).

    A file read where it lies is checked again whenever it changed since (``etl.io.fs.identity``: a ``stat`` before
    and after each piece is read, see ``_read_checked``): a file replaced, rewritten or removed under a loader (a
    rerun of ``etl preprocess`` into the output it reads) is an ``InputError`` naming it, never a mix of the old and
    new rows, even when it changes while a piece is read; a file whose bytes are still the manifest's is read on.

    A file in object storage is downloaded once: into a local spool directory, hashed as it arrives
    (``etl.io.processed.fetch_part``), and its rows are then read from that verified copy, in this epoch and the
    next. The spool is a private directory in the system's temporary directory (``TMPDIR``), made at the first
    such file and removed with the reader (at the latest when the process exits); a file for which the spool's file
    system lacks room (``SPOOL_MARGIN`` kept free) is checked with ``verify_part`` and read from the store."""

    #: Bytes the spool leaves free on its file system.
    SPOOL_MARGIN = 1 << 30

    def __init__(self, layout: Layout, stats: LoaderStats, output: ProcessedOutput, counted: CountedFiles | None = None):
        super().__init__(layout.columns, stats)
        self.layout, self.output, self.counted = layout, output, counted
        self._entries = dict(zip(output.parts, output.manifest.files))  # the manifest the output was opened with
        self._verify_locks: dict[Location, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        # where each verified file's rows are read from, and the identity of the file checked (None: a spooled copy)
        self._verified: dict[Location, tuple[Location, tuple[int, ...] | None]] = {}
        self._spool: Path | None = None
        self._spool_lock = threading.Lock()

    def __call__(self, piece: Piece) -> Chunk:
        return _read_checked(lambda: self._check(piece.group.path), lambda source: self.read(piece, source))

    def _check(self, path: Location) -> Location:
        """Verify the file at ``path`` (the first time, or again when it changed since); returns where to read its
        rows from."""
        with self._locks_lock:
            lock = self._verify_locks.setdefault(path, threading.Lock())
        with lock:  # the file's other pieces wait until it is verified
            source, seen = self._verified.get(path, (path, None))
            if path not in self._verified:
                self._verified[path] = source, seen = self._verify(path, self._entry(path))
            elif seen is not None and _identity(path) != seen:
                self._verified[path] = source, seen = _reverified(path, lambda: self._verify(path, self._entry(path)))
        return source

    def _entry(self, path: Location) -> ManifestEntry:
        """The manifest entry the file at ``path`` must match: the one it was counted with when following, else the
        one of the manifest the output was opened with. ``InputError`` when there is none."""
        entry = self.counted.entry(path.name) if self.counted is not None else self._entries.get(path)
        if entry is None:
            raise InputError(str(self.output.directory / MANIFEST), f"{path}: not a file of this output that was counted or listed")
        return entry

    def _verify(self, path: Location, entry: ManifestEntry) -> tuple[Location, tuple[int, ...] | None]:
        """Check the file of ``entry`` at ``path``; returns where to read its rows from and the identity of the file
        checked when that is ``path`` (None for a spooled copy, which is ours)."""
        if isinstance(path, Url):
            spool = self._spool_with_room(fingerprint(path)[0])
            if spool is not None:
                return fetch_part(self.output, entry, spool), None
        seen = _identity(path)  # before the bytes are hashed: a change while they are is seen at the next read
        verify_part(self.output, entry)
        return path, seen

    def _spool_with_room(self, size: int) -> Path | None:
        """The spool directory (made on first use), when its file system has room for ``size`` more bytes."""
        with self._spool_lock:
            if self._spool is None:
                self._spool = Path(tempfile.mkdtemp(prefix="etl-parts-"))
                weakref.finalize(self, shutil.rmtree, self._spool, True)
            if shutil.disk_usage(self._spool).free < size + self.SPOOL_MARGIN:
                return None
            return self._spool

    def convert(self, table: pa.Table, piece: Piece) -> Chunk:
        return Chunk.from_table(table, self.layout)


class NpyReader(PieceReader):
    """The npy chunks of an ``etl preprocess`` output (pieces of ``etl.loader.order.chunk_groups``), read as is.
    Before its first rows are read, and again whenever one of its files changed since, each chunk's files are
    checked against the sha256s its manifest entry records (``CheckedChunks``, before and after each piece is read:
    ``_read_checked``)."""

    def __init__(self, layout: Layout, stats: LoaderStats, output: ProcessedOutput):
        super().__init__(layout.columns, stats)
        self.output = output
        if output.manifest.npy is None:
            raise ValueError(f"{output.directory}: the output has no npy chunks")
        check_npy_layout(output, NpySpec.of(layout.fixed_columns, 1))
        self.spec = output.manifest.npy
        self.checked = CheckedChunks(output)

    def __call__(self, piece: Piece) -> Chunk:
        g = piece.group
        return _read_checked(lambda: self.checked.check(g.path, g.index), lambda _: self._read(piece))

    def _read(self, piece: Piece) -> Chunk:
        g = piece.group
        t0 = time.perf_counter()
        fixed = {f: read_npy_rows(g.path / field_file(f, g.index), self.spec, f, g.num_rows, piece.start, piece.length) for f in FIELDS}
        self.stats.add_read(time.perf_counter() - t0, 0.0)
        return Chunk(piece.length, fixed, {})


class CheckedChunks:
    """The npy chunks of a processed ``output`` (their directories: ``output.npy_parts``), checked against the
    sha256s of the manifest the output was opened with: ``check`` checks a chunk's files before their first read
    (once per chunk, one lock per chunk, so chunks are checked concurrently) and again whenever one of them changed
    since (``etl.io.fs.identity``: a ``stat`` per file and call). A chunk replaced, rewritten or removed under a
    reader (a rerun of ``etl preprocess`` into the output it reads) is an ``InputError`` naming its file; a chunk
    whose bytes are still the manifest's is read on. Shared by ``NpyReader`` and the DALI engine
    (``etl.loader.dali_engine``), whose reader reads the files itself: it checks them once they are read."""

    def __init__(self, output: ProcessedOutput):
        self.output = output
        self._entries = dict(zip(output.npy_parts, output.manifest.files))
        self._locks: dict[tuple[Location, int], threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._verified: dict[tuple[Location, int], list[tuple[int, ...]]] = {}  # the identity of each checked chunk's files

    def check(self, directory: Location, index: int) -> None:
        """Check chunk ``index`` of the npy directory ``directory`` (see the class docstring); ``InputError``
        naming the file at fault."""
        key = (directory, index)
        with self._locks_lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._verified:
                self._verified[key] = self._verify(directory, index)
                return
            changed = [f for f, seen in zip(FIELDS, self._verified[key]) if _identity(directory / field_file(f, index)) != seen]
            if changed:
                self._verified[key] = _reverified(directory / field_file(changed[0], index), lambda: self._verify(directory, index))

    def _verify(self, directory: Location, index: int) -> list[tuple[int, ...]]:
        """Check chunk ``index`` of ``directory``'s files; returns their identities, taken before."""
        seen = [_identity(directory / field_file(f, index)) for f in FIELDS]
        verify_chunk(self.output, self._entries[directory], index)
        return seen


def _identity(path: Location) -> tuple[int, ...]:
    """``etl.io.fs.identity`` of the file at ``path``, or () when it is gone (a change like any other: checking
    the file again then names it as one that cannot be read)."""
    try:
        return identity(path)
    except FileNotFoundError:
        return ()


def _read_checked(check: Callable[[], T], read: Callable[[T], Chunk]) -> Chunk:
    """``read(check())``, then ``check()`` again: a file that changed while it was read (replaced by a rerun of etl
    preprocess between the first check and the read) is checked again, and unless its bytes are still the
    manifest's, that check's ``InputError`` names it instead of rows of the new file. A read that fails is checked
    the same way before its error is raised, so that a file removed or replaced under it is named as such."""
    where = check()
    try:
        chunk = read(where)
    except Exception:
        check()
        raise
    check()
    return chunk


def _reverified(path: Location, verify: Callable[[], T]) -> T:
    """``verify()`` again for a file of a processed output that changed since it was checked; its ``InputError``
    says so."""
    try:
        return verify()
    except InputError as e:
        raise InputError(e.path, f"{path} changed while this loader reads it (a rerun of etl preprocess into the output?): "
                         f"{e.problem}") from None  # fmt: skip


class HostReader(PieceReader):
    """A raw shard, transformed on the host by the whole pipeline."""

    def __init__(self, pipeline: Pipeline, layout: Layout, stats: LoaderStats):
        # streaming states run in the assembler (etl.loader.stream_state); a History's key and time columns (which
        # may be passthrough ones) are read, and checked with the labels (History.check_sources)
        self.histories = [op for op in pipeline.ops if isinstance(op, History)]
        sources = {c for op in self.histories for c in op.source_columns()}
        super().__init__([c for c in pipeline.schema.names if c in pipeline.input_columns or c in sources], stats)
        self.pipeline, self.layout = pipeline, layout
        self.ops = [op for op in pipeline.ops if not op.stream_specs()]

    def convert(self, table: pa.Table, piece: Piece) -> Chunk:
        if len(self.ops) == len(self.pipeline.ops) and not self.histories:
            return Chunk.from_batch(self.pipeline.transform(_raw_batch(table, self.pipeline, piece)).batch, self.layout)
        batch = _raw_batch(table, self.pipeline, piece, self.columns)
        for op in self.histories:
            batch = op.with_keys(batch)
        batch = self.pipeline.run_ops(batch, self.ops, "raise", labels=True, output=True).batch
        return Chunk.from_batch(batch, self.layout)


class DeviceInputReader(PieceReader):
    """A raw shard, transformed on the host by the pipeline's host part into the inputs of ``stage``; every row
    carries its origin (its row group's number in ``groups``)."""

    def __init__(self, pipeline: Pipeline, stage: DeviceStage, groups: list[RowGroup], stats: LoaderStats):
        super().__init__(pipeline.input_columns, stats)
        self.pipeline, self.stage = pipeline, stage
        self.group_no = {g: i for i, g in enumerate(groups)}

    def convert(self, table: pa.Table, piece: Piece) -> Chunk:
        g = piece.group
        host = self.pipeline.transform(_raw_batch(table, self.pipeline, piece), part="host").batch
        return self.stage.inputs.chunk(host, self.group_no[g], g.first_row)


def _raw_batch(table: pa.Table, pipeline: Pipeline, piece: Piece, columns: list[str] | None = None) -> Batch:
    """A raw piece (``columns``, default its transform's input columns: passthrough columns are not read) as a batch
    whose rows are numbered from the start of its file (for error messages)."""
    g = piece.group
    return batch_from_arrow(table, pipeline.schema, str(g.path), g.index, g.first_row + piece.start, columns or pipeline.input_columns)


def reader_for(pipeline: Pipeline, layout: Layout, *, processed: ProcessedOutput | None, stage: DeviceStage | None,
               groups: list[RowGroup], stats: LoaderStats, device: torch.device | None = None,
               read_columns: ReadColumns | None = None, counted: CountedFiles | None = None) -> Callable[[Piece], Chunk]:  # fmt: skip
    """The reader of a source: ``processed`` (``etl preprocess`` output; when followed, ``counted`` holds the
    entries its files were counted with), else raw shards, transformed on the host, or, given a device ``stage``,
    up to the stage's inputs: on the host, or, given ``read_columns``, read into ``device`` memory by it
    (``etl.loader.device_columns``)."""
    if processed is not None:
        return ProcessedReader(layout, stats, processed, counted) if "parquet" in processed.manifest.formats else NpyReader(layout, stats, processed)
    if stage is not None and read_columns is not None and device is not None:
        return DeviceColumnReader(pipeline, stage, groups, stats, device, read_columns)
    if stage is not None:
        return DeviceInputReader(pipeline, stage, groups, stats)
    return HostReader(pipeline, layout, stats)


def guarded(read: Callable[[Piece], Chunk]) -> Callable[[Piece], Chunk]:
    """``read``, with an unexpected failure re-raised as ``LoaderError`` naming the piece (file, row group, rows).
    An ``EtlError`` passes unchanged: it already names where it happened."""

    def read_piece(piece: Piece) -> Chunk:
        try:
            return read(piece)
        except EtlError:
            raise
        except Exception as e:  # noqa: BLE001 - re-raised with context
            g = piece.group
            raise LoaderError(f"{g.path}, row group {g.index}, rows {piece.start}..{piece.start + piece.length}: {type(e).__name__}: {e}") from e

    return read_piece
