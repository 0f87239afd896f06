"""Delimited text (CSV/TSV, optionally gzip-compressed) → Parquet shards in the *raw layout*.

The raw layout is what every other part of the package reads: one Parquet column per schema column (every role but
``drop``: dropped columns are not written), in schema order, with the Arrow types of :func:`raw_arrow_schema`:

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

Inputs and the output directory may be object-storage URLs (``etl.io.fs``): text is streamed from the object,
and shards are uploaded under temporary names and copied onto their final names at commit.

Shards are named ``part-00000.parquet``, ``part-00001.parquet``, ... with at most ``rows_per_file`` rows each (rows of
several input files may share a shard, in input order) and row groups of ``min(rows_per_file, 131072)`` rows.

``pyarrow.compute`` is imported by the functions that convert text, not with the module: ``etl preprocess`` imports
this module (for ``raw_arrow_schema``) and has no use for it (≈ 40 ms of start-up).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from etl.errors import InputError, OutputError
from etl.io.files import ExclusiveParquetWriter, is_shard_name, is_temporary, shard_index, shard_name, temporary_path
from etl.io.fs import Location, arrow_source, location, locations, replace
from etl.io.text_hints import delimiter_hint, line_text, open_text
from etl.schema import ColumnSpec, Schema, TextLayout

if TYPE_CHECKING:
    from etl.io.join import SideTable

__all__ = ["ROW_GROUP_ROWS", "ARROW_SCALAR", "raw_arrow_schema", "convert", "read_text", "header_names", "ShardSetWriter", "existing_shards"]

#: Largest row group written by ``convert`` and ``etl.tools.synth.generate``.
ROW_GROUP_ROWS = 131_072

_BLOCK_SIZE = 16 << 20  # bytes of text per CSV block: bounds memory while streaming
#: The Arrow type of each raw dtype (of a scalar column, or of a list column's elements).
ARROW_SCALAR = {"int64": pa.int64(), "float64": pa.float64(), "string": pa.string()}


def raw_arrow_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema of raw-layout shards for ``schema``: one field per column, in schema order, all nullable.

    int64 → ``int64``, float64 → ``float64``, string → ``string``; a list column → ``list<element: T>`` (the
    Parquet-compliant child name, so the schema read back from a shard prints the same).
    """
    fields = []
    for c in schema.columns:
        t = ARROW_SCALAR[c.dtype]
        fields.append(pa.field(c.name, pa.list_(pa.field("element", t)) if c.is_list else t, nullable=True))
    return pa.schema(fields)


class ShardSetWriter:
    """Writes a set of raw-layout shards so that a data set is replaced (or, with ``append``, extended) all at once.

    Each shard is written under a hidden temporary name (``etl.io.files.temporary_path``). ``commit()`` renames them all
    to their final names and then removes any other ``part-NNNNN.parquet`` in ``out_dir`` (left by an earlier, larger
    run), so ``out_dir`` never mixes two data sets. ``abort()`` removes the temporaries and leaves ``out_dir`` as it
    was. Use it as a context manager: an exception aborts, a normal exit does not commit by itself.

    With ``append``, the shards already in ``out_dir`` stay: the new ones are numbered after the last of them
    (``part-00004.parquet`` then ``part-00005.parquet``...), so that readers list the old rows first, then the new.

    Only files provably of an earlier set are ever removed: an existing ``out_dir`` must hold nothing but
    temporaries and regular files with shard names whose Parquet schema is ``arrow_schema``; anything else (a text
    input, a processed output's manifest, another layout's shards...) raises OutputError before anything is written.
    """

    def __init__(self, out_dir: str | Location, arrow_schema: pa.Schema, *, append: bool = False):
        self.out_dir = location(out_dir)
        self.arrow_schema = arrow_schema
        self.append = append
        if self.out_dir.is_dir():
            self._check_only_own_shards()
        held = existing_shards(self.out_dir)
        self._first = shard_index(held[-1].name) + 1 if append and held else 0  # the index of the first new shard
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._tmp: dict[int, Location] = {}

    def _check_only_own_shards(self) -> None:
        """Raise OutputError unless every file in ``out_dir`` is a temporary or a shard of ``arrow_schema``."""
        for p in self.out_dir.iterdir():
            if is_temporary(p.name) or (is_shard_name(p.name) and not p.is_symlink() and self._same_layout(p)):
                continue
            if self.append:
                raise OutputError(f"{self.out_dir}: holds {p.name}, which is not a shard of this schema's layout (other columns or "
                                  "types, or not a shard at all); new shards are appended only beside shards of the same schema")  # fmt: skip
            raise OutputError(f"{self.out_dir}: holds {p.name}, which is not a shard of this layout; convert replaces "
                              "only its own shards: choose a new or empty output directory")

    def _same_layout(self, path: Location) -> bool:
        """Whether ``path`` is a regular Parquet file whose schema is ``arrow_schema``."""
        source, filesystem = arrow_source(path)
        try:
            return path.is_file() and pq.read_schema(source, filesystem=filesystem).equals(self.arrow_schema, check_metadata=False)
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
        tmp = temporary_path(self.out_dir / shard_name(self._first + index))
        self._tmp[index] = tmp
        return ExclusiveParquetWriter(tmp, self.arrow_schema, compression="snappy", use_dictionary=True)

    def commit(self) -> list[Location]:
        """Rename every shard to its final name, remove stale shards (none with ``append``); return the final paths by
        index."""
        final = []
        for index in sorted(self._tmp):
            final.append(self.out_dir / shard_name(self._first + index))
            replace(self._tmp[index], final[-1])
        keep = {p.name for p in final}
        for p in [] if self.append else self.out_dir.iterdir():
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


def existing_shards(out_dir: str | Location) -> list[Location]:
    """The files with shard names (``part-NNNNN.parquet``) in ``out_dir``, in index order; none when it is no
    directory."""
    directory = location(out_dir)
    if not directory.is_dir():
        return []
    return sorted((p for p in directory.iterdir() if is_shard_name(p.name)), key=lambda p: shard_index(p.name))


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


def _check_inputs(inputs: Sequence[str | Location]) -> list[Location]:
    paths = locations(list(inputs))
    if not paths:
        raise InputError("<inputs>", "no input files given")
    for p in paths:
        if not p.is_file():
            raise InputError(str(p), "no such file" if not p.exists() else "not a regular file")
    return paths


def _own_nulls(schema: Schema) -> bool:
    """Whether a column of ``schema`` has its own ``null_values``: missing texts are then applied by
    ``_finish_column`` to every column read as text, as the reader applies one set of texts to all columns."""
    return any(c.null_values is not None for c in schema.columns)


def _read_as_text(c: ColumnSpec) -> bool:
    """Whether the CSV reader gives column ``c`` as text (finished by ``_finish_column``): string and list columns,
    and columns with their own ``null_values``."""
    return c.is_list or c.dtype == "string" or c.null_values is not None


def _missing_texts(c: ColumnSpec, text: TextLayout) -> list[str]:
    """The whole-field texts that mean a missing value in column ``c``: the empty field, and the column's
    ``null_values`` (a scalar column's) or else the schema's ``text.null_value``. A list column's own
    ``null_values`` are matched per element instead (``_drop_elements``)."""
    own = c.null_values if c.null_values is not None and not c.is_list else ()
    return sorted({"", *own, *([text.null_value] if c.null_values is None else [])})


def _open_csv(path: Location, schema: Schema, header: bool, *, use_threads: bool) -> pacsv.CSVStreamingReader:
    t = schema.text
    read = pacsv.ReadOptions(
        use_threads=use_threads,
        block_size=_BLOCK_SIZE,
        column_names=None if header else schema.text_names,
    )
    parse = pacsv.ParseOptions(delimiter=t.delimiter)
    types = {c.name: (pa.string() if _read_as_text(c) else ARROW_SCALAR[c.dtype]) for c in schema.columns}
    conv = pacsv.ConvertOptions(
        column_types=types,
        null_values=sorted({"", t.null_value}),
        strings_can_be_null=not _own_nulls(schema),
        quoted_strings_can_be_null=True,
        include_columns=schema.names,  # dropped columns are never converted
    )
    # compression="detect": ".gz", ".bz2", ".zst", ... are decompressed while streaming.
    return pacsv.open_csv(open_text(path), read_options=read,
                          parse_options=parse, convert_options=conv)


_ROW_RE = re.compile(r"Row #(\d+): ")
_COL_RE = re.compile(r"In CSV column #(\d+): ")
_FIELDS_RE = re.compile(r"Expected (\d+) columns, got (\d+): (.*)", re.DOTALL)
_INT64_VALUE_RE = re.compile(r"to int64: invalid value '(\s*[+-]?\d+\s*)'")


def _first_line(path: Location, schema: Schema) -> list[str] | None:
    """The fields of the first line of ``path`` (split at the schema's delimiter, quotes removed); None for an empty
    or unreadable file."""
    try:
        r = pacsv.open_csv(
            open_text(path),
            read_options=pacsv.ReadOptions(use_threads=False, block_size=1 << 16),
            parse_options=pacsv.ParseOptions(delimiter=schema.text.delimiter),
            convert_options=pacsv.ConvertOptions(column_types={}, include_columns=[]),
        )
        return r.schema.names
    except (pa.ArrowException, OSError):
        return None


def _has_header(path: Location, schema: Schema) -> bool:
    """Whether the first line of ``path`` is a header: ``text.header`` true or false, or with ``auto``, whether that
    line equals the schema's column names (all of them, dropped ones included, in order)."""
    if schema.text.header == "auto":
        return _first_line(path, schema) == schema.text_names
    return bool(schema.text.header)


def header_names(path: Location, schema: Schema) -> list[str] | None:
    """The names of the fields of ``path``'s lines: its header's (None for an empty or unreadable file) when it
    has one (``text.header``, or ``auto`` and a first line equal to the column names), else the schema's."""
    return _first_line(path, schema) if _has_header(path, schema) else schema.text_names


def _check_header(path: Location, schema: Schema) -> None:
    """Raise ``InputError`` unless the header of ``path`` names every column of the raw layout (in any order, among
    other names); the message lists the expected and the found names and where they first differ."""
    found = _first_line(path, schema)
    if found is None:
        return  # an empty file has no rows; an unreadable one fails when read
    missing = [n for n in schema.names if n not in found]
    if not missing:
        return
    expected = schema.text_names
    i = next((i for i, (e, f) in enumerate(zip(expected, found)) if e != f), min(len(expected), len(found)))
    first = f"field {i + 1}: expected {expected[i]!r}, found {found[i]!r}" if i < min(len(expected), len(found)) else (
        f"the header ends after {len(found)} fields" if len(found) < len(expected) else f"field {i + 1}: {found[i]!r} is extra")
    hint = delimiter_hint(path, schema, lambda fields: len(set(fields) & set(expected)) > len(set(found) & set(expected)),
                           schema.text.delimiter.join(found))  # fmt: skip
    raise InputError(str(path), f"the header lacks column(s) {missing}: expected the schema's columns {expected}, found {found} "
                                f"(first difference: {first}){hint}", column=missing[0])


def _int64_hint(value: str) -> str:
    """A hint for an integer ``value`` beyond the int64 range (empty for any other value)."""
    if not re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return ""
    return " (beyond the int64 range: integer ids up to 2**64 - 1 are read with dtype string and encoding int)"


def _explain(path: Location, schema: Schema, err: Exception, header: bool, *, single_threaded: bool) -> InputError:
    """Turn a pyarrow CSV error into an InputError naming the file, line and column.

    Multi-threaded reading does not report line numbers, so the file is re-read single-threaded up to the error.
    """
    msg = str(err)
    if not single_threaded and isinstance(err, pa.ArrowInvalid) and ("CSV" in msg):
        try:
            for _ in _open_csv(path, schema, header, use_threads=False):
                pass
        except (pa.ArrowException, OSError) as again:
            return _explain(path, schema, again, header, single_threaded=True)
    first = _first_line(path, schema)
    column = None
    m = _COL_RE.search(msg)
    if m:
        names = (first if header else schema.text_names) or []
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
        shown = m.group(3).rstrip("\r\n")
        line = line_text(path, int(r.group(1))) if r and shown.endswith(" ...") else shown  # pyarrow cuts a long line short
        msg += delimiter_hint(path, schema, lambda fields: len(fields) == int(m.group(1)), line or "")
    elif len(msg) > 300:
        msg = msg[:300] + "..."
    big = _INT64_VALUE_RE.search(msg)
    if big:
        msg += _int64_hint(big.group(1))
    if not header and first == schema.text_names:
        msg += "; the first line holds the schema's column names: set text.header to true or auto"
    return InputError(str(path), msg, column=column)


def _finish(batch: pa.RecordBatch, schema: Schema, path: Location, arrow_schema: pa.Schema, first_line: int) -> pa.RecordBatch:
    """A batch as the CSV reader gives it → the raw layout (``first_line``: the 1-based line of its first row)."""
    for i, c in enumerate(schema.columns):
        check_one_line(batch.column(i), c.name, path, first_line)
    own_nulls = _own_nulls(schema)
    arrays = [_finish_column(batch.column(i), c, schema, own_nulls, path, first_line) for i, c in enumerate(schema.columns)]
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


def check_one_line(a: pa.Array, column: str, path: Location, first_line: int) -> None:
    """Raise InputError when a text value of ``a`` (column ``column`` of ``path``, its first value on line
    ``first_line``, 1-based) holds a line break: a row is one line, so such a value is a quoted
    field that ran past the end of its line (an unterminated quote swallows the lines after it, up to the end of
    the file); the error names the line where the field opened. Scans the column's bytes once (a line break is
    rare: the row is looked for only when one is found)."""
    if not (pa.types.is_string(a.type) or pa.types.is_large_string(a.type)) or len(a) == 0:
        return
    width = np.int32 if pa.types.is_string(a.type) else np.int64
    offsets = np.frombuffer(a.buffers()[1], width, len(a) + 1, a.offset * np.dtype(width).itemsize)
    data = a.buffers()[2]
    if data is None:
        return
    text = np.frombuffer(data, np.uint8)[offsets[0]:offsets[-1]]
    if not ((text == 10).any() or (text == 13).any()):
        return
    import pyarrow.compute as pc

    row = int(np.flatnonzero(pc.fill_null(pc.match_substring_regex(a, "[\r\n]"), False).to_numpy(zero_copy_only=False))[0])
    raise InputError(str(path), f"line {first_line + row}: a quoted field opens on this line and runs past its end (a quote "
                     "without its closing quote?); each row must be one line", column=column)  # fmt: skip


def _finish_column(a: pa.Array, c: ColumnSpec, schema: Schema, own_nulls: bool, path: Location, first_line: int) -> pa.Array:
    """One column of ``_finish``: missing texts applied (when the schema has per-column ``null_values``), list text
    split, text of a numeric column with its own ``null_values`` parsed."""
    import pyarrow.compute as pc
    if own_nulls and _read_as_text(c):
        a = pc.if_else(pc.is_in(a, value_set=pa.array(_missing_texts(c, schema.text), pa.string())), pa.scalar(None, pa.string()), a)
    if c.is_list:
        return _split_one(a, c, path, first_line)
    if c.dtype == "string" or not _read_as_text(c):
        return a
    values = pc.utf8_trim_whitespace(a)  # as the CSV reader trims numbers
    bad = _first_unconvertible(values, ARROW_SCALAR[c.dtype])
    if bad is not None:
        value = a[bad].as_py()
        raise InputError(str(path), f"line {first_line + bad}: cannot convert to {c.dtype}: invalid value {value!r}"
                         f"{_int64_hint(value) if c.dtype == 'int64' else ''}", column=c.name)
    return values.cast(ARROW_SCALAR[c.dtype])


def _first_unconvertible(values: pa.Array, target: pa.DataType) -> int | None:
    """The position of the first value of ``values`` that does not cast to ``target`` (None if all do), found by
    bisection: a few casts, whatever the length."""

    def casts(a: pa.Array) -> bool:
        try:
            a.cast(target)
            return True
        except pa.ArrowInvalid:
            return False

    if casts(values):
        return None
    lo, hi = 0, len(values)  # values[lo:hi] holds the first bad value
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if casts(values.slice(lo, mid - lo)):
            lo = mid
        else:
            hi = mid
    return lo


def _split_one(text: pa.Array, c: ColumnSpec, path: Location, first_line: int) -> pa.Array:
    """A list column's text split at its separator (null text → null list; elements kept verbatim but for those
    in the column's ``null_values``, which are dropped) and cast to the element type."""
    import pyarrow.compute as pc
    lists = pc.split_pattern(text, pattern=c.separator)
    if c.null_values is not None:
        lists = _drop_elements(lists, c.null_values)
    target = pa.list_(pa.field("element", ARROW_SCALAR[c.dtype]))
    values = pc.list_flatten(lists)
    bad = _first_unconvertible(values, target.value_type)
    if bad is not None:
        row = int(pc.list_parent_indices(lists)[bad].as_py())
        value = values[bad].as_py()
        raise InputError(str(path), f"line {first_line + row}: list element {value!r} is not {'an' if c.dtype == 'int64' else 'a'} "
                         f"{c.dtype}{_int64_hint(value) if c.dtype == 'int64' else ''}", column=c.name)
    return lists.cast(target)


def _drop_elements(lists: pa.ListArray, missing: tuple[str, ...]) -> pa.ListArray:
    """``lists`` without the elements equal to one of ``missing``; a list left with no element is null."""
    import pyarrow.compute as pc
    values = pc.list_flatten(lists)
    keep = pc.invert(pc.is_in(values, value_set=pa.array(missing, pa.string())))
    parents = pc.list_parent_indices(lists).to_numpy()
    lengths = np.bincount(parents[keep.to_numpy(zero_copy_only=False)], minlength=len(lists))
    offsets = np.zeros(len(lists) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), values.filter(keep), mask=pa.array(lengths == 0))


def read_text(path: Location, schema: Schema, arrow_schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Stream ``path`` as raw-layout record batches (one CSV block at a time)."""
    header = _has_header(path, schema)
    if header:
        _check_header(path, schema)
    try:
        reader = _open_csv(path, schema, header, use_threads=True)
    except (pa.ArrowException, OSError) as e:
        if "Empty CSV file" in str(e):  # zero bytes (or an empty compressed stream): no rows
            return
        raise _explain(path, schema, e, header, single_threaded=False) from None
    line = 2 if header else 1  # 1-based line of the next row (exact: a value holding a line break is refused)
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as e:
            raise _explain(path, schema, e, header, single_threaded=False) from None
        yield _finish(batch, schema, path, arrow_schema, line)
        line += batch.num_rows


def convert(
    inputs: Sequence[str | Location],
    schema: Schema,
    out_dir: str | Location,
    rows_per_file: int = 1_000_000,
    progress: Callable[[int], None] | None = None,
    side: SideTable | None = None,
    *,
    append: bool = False,
) -> list[Location]:
    """Convert delimited text files to raw-layout Parquet shards in ``out_dir``; return the shard paths in order
    (the new ones only, with ``append``).

    Reading follows ``schema.text``: ``delimiter``; ``header``: true (the first line names the columns; every
    column of the raw layout must be among them, other columns are left out and the order may differ; a header
    lacking one raises InputError listing the expected and the found names), false (each line has exactly one field
    per schema column, dropped ones included, in schema order) or ``auto`` (decided per file: the first line is a
    header when it equals the schema's column names, all of them in order, else it is data); ``null_value`` (that
    token and the empty field are null, unless a column has its own ``null_values``, which replace ``null_value``
    for it). Fields may be quoted with ``"``. Inputs ending in ``.gz``/``.bz2``/``.zst``/... are decompressed on the
    fly. A zero-byte input contributes no rows. Columns of role ``drop`` are skipped: they are not written.

    Values: int64/float64 columns are parsed as such (an unparsable value is an error, never a silent null; an
    integer beyond the int64 range too: integer ids up to 2**64 - 1 are read with dtype string and ``encoding:
    int``, and ``Decode`` turns their text into exact uint64 keys); string columns are kept verbatim (hex keys such as
    ``"00000123"`` stay strings). A list column's text is split at its ``separator``; elements are kept verbatim
    (``"a||b"`` → ``["a", "", "b"]``) but for those equal to one of the column's ``null_values``, which are dropped,
    and cast to the element type; empty text, null, or a list whose every element was dropped → null list.

    Files are streamed in blocks of 16 MiB, so memory stays bounded by about one block plus one row group whatever
    the input size. Rows go to ``part-00000.parquet``, ``part-00001.parquet``, ... with at most ``rows_per_file`` rows
    each, rows of consecutive inputs sharing a shard; row groups hold ``min(rows_per_file, 131072)`` rows. Zero rows
    in all give one empty shard. Shards are written under temporary names and renamed when all are complete; other
    ``part-*.parquet`` files already in ``out_dir`` are then removed (the data set is replaced), unless ``append``:
    then they stay, and the new shards are numbered after the last of them (``ShardSetWriter``); they must have the
    layout of this schema (OutputError otherwise). On error nothing in ``out_dir`` changes.

    ``progress`` (optional) is called with the number of rows of each row group written.

    ``side`` (optional, ``etl.io.join.SideTable``): a side table left-joined onto every row; the inputs then hold
    the schema's columns but the side table's (``side.input_schema``), and an input's header may not name a side
    column.

    Raises ``InputError`` for a missing input, a line with the wrong number of fields, an unparsable number or a
    missing header column (with ``header: false``, when the file's first line is the column names, the message
    says to set ``header`` to true or auto); the message names the file and, where known, the line (1-based, counting the header)
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
    with ShardSetWriter(out_dir, raw_arrow_schema(schema), append=append) as shards:
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
