"""In-memory columns and batches that ops read and write.

A ``Column`` holds one feature for the rows of a batch:

- ``values``: a numpy array (dense numbers, uint64 keys, int ids) or ``Strings`` (raw text, before decode);
- ``valid``: a bool array, True where the value is present; ``None`` means no value is missing;
- ``offsets``: for list (multi-hot) columns, int64 array of length rows+1; row i holds
  ``values[offsets[i]:offsets[i+1]]`` and ``valid`` is per element. A null list is an empty list.
- ``raw``: for keys decoded from free text (``encoding: string``), the text they came from, so that a fitted
  vocabulary can record each key's raw value.

A ``Batch`` is a set of equally long columns plus where its rows came from (file, row group, the row number of
each row within the file), so that errors and quarantine can name the exact source row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, TypeAlias

import numpy as np

Array: TypeAlias = Any
"""An array of the backend holding the batch: ``numpy.ndarray`` (CPU backend) or ``torch.Tensor`` (torch backend).
No single static type covers both, so type checkers treat it as ``Any``."""


@dataclass(frozen=True)
class Strings:
    """Variable-length byte strings: string i is ``data[starts[i]:ends[i]]``.

    This covers both Arrow layouts without copying: offsets (``starts = offsets[:-1]``, ``ends = offsets[1:]``)
    and inline string views (``InlineStrings``: ``data`` is the view buffer, each string inside its 16-byte view)."""

    data: Array  # uint8
    starts: Array  # int32 or int64
    ends: Array  # int32 or int64

    @classmethod
    def from_offsets(cls, data: np.ndarray, offsets: np.ndarray) -> Strings:
        return cls(data, offsets[:-1], offsets[1:])

    def __len__(self) -> int:
        return len(self.starts)

    def to_list(self) -> list[str]:
        raw = self.data.tobytes()
        return [raw[s:e].decode("utf-8", "replace") for s, e in zip(self.starts.tolist(), self.ends.tolist())]

    def take(self, idx: np.ndarray) -> Strings:
        """The strings at positions ``idx``, compacted into a new buffer."""
        starts = self.starts[idx]
        positions, offsets = gather_ranges(starts, self.ends[idx] - starts)
        return Strings.from_offsets(self.data[positions], offsets)


class InlineStrings(Strings):
    """``Strings`` that all live inline in Arrow string views (each at most 12 bytes, e.g. 8-digit hex).

    ``inline_views`` is the (n, 4) uint32 view array itself (length, then the string's bytes); ``data`` is the
    same memory as bytes, string i at ``16*i + 4``. ``starts`` and ``ends`` are built only when something asks
    for them: kernels that know the layout (``etl.backends.cpu.decode_hex``) read the views directly."""

    inline_views: np.ndarray  # (n, 4) uint32

    def __init__(self, views: np.ndarray):
        object.__setattr__(self, "inline_views", views)

    @property
    def data(self) -> np.ndarray:
        return self.inline_views.reshape(-1).view(np.uint8)

    @cached_property
    def starts(self) -> np.ndarray:
        return np.arange(4, 16 * len(self.inline_views) + 4, 16, dtype=np.int64)

    @cached_property
    def ends(self) -> np.ndarray:
        return self.starts + self.inline_views[:, 0]

    def __len__(self) -> int:
        return len(self.inline_views)


@dataclass(frozen=True)
class Column:
    values: Array | Strings
    valid: Array | None = None
    offsets: Array | None = None
    raw: Strings | None = None

    @property
    def is_list(self) -> bool:
        return self.offsets is not None

    @property
    def array(self) -> Array:
        """``values`` of a column that holds numbers, keys or ids (raises ``TypeError`` while it holds text)."""
        if isinstance(self.values, Strings):
            raise TypeError("the column holds text, not an array of numbers, keys or ids")
        return self.values

    @property
    def list_offsets(self) -> Array:
        """``offsets`` of a list column (raises ``TypeError`` for a scalar column)."""
        if self.offsets is None:
            raise TypeError("the column is not a list column")
        return self.offsets

    def __len__(self) -> int:
        """Number of rows (lists count as one row each)."""
        return len(self.offsets) - 1 if self.offsets is not None else len(self.values)

    def null_count(self) -> int:
        return 0 if self.valid is None else len(self.valid) - int(self.valid.sum())

    def take(self, rows: np.ndarray) -> Column:
        """The rows at positions ``rows`` (an int array)."""
        offsets = None
        elems = rows
        if self.offsets is not None:
            elems, offsets = list_elements(self.offsets, rows)
        return Column(
            take_values(self.values, elems),
            None if self.valid is None else self.valid[elems],
            offsets,
            None if self.raw is None else self.raw.take(elems),
        )


def gather_ranges(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``starts[i] .. starts[i] + lengths[i] - 1`` for every i, concatenated, and the offsets of each
    range within that concatenation."""
    starts, lengths = starts.astype(np.int64), lengths.astype(np.int64)
    offsets = np.zeros(len(starts) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return np.arange(offsets[-1], dtype=np.int64) + np.repeat(starts - offsets[:-1], lengths), offsets


def list_elements(offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For list rows ``rows``: the indices of their elements (in row order) and the offsets of the new lists."""
    return gather_ranges(offsets[rows], offsets[rows + 1] - offsets[rows])


def take_values(values: Array | Strings, idx: Array) -> Array | Strings:
    return values.take(idx) if isinstance(values, Strings) else values[idx]


@dataclass
class Batch:
    """Columns of ``num_rows`` rows. ``row_ids[i]`` is the row number (within ``source``) of row i."""

    columns: dict[str, Column]
    num_rows: int
    source: str = "<memory>"
    row_group: int = 0
    row_ids: np.ndarray = None  # type: ignore[assignment]  # None: rows 0 .. num_rows - 1 (set by __post_init__)

    def __post_init__(self) -> None:
        if self.row_ids is None:
            self.row_ids = np.arange(self.num_rows, dtype=np.int64)

    def __getitem__(self, name: str) -> Column:
        return self.columns[name]

    def with_columns(self, updates: dict[str, Column]) -> Batch:
        return replace(self, columns={**self.columns, **updates})

    def take(self, rows: np.ndarray) -> Batch:
        """The rows at positions ``rows``, with their source row numbers."""
        return replace(
            self,
            columns={k: c.take(rows) for k, c in self.columns.items()},
            num_rows=len(rows),
            row_ids=self.row_ids[rows],
        )
