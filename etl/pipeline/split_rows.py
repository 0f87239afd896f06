"""Which split each row belongs to (``etl.pipeline.split``), once the split is resolved, and the stage that keeps
one split's rows.

A resolved split (``Assignment``) gives each row its role (``TRAIN``, ``VALID``, ``TEST``) from the row's split
columns and its input position (shard index in the run's order, row number in the file):

- ``TimeRoles``: a split by time with its bounds as numbers of the column (quantiles computed, dates converted),
  from the time column alone;
- ``LatestRoles``: a split by each key's latest events, from the position alone: it holds the positions of the
  valid and test rows (every other row is a train row), found by a first pass over the rows
  (``etl.preprocess.split_pass``).

``SplitStage`` is a row-scope stage (``etl.pipeline.stages``) that passes on the rows of one role: appended to a
pipeline's stages, the fit sees the train rows only, and a split's output holds its rows only. A row without a value
in a split column raises ``RowError`` naming its file, row and column (it cannot be placed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pyarrow as pa

from etl.errors import RowError
from etl.io.parquet import batch_from_arrow
from etl.ops.base import InvalidRows
from etl.pipeline.split import LastSplit
from etl.pipeline.stages import RowGroupAt
from etl.schema import Schema

TRAIN, VALID, TEST = 0, 1, 2
#: The role code of each split's name.
ROLE_CODES = {"train": TRAIN, "valid": VALID, "test": TEST}
#: Bits of a row number in a position code (``input << ROW_BITS | row``): files of up to 2**40 rows.
ROW_BITS = 40
_INT64 = np.iinfo(np.int64)


def position_codes(inputs: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The int64 code of each position (shard index ``inputs``, row number ``rows``), ordered as the positions."""
    return (np.asarray(inputs, np.int64) << ROW_BITS) | np.asarray(rows, np.int64)


def _before(values: np.ndarray, bound: int | float) -> np.ndarray:
    """``values < bound``, exactly, for an integer bound beyond the range of int64 values too."""
    if values.dtype.kind == "i" and isinstance(bound, int) and not _INT64.min < bound <= _INT64.max:
        return np.full(len(values), bound > _INT64.max, np.bool_)
    return values < bound


@dataclass(frozen=True)
class TimeRoles:
    """A split by time (``etl.pipeline.split.TimeSplit``) with its bounds as values of ``column`` (of ``schema``):
    train rows before ``train_until``, valid rows before ``valid_until`` (None: no valid split), then test rows."""

    schema: Schema
    column: str
    train_until: int | float
    valid_until: int | float | None

    @property
    def columns(self) -> list[str]:
        return [self.column]

    def roles(self, table: pa.Table | None, inputs: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The role of each row of ``table`` (its split columns as read; ``inputs`` and ``rows``: the rows'
        positions, not needed here); ``InvalidRows`` for rows without a usable time."""
        if table is None:
            raise ValueError("a split by time reads the time column: no table given")
        col = batch_from_arrow(table, self.schema, columns=[self.column])[self.column]
        values = np.asarray(col.values)
        missing = np.zeros(len(values), np.bool_) if col.valid is None else ~np.asarray(col.valid, np.bool_)
        if values.dtype.kind == "f":
            missing |= np.isnan(values)
        if missing.any():
            raise InvalidRows(self.column, missing, "the split's time is missing, so the row has no split")
        out = np.where(_before(values, self.train_until), TRAIN, TEST).astype(np.int8)
        if self.valid_until is not None:
            out[(out == TEST) & _before(values, self.valid_until)] = VALID
        return out

    def describe(self, role: str) -> str:
        """The rows of ``role``, in one line (``889000000 <= timestamp < 891000000``)."""
        c, lo, hi = self.column, self.train_until, self.valid_until
        if role == "train":
            return f"{c} < {lo}"
        if role == "valid":
            return f"{lo} <= {c} < {hi}"
        return f"{c} >= {lo if hi is None else hi}"


@dataclass(frozen=True)
class LatestRoles:
    """A split by each key's latest events (``etl.pipeline.split.LastSplit``) resolved: ``codes`` (sorted
    ascending, ``position_codes``) are the positions of the valid and test rows, ``latest`` their roles."""

    split: LastSplit
    codes: np.ndarray
    latest: np.ndarray

    @property
    def columns(self) -> list[str]:
        return []

    def roles(self, table: pa.Table | None, inputs: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The role of each row at the positions (``inputs``, ``rows``); ``table`` is not needed."""
        wanted = position_codes(inputs, rows)
        at = np.minimum(np.searchsorted(self.codes, wanted), max(len(self.codes) - 1, 0))
        if not len(self.codes):
            return np.zeros(len(wanted), np.int8)
        found = self.codes[at] == wanted
        return np.where(found, self.latest[at], TRAIN).astype(np.int8)

    def describe(self, role: str) -> str:
        s = self.split
        order = f"by {', '.join([s.time, *s.tiebreak])}, then input position"
        if role == "test":
            return f"each {s.key}'s latest {s.test} events ({order})"
        if role == "valid":
            return f"each {s.key}'s {s.valid} events before its latest {s.test} ({order})"
        return f"each {s.key}'s events before its latest {s.valid + s.test} ({order})"


Assignment = TimeRoles | LatestRoles


class SplitStage:
    """The row-scope stage that passes on the rows of split ``role`` (a name of ``etl.pipeline.split.ROLES``) of
    ``assignment``, in order; ``inputs``: the index of each shard of the run by its path as the run names it (a
    row's position is its shard's index and its row number in the file)."""

    name: ClassVar[str] = "Split"
    scope: ClassVar[str] = "rows"

    def __init__(self, assignment: Assignment, role: str, inputs: dict[str, int]):
        self.assignment, self.role, self.inputs = assignment, role, inputs
        self.code = ROLE_CODES[role]
        self.columns: list[str] = assignment.columns

    def select(self, table: pa.Table, rows: np.ndarray, at: RowGroupAt | None = None) -> np.ndarray:
        if at is None or at.source not in self.inputs:
            raise ValueError(f"the split places rows by their input position: {at} is not a row group of this run's shards")
        part = table.select(self.columns).take(pa.array(rows)) if self.columns else None
        try:
            roles = self.assignment.roles(part, np.full(len(rows), self.inputs[at.source], np.int64), at.first_row + rows)
        except InvalidRows as e:
            i = int(np.flatnonzero(e.mask)[0])
            raise RowError(at.source, at.row_group, int(at.first_row + rows[i]), e.column, e.reason) from None
        return rows[roles == self.code]
