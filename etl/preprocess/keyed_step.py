"""What ``etl preprocess``'s exchange by key (``etl.preprocess.keyed``) needs from the step it feeds: History
(``etl.preprocess.keyed_history``) or Groupby (``etl.preprocess.keyed_groupby``).

The exchange spills every row with the key hash the step gives (``KeyedStep.key_hashes``), cuts the hash buckets
into partitions, reads each partition sorted by (key hash, ``KeyedStep.order``, input position) and hands it to
``KeyedStep.transform``, which yields its output slice by slice (``Sliced``); the exchange writes them, quarantines
the rejected rows and keeps the row accounting.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from etl.pipeline import OnError, Rejected

#: Rows per slice of a partition (one output row group each; Groupby's slices end at a group's end).
SLICE_ROWS = 1 << 16


@dataclass
class Sliced:
    """The output of one slice of a sorted partition: the partition ``rows`` it covered, the ``table`` written, the
    ``rejected`` rows (their positions in the partition) and the rows the step ``removed`` (neither written nor
    quarantined: History's short rows, the events Groupby folds into its groups); ``groups_dropped``: Groupby's
    groups ``min_len`` dropped; ``positions``: the partition position of each row of ``table``, for a step that
    writes a row per event (History; None for Groupby): a split run routes the rows by them."""

    rows: int
    table: pa.Table
    rejected: list[Rejected]
    removed: int
    groups_dropped: int = 0
    positions: np.ndarray | None = None


class KeyedStep(Protocol):
    """A step fed by the exchange by key."""

    #: its name in the manifest's stages; its key as the partitions' sources name it
    name: str
    key: str
    #: the columns (read as the schema declares them) ordering a key's rows after the key hash
    order: list[str]
    #: the list columns it writes (the npy format is refused for them)
    lists: list[str]
    #: it counts groups (``StageRows.groups_dropped``)
    groups: bool

    def key_hashes(self, table: pa.Table, source: str, group: int, first_row: int) -> tuple[np.ndarray, np.ndarray]:
        """Each row's key hash (uint64) in row group ``group`` of ``source`` as read (``table``, starting at row
        ``first_row``), and whether it has a usable key (else it goes to bucket 0, to be found invalid there)."""
        ...

    def transform(self, table: pa.Table, p: int, on_error: OnError, training: bool = False) -> Iterator[Sliced]:
        """The output of partition ``p`` (``table``: its rows as spilled, sorted), slice by slice, at least one
        slice (``training``: of training rows, ``Pipeline.transform``). A ``RowError`` names the row by its position
        in the partition (the exchange names its source)."""
        ...

    def column_name(self, column: str) -> str:
        """The schema column that a column of the step's batches (named in errors) stands for."""
        ...
