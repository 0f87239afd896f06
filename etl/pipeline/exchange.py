"""The exchange by key: every shard's rows spilled by the hash of a key, then read back a partition at a time,
sorted, so that an op needing every row of a key in order (History, ``etl.ops.history``) sees them together.

``etl preprocess`` (``etl.preprocess.keyed``) drives it:

1. ``spill`` writes the rows of one source row group (after the row-scope stages) to a *spilled file* of the
   exchange directory, ordered by bucket (the top ``BUCKET_BITS`` bits of the key's hash), and gives the bytes
   each bucket received (``row_bytes``: a per-row measure of the values, the same whatever file the row is in).
2. ``plan`` cuts the buckets into consecutive ranges of at most ``target`` bytes each (a bucket larger than that is
   a range of its own: its rows cannot be split, they may share one key): the partitions. The cut depends only on
   the rows, never on how they were spread over shards or workers.
3. ``read_partition`` reads the rows of one range from every spilled file and sorts them by (key hash, the order
   columns, input position): each key's rows together, in order.

A spilled file is an Arrow IPC file (uncompressed: written and read back through a memory map at about the speed
of a copy; its size is about ``row_bytes`` of its rows) holding the schema's columns in their raw-layout types
(``etl.io.text.raw_arrow_schema``), then ``/hash`` (uint64: the key's hash; null for a row whose key is missing or
malformed: bucket 0), ``/input`` (int32: the index of the shard it was read from), ``/group`` (int32: its row group
there) and ``/row`` (int64: its row number in the shard), in record batches of ``SPILL_ROWS`` rows; the schema's
metadata (``SPANS``) holds the first and last bucket of each batch, so that a reader maps only the batches of a
range and finds the range's rows in them by binary search. The files are created new (never through a link) in
the exchange directory, which only this run writes; the reader checks what it reads (``InputError`` naming the
file: other columns, batches or spans, missing positions, rows out of bucket order or outside their batch's span,
values that are not valid Arrow data).

Memory: ``read_partition`` holds the partition twice while it sorts (its rows as read, in the page cache through
the memory maps, then sorted): about ``2 * row_bytes`` of its rows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from etl.errors import InputError
from etl.io.arrow import from_numpy
from etl.io.files import buffered_stream, open_exclusive
from etl.io.text import raw_arrow_schema
from etl.schema import Schema

#: Buckets: the top bits of the key hash.
BUCKET_BITS = 16
BUCKETS = 1 << BUCKET_BITS
#: Rows per record batch of a spilled file: the granularity at which a partition's rows are found.
SPILL_ROWS = 8192
#: The key of a spilled file's schema metadata holding the first and last bucket of each record batch (JSON).
SPANS = b"etl.exchange.spans"
#: The columns a spilled file adds to the schema's, with their types.
HASH, INPUT, GROUP, ROW = "/hash", "/input", "/group", "/row"  # no schema column has a "/" in its name
POSITION_FIELDS = [pa.field(HASH, pa.uint64()), pa.field(INPUT, pa.int32(), nullable=False), pa.field(GROUP, pa.int32(), nullable=False),
                   pa.field(ROW, pa.int64(), nullable=False)]  # fmt: skip
#: Bytes ``row_bytes`` counts for those columns.
POSITION_BYTES = 24


def spill_schema(schema: Schema) -> pa.Schema:
    """The Arrow schema of the spilled files of ``schema``'s rows."""
    return pa.schema([*raw_arrow_schema(schema), *POSITION_FIELDS])


def buckets(hashes: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """The bucket (int64) of each row: the top ``BUCKET_BITS`` bits of its hash, 0 where it is not ``usable``."""
    b = (hashes >> np.uint64(64 - BUCKET_BITS)).astype(np.int64)
    b[~usable] = 0
    return b


def row_buckets(table: pa.Table) -> np.ndarray:
    """The bucket of each row of a spilled table (``buckets`` of its ``/hash``; a null hash: bucket 0)."""
    hashes = table.column(HASH)
    usable = np.asarray(hashes.is_valid().to_numpy(zero_copy_only=False), np.bool_)
    return buckets(np.asarray(pc.fill_null(hashes, 0).to_numpy(), np.uint64), usable)


def row_bytes(table: pa.Table) -> np.ndarray:
    """A measure of each row's bytes (int64): fixed-width values at their width, text as 4 + its length, lists as
    4 + their values; plus ``POSITION_BYTES``. It depends on the row's values only."""
    total = np.full(table.num_rows, POSITION_BYTES, np.int64)
    for col in table.columns:
        arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        total += _value_bytes(arr)
    return total


def _value_bytes(arr: pa.Array) -> np.ndarray:
    t = arr.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        lengths = np.asarray(pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False), np.int64)
        summed = np.zeros(len(arr) + 1, np.int64)
        np.cumsum(lengths, out=summed[1:])  # where each row's values start and end among the flattened values
        per_value = np.zeros(int(summed[-1]) + 1, np.int64)
        np.cumsum(_value_bytes(pc.list_flatten(arr)), out=per_value[1:])
        return 4 + per_value[summed[1:]] - per_value[summed[:-1]]
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return np.full(len(arr), t.bit_width // 8, np.int64)
    lengths = pc.binary_length(arr.cast(pa.large_binary()))
    return 4 + np.asarray(pc.fill_null(lengths, 0).to_numpy(zero_copy_only=False), np.int64)


def spill(path: Path, table: pa.Table, kept: np.ndarray, schema: Schema, hashes: np.ndarray, usable: np.ndarray, source: str, input_index: int,
          group: int, first_row: int) -> np.ndarray:  # fmt: skip
    """Write the rows ``kept`` of ``table`` to ``path`` as ``spilled`` gives them; returns the bytes per bucket."""
    rows, sizes = spilled(table, kept, schema, hashes, usable, source, input_index, group, first_row)
    write_spilled(path, rows)
    return sizes


def write_spilled(path: Path, rows: pa.Table) -> None:
    """Write ``rows`` (as ``spilled`` gives them: in bucket order) to the new spilled file ``path``."""
    b = row_buckets(rows)
    batches = [x for x in rows.to_batches(max_chunksize=SPILL_ROWS) if x.num_rows]
    ends = np.cumsum([x.num_rows for x in batches], dtype=np.int64)
    spans = [[int(b[end - x.num_rows]), int(b[end - 1])] for x, end in zip(batches, ends)]
    schema = rows.schema.with_metadata({SPANS: json.dumps(spans).encode()})
    with buffered_stream(open_exclusive(path)) as f, ipc.new_file(f, schema) as writer:
        for x in batches:
            writer.write_batch(x)


def spilled(table: pa.Table, kept: np.ndarray, schema: Schema, hashes: np.ndarray, usable: np.ndarray, source: str, input_index: int,
            group: int, first_row: int) -> tuple[pa.Table, np.ndarray]:  # fmt: skip
    """The rows ``kept`` (positions, int64) of ``table`` (one row group of ``source``, the ``input_index``-th
    shard, as read: its schema columns; row group ``group``, starting at row ``first_row`` of the shard) as rows of
    a spilled file (``spill_schema``), in bucket order, with each row's key hash (``hashes`` of the rows of
    ``table``, null where not ``usable``) and position; and the bytes (``row_bytes``) per bucket (int64
    [BUCKETS]). ``InputError`` naming ``source`` for a column whose values its raw-layout type cannot hold (an
    unsigned 64-bit value beyond the int64 range)."""
    raw = raw_arrow_schema(schema)
    arrays = []
    for f in raw:
        try:
            arrays.append(table.column(f.name).cast(f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise InputError(source, f"the exchange by key holds this column as {f.type}, which cannot take its values: {e}",
                             row_group=group, column=f.name) from None  # fmt: skip
    b = buckets(hashes[kept], usable[kept])
    order = np.argsort(b.astype(np.min_scalar_type(BUCKETS - 1)), kind="stable")  # in 16 bits: a radix sort
    taken = kept[order]  # the rows kept, in bucket order (in input order within a bucket)
    rows = pa.Table.from_arrays(arrays, schema=raw).take(from_numpy(taken))
    sizes = np.bincount(b[order], weights=row_bytes(rows), minlength=BUCKETS).astype(np.int64)
    positions = [from_numpy(hashes[taken], pa.uint64(), usable[taken]), from_numpy(np.full(len(kept), input_index, np.int32)),
                 from_numpy(np.full(len(kept), group, np.int32)), from_numpy(taken + first_row)]  # fmt: skip
    return pa.Table.from_arrays([*rows.columns, *positions], schema=spill_schema(schema)), sizes


def plan(sizes: np.ndarray, target: int) -> list[tuple[int, int]]:
    """The partitions: consecutive bucket ranges [lo, hi) covering every bucket, each of at most ``target`` bytes
    (``sizes``: bytes per bucket) unless one bucket alone holds more. At least one range."""
    ranges = []
    lo, held = 0, 0
    for b in range(BUCKETS):
        size = int(sizes[b])
        if held and held + size > target:
            ranges.append((lo, b))
            lo, held = b, 0
        held += size
    ranges.append((lo, BUCKETS))
    return ranges


def read_partition(files: Sequence[Path], lo: int, hi: int, schema: Schema, inputs: int, order: Sequence[str]) -> pa.Table:
    """The rows of buckets [lo, hi) of every spilled file in ``files``, sorted by ``/hash`` (a missing one first),
    the columns ``order`` (ascending, missing values first), ``/input`` and ``/row``. ``inputs``: the number of
    shards (``/input`` is below it). ``InputError`` naming the file for one that is not a spilled file of
    ``schema``'s rows."""
    expected = spill_schema(schema)
    parts = [_read_range(path, lo, hi, expected, inputs) for path in files]
    return sort_partition(pa.concat_tables(parts) if parts else expected.empty_table(), order)


def sort_partition(table: pa.Table, order: Sequence[str]) -> pa.Table:
    """The spilled rows ``table`` sorted by ``/hash`` (a missing one first), the columns ``order`` (ascending,
    missing values first), ``/input`` and ``/row``: the order of ``read_partition``."""
    columns = [HASH, *order, INPUT, ROW]
    keys = [(c, "ascending", "at_start") for c in columns]
    return table.take(pc.sort_indices(table.select(columns).combine_chunks(), sort_keys=keys))  # keys in one chunk: a faster sort


def _read_range(path: Path, lo: int, hi: int, expected: pa.Schema, inputs: int) -> pa.Table:
    """The rows of buckets [lo, hi) of the spilled file at ``path``, checked: the record batches whose span meets
    the range, memory-mapped, then the rows of the range among them (they are in bucket order)."""
    try:
        reader = ipc.open_file(pa.memory_map(str(path)))
        if not reader.schema.equals(expected):
            raise InputError(str(path), f"columns {reader.schema.names}, expected {expected.names} (not a spilled file of this run)")
        spans = _spans(path, reader.schema.metadata, reader.num_record_batches)
        picked = [i for i, (first, last) in enumerate(spans) if last >= lo and first < hi]
        batches = [reader.get_batch(i) for i in picked]
        for x in batches:
            x.validate(full=True)
    except (OSError, pa.ArrowException) as e:
        raise InputError(str(path), f"cannot read: {e}") from None
    table = pa.Table.from_batches(batches, schema=expected)
    b = row_buckets(table)
    ends = np.cumsum([x.num_rows for x in batches], dtype=np.int64)
    starts = ends - [x.num_rows for x in batches]
    within = all(spans[i][0] <= b[s] and b[e - 1] <= spans[i][1] for i, s, e in zip(picked, starts, ends) if e > s)
    if np.any(b[1:] < b[:-1]) or not within:
        raise InputError(str(path), "rows out of bucket order (not a spilled file of this run)")
    start, end = (int(i) for i in np.searchsorted(b, [lo, hi]))
    table = table.slice(start, end - start)
    shard, group, row = (table.column(c) for c in (INPUT, GROUP, ROW))
    lowest = [pc.min(c).as_py() for c in (shard, group, row)] if table.num_rows else [0, 0, 0]
    if shard.null_count or group.null_count or row.null_count or min(lowest) < 0 or (table.num_rows and pc.max(shard).as_py() >= inputs):
        raise InputError(str(path), f"rows without a position in the {inputs} input shards (not a spilled file of this run)")
    return table


def _spans(path: Path, metadata: dict[bytes, bytes] | None, batches: int) -> list[tuple[int, int]]:
    """The first and last bucket of each of the ``batches`` record batches of the spilled file ``path``, from its
    schema's ``metadata``, checked: one span per batch, each within the buckets, in order."""
    try:
        spans = [(int(first), int(last)) for first, last in json.loads((metadata or {})[SPANS])]
    except (KeyError, ValueError, TypeError) as e:
        raise InputError(str(path), f"no spans of its record batches ({e!r}; not a spilled file of this run)") from None
    bounds = [b for span in spans for b in span]
    if len(spans) != batches or any(b < 0 or b >= BUCKETS for b in bounds) or any(x > y for x, y in zip(bounds, bounds[1:])):
        raise InputError(str(path), f"spans of its record batches that do not fit its {batches} batches of rows in bucket order "
                                    "(not a spilled file of this run)")  # fmt: skip
    return spans
