"""The files of a distributed fit: count tables spilled to the shared work directory, and ranked partitions.

Two Parquet layouts, both owned (written and checked on read) here:

- a *spilled partial* (``write_partial`` / ``read_partition``): one column's ``KeyCounts`` from one fit task, with
  columns ``hash`` (``etl.ops.counts.key_hashes`` of the key), ``key``, ``count`` and, for string keys, ``raw``,
  ordered by the top ``BUCKET_BITS`` bits of the hash (a linear-time radix sort; the order within a bucket is
  the partial's) in row groups of ``SPILL_ROW_GROUP`` rows. The rows of partition ``p`` of any count ``P`` (hash
  in ``hash_range(p, P)``) lie in the run of the buckets that range overlaps: they are read from the row groups
  whose hash statistics overlap it, and picked by their hash.
- a *ranked partition* (``write_ranked`` / ``read_ranked``): the vocabulary entries of one partition (``key``,
  ``count``, ``raw`` for string keys) in rank order (count descending, then key ascending), read back in chunks.

Files may be local or in object storage (``etl.io.fs``). Every file written goes through a temporary name and a
rename (``etl.io.files``; in object storage, one upload), so a task that Dask reruns rewrites the same file whole.
A file that is not what these functions write (another schema, missing values, rows out of order, a hash that is
not its key's) raises ``InputError`` naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from etl.errors import InputError
from etl.io.files import atomic_write_parquet
from etl.io.fs import Location, arrow_source
from etl.ops.counts import KeyCounts, hash_range, key_hashes

T = TypeVar("T")

#: Parquet options of both layouts: hashes and keys are incompressible 64-bit words, so only counts (few distinct
#: values) are dictionary-encoded (trying a dictionary on the others costs more than the rest of the write).
_WRITE: dict[str, Any] = {"compression": "lz4", "use_dictionary": ["count"]}

#: Spilled partials are ordered by this many top bits of the hash.
BUCKET_BITS = 16
#: Rows per row group of a spilled partial: the granularity at which a partition's rows are found.
SPILL_ROW_GROUP = 1 << 16
#: Rows per row group of a ranked partition: the chunks in which it is read back.
RANKED_CHUNK = 1 << 18


def _schema(with_hash: bool, with_texts: bool) -> pa.Schema:
    fields = [("hash", pa.uint64())] if with_hash else []
    fields += [("key", pa.uint64()), ("count", pa.int64())]
    if with_texts:
        fields.append(("raw", pa.string()))
    return pa.schema(fields)


def _table(counts: KeyCounts, hashes: np.ndarray | None) -> pa.Table:
    cols: dict[str, pa.Array] = {} if hashes is None else {"hash": pa.array(hashes, pa.uint64())}
    cols |= {"key": pa.array(counts.keys, pa.uint64()), "count": pa.array(counts.counts, pa.int64())}
    if counts.texts is not None:
        cols["raw"] = counts.texts
    return pa.table(cols, schema=_schema(hashes is not None, counts.texts is not None))


def write_partial(path: Location, counts: KeyCounts) -> None:
    """Spill the partial ``counts`` (its ``nulls`` aside: callers carry them) to ``path``, in hash bucket order."""
    hashes = key_hashes(counts.keys)
    order = np.argsort(_buckets(hashes), kind="stable")
    table = _table(counts.take(order), hashes[order])
    atomic_write_parquet(table, path, row_group_size=SPILL_ROW_GROUP, **_WRITE)


def read_partition(path: Location, p: int, partitions: int, with_texts: bool) -> KeyCounts:
    """The entries of partition ``p`` of ``partitions`` in the spilled partial at ``path``, as a partial (keys
    ascending, ``nulls`` 0)."""
    lo, hi = hash_range(p, partitions)
    f = _open(path, _schema(True, with_texts))
    md = f.metadata
    groups = []
    for i in range(md.num_row_groups):
        if not md.row_group(i).num_rows:
            continue
        stats = md.row_group(i).column(0).statistics
        if stats is None or not stats.has_min_max:
            raise InputError(str(path), "spilled counts without hash statistics", row_group=i)
        if stats.max >= lo and stats.min < hi:
            groups.append(i)
    table = _read(path, partial(f.read_row_groups, groups)) if groups else _schema(True, with_texts).empty_table()
    _check_values(path, table)
    hashes = table.column("hash").to_numpy()
    buckets = _buckets(hashes)
    if np.any(buckets[1:] < buckets[:-1]) or not np.array_equal(hashes, key_hashes(table.column("key").to_numpy())):
        raise InputError(str(path), "spilled counts out of hash bucket order, or a hash that is not its key's")
    mine = hashes >= np.uint64(lo)
    if hi < 2**64:
        mine &= hashes < np.uint64(hi)
    table = table.filter(pa.array(mine))
    texts = table.column("raw").combine_chunks() if with_texts else None
    return KeyCounts.of(table.column("key").to_numpy(), table.column("count").to_numpy(), 0, texts)


def _buckets(hashes: np.ndarray) -> np.ndarray:
    """The top ``BUCKET_BITS`` bits of each hash (uint16)."""
    return (hashes >> np.uint64(64 - BUCKET_BITS)).astype(np.uint16)


def write_ranked(path: Location, ranked: KeyCounts) -> None:
    """Write a ranked table (``nulls`` aside)."""
    atomic_write_parquet(_table(ranked, None), path, row_group_size=RANKED_CHUNK, **_WRITE)


def read_ranked(path: Location, with_texts: bool) -> Iterator[KeyCounts]:
    """The ranked table at ``path``, chunk by chunk; ``InputError`` when its entries are not in rank order."""
    f = _open(path, _schema(False, with_texts))
    last: tuple[int, int] | None = None
    for i in range(f.metadata.num_row_groups):
        table = _read(path, partial(f.read_row_group, i))
        _check_values(path, table)
        keys, counts = table.column("key").to_numpy(), table.column("count").to_numpy()
        if not len(keys):
            continue
        ordered = (counts[1:] < counts[:-1]) | ((counts[1:] == counts[:-1]) & (keys[1:] > keys[:-1]))
        if not ordered.all() or (last is not None and last >= (-int(counts[0]), int(keys[0]))):
            raise InputError(str(path), "ranked counts out of order (count descending, then key ascending)", row_group=i)
        last = (-int(counts[-1]), int(keys[-1]))
        yield KeyCounts(keys, counts, 0, table.column("raw").combine_chunks() if with_texts else None)


def _open(path: Location, schema: pa.Schema) -> pq.ParquetFile:
    source, filesystem = arrow_source(path)
    f = _read(path, partial(pq.ParquetFile, source, filesystem=filesystem))
    if not f.schema_arrow.equals(schema):
        raise InputError(str(path), f"columns {f.schema_arrow.names}, expected {schema.names} (not a file of this fit)")
    return f


def _read(path: Location, read: Callable[[], T]) -> T:
    """``read()``, with a read failure as ``InputError`` naming ``path``."""
    try:
        return read()
    except (OSError, pa.ArrowException) as e:
        raise InputError(str(path), f"cannot read: {e}") from None


def _check_values(path: Location, table: pa.Table) -> None:
    if any(table.column(name).null_count for name in table.schema.names) or (table.num_rows and pc.min(table.column("count")).as_py() < 1):
        raise InputError(str(path), "missing values or counts below 1")
