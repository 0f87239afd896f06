"""Which rows a loader reads, in which order, on which rank: a pure function of (files, seed, epoch, rank, world).

An epoch's global row stream is the concatenation of every row group of every shard, in file order, or, with
shuffle, in an order drawn from ``(seed, epoch)``. Rank ``r`` of ``w`` takes the contiguous slice of that stream
``[r * N // w, (r + 1) * N // w)``, so ranks are disjoint and together complete, and their row counts differ by
at most one. Every rank derives the same stream from the same arguments; nothing is communicated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow.parquet as pq

from etl.io.fs import Location
from etl.io.parquet import read_footer
from etl.io.processed import ProcessedOutput


@dataclass(frozen=True)
class RowGroup:
    path: Location
    index: int  # row group number within the file
    first_row: int  # row number (within the file) of its first row
    num_rows: int
    #: the file's footer, as read when the groups were listed (reading a piece from object storage needs it)
    footer: pq.FileMetaData | None = field(default=None, compare=False, hash=False, repr=False)


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, start + length)`` of a row group (offsets within the row group)."""

    group: RowGroup
    start: int
    length: int


def row_groups(shards: list[Location]) -> list[RowGroup]:
    """Every non-empty row group of ``shards``, in file order (from the Parquet footers only)."""
    out = []
    for path in shards:
        meta = read_footer(path)
        first = 0
        for i in range(meta.num_row_groups):
            n = meta.row_group(i).num_rows
            if n:
                out.append(RowGroup(path, i, first, n, meta))
            first += n
    return out


def chunk_groups(output: ProcessedOutput) -> list[RowGroup]:
    """The npy chunks of a processed output (``etl.io.npy``) as row groups, in manifest order: ``path`` is the
    chunks' directory, ``index`` the chunk's number in it."""
    out = []
    for path, entry in zip(output.npy_parts, output.manifest.files):
        first = 0
        for i, chunk in enumerate(entry.npy_chunks or ()):
            out.append(RowGroup(path, i, first, chunk.rows))
            first += chunk.rows
    return out


def epoch_rng(seed: int, epoch: int, *stream: int) -> np.random.Generator:
    """The random generator of one (seed, epoch, stream...) combination; independent of everything else."""
    return np.random.default_rng([seed, epoch, *stream])


def rank_pieces(groups: list[RowGroup], *, seed: int, epoch: int, shuffle: bool, rank: int, world_size: int) -> list[Piece]:
    """The pieces of row groups rank ``rank`` reads in epoch ``epoch``, in stream order."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
    order = epoch_rng(seed, epoch).permutation(len(groups)) if shuffle else np.arange(len(groups))
    total = sum(g.num_rows for g in groups)
    lo, hi = rank * total // world_size, (rank + 1) * total // world_size
    pieces = []
    pos = 0
    for i in order:
        g = groups[int(i)]
        a, b = max(lo, pos), min(hi, pos + g.num_rows)
        if a < b:
            pieces.append(Piece(g, a - pos, b - a))
        pos += g.num_rows
        if pos >= hi:
            break
    return pieces


def batches_per_rank(total_rows: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """How many batches every rank yields. All ranks yield the same number (a rank that stops early hangs a
    collective in distributed training): with ``drop_last`` the full batches of the smallest slice; otherwise
    enough batches for the largest slice, so a rank whose slice is one row shorter may end with an empty batch
    (only when ``total_rows // world_size`` is a multiple of ``batch_size``)."""
    if drop_last:
        return (total_rows // world_size) // batch_size
    largest = -(-total_rows // world_size)
    return -(-largest // batch_size)
