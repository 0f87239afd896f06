"""Ops on list (multi-hot) columns."""

from __future__ import annotations

from etl.backends import Backend
from etl.batch import Batch, Column
from etl.ops.base import Op


class FirstX(Op):
    """Keep the first ``x`` values of each list (in their original order); shorter lists are unchanged.

    Works at any stage: on raw text, on keys or on ids."""

    name = "FirstX"
    columnwise = True
    reads = writes = None

    def __init__(self, columns: list[str], x: int):
        super().__init__(columns)
        if not isinstance(x, int) or isinstance(x, bool) or x < 1:
            raise ValueError(f"FirstX.x must be an integer >= 1, got {x!r}")
        self.x = x

    def transform(self, batch: Batch, xp: Backend) -> dict[str, Column]:
        out = {}
        for c in self.columns:
            col = batch[c]
            if not col.is_list:
                raise ValueError(f"FirstX: column '{c}' is not a list column")
            idx, offsets = xp.first_x(col.offsets, self.x)
            out[c] = Column(
                xp.take(col.values, idx),
                None if col.valid is None else col.valid[idx],
                offsets,
                None if col.raw is None else xp.take(col.raw, idx),
            )
        return out
