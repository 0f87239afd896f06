"""Delimited text (CSV/TSV, optionally gzip-compressed) → Parquet shards in the *raw layout*.

The raw layout is what every other part of the package reads: one Parquet column per schema column, in schema order,
with the Arrow types of :func:`raw_arrow_schema`:

==========================  ==========================================
schema column               Arrow type
==========================  ==========================================
dtype int64                 ``int64``
dtype float64               ``float64``
dtype string                ``string`` (32-bit offsets, see below)
role list, element dtype T  ``list<element: T>`` with T mapped as above
==========================  ==========================================

``string`` rather than ``large_string``: pyarrow's CSV reader produces ``string`` natively (no cast), it is what
Parquet readers give back for a UTF-8 column when no Arrow schema is stored, its offsets take half the memory, and
reading speed measured the same for both (pyarrow 26, polars 2.1). The 2 GiB-per-array limit of 32-bit offsets does
not bite: a row group holds at most 131,072 rows.

Shards are named ``part-00000.parquet``, ``part-00001.parquet``, ... with at most ``rows_per_file`` rows each (rows of
several input files may share a shard, in input order) and row groups of ``min(rows_per_file, 131072)`` rows.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from etl.errors import InputError, OutputError
from etl.io.files import ExclusiveParquetWriter, is_shard_name, is_temporary, shard_name, temporary_path
from etl.schema import ColumnSpec, Schema

if TYPE_CHECKING:
    from etl.io.join import SideTable

__all__ = ["ROW_GROUP_ROWS", "raw_arrow_schema", "convert", "read_text", "header_names", "ShardSetWriter"]

#: Largest row group written by ``convert`` and ``etl.synth.generate``.
ROW_GROUP_ROWS = 131_072

_BLOCK_SIZE = 16 << 20  # bytes of text per CSV block: bounds memory while streaming
_ARROW_SCALAR = {"int64": pa.int64(), "float64": pa.float64(), "string": pa.string()}


def raw_arrow_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema of raw-layout shards for ``schema``: one field per column, in schema order, all nullable.

    int64 → ``int64``, float64 → ``float64``, string → ``string``; a list column → ``list<element: T>`` (the
    Parquet-compliant child name, so the schema read back from a shard prints the same).
    """
    fields = []
    for c in schema.columns:
        t = _ARROW_SCALAR[c.dtype]
        fields.append(pa.field(c.name, pa.list_(pa.field("element", t)) if c.is_list else t, nullable=True))
    return pa.schema(fields)


class ShardSetWriter:
    """Writes a set of raw-layout shards so that a data set is replaced all at once.

    Each shard is written under a hidden temporary name (``etl.io.files.temporary_path``). ``commit()`` renames them all
    to their final names and then removes any other ``part-NNNNN.parquet`` in ``out_dir`` (left by an earlier, larger
    run), so ``out_dir`` never mixes two data sets. ``abort()`` removes the temporaries and leaves ``out_dir`` as it
    was. Use it as a context manager: an exception aborts, a normal exit does not commit by itself.

    Only files provably of an earlier set are ever removed: an existing ``out_dir`` must hold nothing but
    temporaries and regular files with shard names whose Parquet schema is ``arrow_schema``; anything else (a text
    input, a processed output's manifest, another layout's shards...) raises OutputError before anything is written.
    """

    def __init__(self, out_dir: Path, arrow_schema: pa.Schema):
        self.out_dir = Path(out_dir)
        self.arrow_schema = arrow_schema
        if self.out_dir.is_dir():
            self._check_only_own_shards()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._tmp: dict[int, Path] = {}

    def _check_only_own_shards(self) -> None:
        """Raise OutputError unless every file in ``out_dir`` is a temporary or a shard of ``arrow_schema``."""
        for p in self.out_dir.iterdir():
            if is_temporary(p.name) or (is_shard_name(p.name) and not p.is_symlink() and self._same_layout(p)):
                continue
            raise OutputError(f"{self.out_dir}: holds {p.name}, which is not a shard of this layout; convert replaces "
                              "only its own shards: choose a new or empty output directory")

    def _same_layout(self, path: Path) -> bool:
        """Whether ``path`` is a regular Parquet file whose schema is ``arrow_schema``."""
        try:
            return path.is_file() and pq.read_schema(path).equals(self.arrow_schema, check_metadata=False)
        except (OSError, pa.ArrowException):
            return False

    @property
    def count(self) -> int:
        """Number of shards opened so far."""
        return len(self._tmp)

    def open(self, index: int) -> pq.ParquetWriter:
        """Open shard ``index`` under its temporary name; the caller writes and closes the writer.

        Safe to call from several threads for distinct indices.
        """
        tmp = temporary_path(self.out_dir / shard_name(index))
        self._tmp[index] = tmp
        return ExclusiveParquetWriter(tmp, self.arrow_schema, compression="snappy", use_dictionary=True)

    def commit(self) -> list[Path]:
        """Rename every shard to its final name, remove stale shards; return the final paths by index."""
        final = []
        for index in sorted(self._tmp):
            final.append(self.out_dir / shard_name(index))
            os.replace(self._tmp[index], final[-1])
        keep = {p.name for p in final}
        for p in self.out_dir.iterdir():
            if is_shard_name(p.name) and p.name not in keep:
                p.unlink()
        self._tmp = {}
        return final

    def abort(self) -> None:
        """Remove the temporaries written so far; the final names are untouched."""
        for tmp in self._tmp.values():
            tmp.unlink(missing_ok=True)
        self._tmp = {}

    def __enter__(self) -> ShardSetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


class _Sharder:
    """Accumulates raw-layout batches into shards of ``rows_per_file`` rows and full row groups."""

    def __init__(self, shards: ShardSetWriter, rows_per_file: int, progress: Callable[[int], None] | None):
        self.shards = shards
        self.rows_per_file = rows_per_file
        self.rg_rows = min(rows_per_file, ROW_GROUP_ROWS)
        self.progress = progress
        self.written = 0
        self._writer: pq.ParquetWriter | None = None
        self._file_rows = 0  # rows already written to the current shard
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0

    def add(self, batch: pa.RecordBatch) -> None:
        while batch.num_rows:
            room = self.rows_per_file - self._file_rows - self._pending_rows
            take = batch.slice(0, room) if batch.num_rows > room else batch
            batch = batch.slice(take.num_rows)
            self._pending.append(take)
            self._pending_rows += take.num_rows
            if self._file_rows + self._pending_rows == self.rows_per_file:
                self._flush(final=True)
            elif self._pending_rows >= self.rg_rows:
                self._flush(final=False)

    def _flush(self, final: bool) -> None:
        """Write pending rows: all of them if ``final`` (then close the shard), else whole row groups only."""
        n = self._pending_rows if final else self._pending_rows - self._pending_rows % self.rg_rows
        if n:
            if self._writer is None:
                self._writer = self.shards.open(self.shards.count)
            table = pa.Table.from_batches(self._pending, schema=self.shards.arrow_schema)
            self._writer.write_table(table.slice(0, n), row_group_size=self.rg_rows)
            rest = table.slice(n).combine_chunks()
            self._pending = rest.to_batches() if rest.num_rows else []
            self._pending_rows -= n
            self._file_rows += n
            self.written += n
            if self.progress is not None:
                self.progress(n)
        if final and self._writer is not None:
            self._writer.close()
            self._writer = None
            self._file_rows = 0

    def finish(self) -> None:
        self._flush(final=True)
        if self.shards.count == 0:  # no rows at all: still write one (empty) shard carrying the schema
            self.shards.open(0).close()


# ---------------------------------------------------------------------------------------------------------------------
# Reading text


def _check_inputs(inputs: Sequence[str | Path]) -> list[Path]:
    paths = [Path(p) for p in inputs]
    if not paths:
        raise InputError("<inputs>", "no input files given")
    for p in paths:
        if not p.is_file():
            raise InputError(str(p), "no such file" if not p.exists() else "not a regular file")
    return paths


def _open_csv(path: Path, schema: Schema, *, use_threads: bool) -> pacsv.CSVStreamingReader:
    t = schema.text
    text_cols = [c.name for c in schema.columns]
    read = pacsv.ReadOptions(
        use_threads=use_threads,
        block_size=_BLOCK_SIZE,
        column_names=None if t.header else text_cols,
    )
    parse = pacsv.ParseOptions(delimiter=t.delimiter)
    types = {c.name: (pa.string() if c.is_list else _ARROW_SCALAR[c.dtype]) for c in schema.columns}
    conv = pacsv.ConvertOptions(
        column_types=types,
        null_values=sorted({"", t.null_value}),
        strings_can_be_null=True,
        quoted_strings_can_be_null=True,
        include_columns=text_cols,
    )
    # compression="detect": ".gz", ".bz2", ".zst", ... are decompressed while streaming.
    return pacsv.open_csv(pa.input_stream(str(path), compression="detect"), read_options=read,
                          parse_options=parse, convert_options=conv)


_ROW_RE = re.compile(r"Row #(\d+): ")
_COL_RE = re.compile(r"In CSV column #(\d+): ")
_FIELDS_RE = re.compile(r"Expected (\d+) columns, got (\d+): (.*)", re.DOTALL)


def header_names(path: Path, schema: Schema) -> list[str] | None:
    """Column names of the file's header line (header files only), as pyarrow numbers them."""
    if not schema.text.header:
        return schema.names
    try:
        r = pacsv.open_csv(
            pa.input_stream(str(path), compression="detect"),
            read_options=pacsv.ReadOptions(use_threads=False, block_size=1 << 16),
            parse_options=pacsv.ParseOptions(delimiter=schema.text.delimiter),
            convert_options=pacsv.ConvertOptions(column_types={}, include_columns=[]),
        )
        return r.schema.names
    except (pa.ArrowException, OSError):
        return None


def _explain(path: Path, schema: Schema, err: Exception, *, single_threaded: bool) -> InputError:
    """Turn a pyarrow CSV error into an InputError naming the file, line and column.

    Multi-threaded reading does not report line numbers, so the file is re-read single-threaded up to the error.
    """
    msg = str(err)
    if isinstance(err, KeyError) or "in include_columns does not exist" in msg:
        names = header_names(path, schema) or []
        missing = [n for n in schema.names if n not in names]
        col = missing[0] if missing else None
        return InputError(str(path), f"the header lacks column(s) {missing}; it has {names}", column=col)
    if not single_threaded and isinstance(err, pa.ArrowInvalid) and ("CSV" in msg):
        try:
            for _ in _open_csv(path, schema, use_threads=False):
                pass
        except (pa.ArrowException, OSError) as again:
            return _explain(path, schema, again, single_threaded=True)
    column = None
    m = _COL_RE.search(msg)
    if m:
        names = header_names(path, schema) or []
        i = int(m.group(1))
        column = names[i] if i < len(names) else f"#{i}"
        msg = msg[: m.start()] + msg[m.end():]
    r = _ROW_RE.search(msg)
    if r:
        msg = f"line {r.group(1)}: " + msg[: r.start()] + msg[r.end():]
    msg = msg.replace("CSV parse error: ", "").replace("CSV conversion error to", "cannot convert to")
    m = _FIELDS_RE.search(msg)
    if m:
        text = m.group(3) if len(m.group(3)) <= 120 else m.group(3)[:120] + "..."
        msg = f"{msg[:m.start()]}wrong number of fields: expected {m.group(1)}, got {m.group(2)}: {text!r}"
    elif len(msg) > 300:
        msg = msg[:300] + "..."
    return InputError(str(path), msg, column=column)


def _split_lists(batch: pa.RecordBatch, schema: Schema, path: Path, arrow_schema: pa.Schema,
                 first_line: int) -> pa.RecordBatch:
    """Split list columns' text by their separator and cast to the raw layout (null or empty text → null list)."""
    arrays = []
    for i, c in enumerate(schema.columns):
        a = batch.column(i)
        if c.is_list:
            a = _split_one(a, c, path, first_line)
        arrays.append(a)
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


def _split_one(text: pa.Array, c: ColumnSpec, path: Path, first_line: int) -> pa.Array:
    lists = pc.split_pattern(text, pattern=c.separator)  # null text → null list; elements kept verbatim
    target = pa.list_(pa.field("element", _ARROW_SCALAR[c.dtype]))
    try:
        return lists.cast(target)
    except pa.ArrowInvalid as e:
        values = pc.list_flatten(lists)
        ok = pc.match_substring_regex(values, r"^[+-]?\d{1,18}$").to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(~ok)
        if not bad.size:  # e.g. a 19-digit value out of int64 range
            raise InputError(str(path), f"list element is not an int64: {e}", column=c.name) from None
        row = int(pc.list_parent_indices(lists)[int(bad[0])].as_py())
        value = values[int(bad[0])].as_py()
        raise InputError(str(path), f"line {first_line + row}: list element {value!r} is not an integer",
                         column=c.name) from None


def read_text(path: Path, schema: Schema, arrow_schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Stream ``path`` as raw-layout record batches (one CSV block at a time)."""
    try:
        reader = _open_csv(path, schema, use_threads=True)
    except (pa.ArrowException, KeyError, OSError) as e:
        if "Empty CSV file" in str(e):  # zero bytes (or an empty compressed stream): no rows
            return
        raise _explain(path, schema, e, single_threaded=False) from None
    line = 2 if schema.text.header else 1  # 1-based line of the next row (exact unless values hold newlines)
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as e:
            raise _explain(path, schema, e, single_threaded=False) from None
        yield _split_lists(batch, schema, path, arrow_schema, line)
        line += batch.num_rows


def convert(
    inputs: Sequence[str | Path],
    schema: Schema,
    out_dir: Path,
    rows_per_file: int = 1_000_000,
    progress: Callable[[int], None] | None = None,
    side: SideTable | None = None,
) -> list[Path]:
    """Convert delimited text files to raw-layout Parquet shards in ``out_dir``; return the shard paths in order.

    Reading follows ``schema.text``: ``delimiter``; ``header`` (if true the first line names the columns, every
    schema column must be among them, extra columns are dropped and the order may differ; if false each line has
    exactly one field per schema column, in schema order); ``null_value`` (that token and the empty field are null).
    Fields may be quoted with ``"``. Inputs ending in ``.gz``/``.bz2``/``.zst``/... are decompressed on the fly.
    A zero-byte input contributes no rows.

    Values: int64/float64 columns are parsed as such (an unparsable value is an error, never a silent null); string
    columns are kept verbatim (hex keys such as ``"00000123"`` stay strings). A list column's text is split at its
    ``separator``; elements are kept verbatim (``"a||b"`` → ``["a", "", "b"]``) and cast to the element type; empty
    text or null → null list.

    Files are streamed in blocks of 16 MiB, so memory stays bounded by about one block plus one row group whatever
    the input size. Rows go to ``part-00000.parquet``, ``part-00001.parquet``, ... with at most ``rows_per_file`` rows
    each, rows of consecutive inputs sharing a shard; row groups hold ``min(rows_per_file, 131072)`` rows. Zero rows
    in all give one empty shard. Shards are written under temporary names and renamed when all are complete; other
    ``part-*.parquet`` files already in ``out_dir`` are then removed (the data set is replaced). On error nothing in
    ``out_dir`` changes.

    ``progress`` (optional) is called with the number of rows of each row group written.

    ``side`` (optional, ``etl.io.join.SideTable``): a side table left-joined onto every row; the inputs then hold
    the schema's columns but the side table's (``side.input_schema``), and an input's header may not name a side
    column.

    Raises ``InputError`` for a missing input, a line with the wrong number of fields, an unparsable number or a
    missing header column; the message names the file and, where known, the line (1-based, counting the header)
    and the column.
    """
    if not isinstance(rows_per_file, int) or rows_per_file < 1:
        raise ValueError(f"rows_per_file must be a positive integer, got {rows_per_file!r}")
    paths = _check_inputs(inputs)
    if side is not None and side.schema is not schema:
        raise ValueError(f"the side table {side.path} was read for schema {side.schema.path}, not {schema.path}")
    read_schema = schema if side is None else side.input_schema
    read_arrow = raw_arrow_schema(read_schema)
    if side is not None:
        for path in paths:
            side.check_input(path)
    with ShardSetWriter(Path(out_dir), raw_arrow_schema(schema)) as shards:
        sharder = _Sharder(shards, rows_per_file, progress)
        try:
            for path in paths:
                for batch in read_text(path, read_schema, read_arrow):
                    sharder.add(batch if side is None else side.attach(batch))
            sharder.finish()
        finally:
            if sharder._writer is not None:  # error mid-shard: close the handle so abort() can remove it
                sharder._writer.close()
        return shards.commit()
