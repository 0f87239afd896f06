"""Groupby's step of ``etl preprocess``'s exchange by key (``etl.preprocess.keyed``): each sorted partition's events
through the ops, then one row per group (``etl.pipeline.groupby``, ``etl.pipeline.groups``).

The exchange spills each row with the hash of its ``by`` values and sorts each partition by (hash, ``by`` values,
``sort_by``, input position): a group's events are together, in order. A partition is transformed in slices that
end where a group ends (at least ``SLICE_ROWS`` events each, but the last; a larger group is a slice of its own):
the label check (which also rejects the events missing a ``by`` value), the ops and the output check over the
slice's events, then the groups of the events left: those whose float aggregates float32 cannot hold are rejected
(their events quarantined, or the run stops naming the first one), those of fewer than ``min_len`` events
dropped, the others aggregated into the output rows, one row group per slice.

Row accounting (``Sliced``): of a slice's events, those rejected are quarantined, and the rest are ``removed``
but for one per group written (the events folded into the groups, and those of the groups dropped).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from etl.errors import RowError
from etl.io.parquet import batch_from_arrow
from etl.pipeline import OnError, Pipeline, Rejected
from etl.pipeline.groupby import Groupby
from etl.pipeline.groups import Groups, aggregate, invalid, key_hashes, new_groups
from etl.preprocess.keyed_step import SLICE_ROWS, Sliced


class GroupbyStep:
    """The Groupby that ends ``pipeline``'s ops, fed by the exchange by its key (``etl.preprocess.keyed_step``)."""

    name = Groupby.name
    groups = True

    def __init__(self, pipeline: Pipeline):
        if pipeline.groupby is None:
            raise ValueError("the pipeline has no Groupby")
        self.groupby: Groupby = pipeline.groupby
        self.pipeline = pipeline
        self.key = ", ".join(self.groupby.by)
        self.order = [*self.groupby.by, *self.groupby.sort_by]
        self.lists = [a.name for a in self.groupby.aggregates if a.agg == "list"]

    def key_hashes(self, table: pa.Table, source: str, group: int, first_row: int) -> tuple[np.ndarray, np.ndarray]:
        by = self.groupby.by
        return key_hashes(batch_from_arrow(table, self.pipeline.schema, source, group, first_row, by), by)

    def transform(self, table: pa.Table, p: int, on_error: OnError, training: bool = False) -> Iterator[Sliced]:
        schema = self.pipeline.output_schema()  # of the fitted pipeline
        fields = {c: self.pipeline.event_field(c) for c in self.groupby.value_columns}  # as a pipeline without Groupby writes them
        new = new_groups(table, self.groupby.by)
        group = np.cumsum(new) - 1
        starts = np.flatnonzero(new)
        start = 0
        while True:
            at = int(np.searchsorted(starts, start + SLICE_ROWS))
            stop = int(starts[at]) if at < len(starts) else table.num_rows
            yield self._slice(table.slice(start, stop - start), start, group, p, on_error, schema, fields, training)
            if stop >= table.num_rows:
                return
            start = stop

    def _slice(self, piece: pa.Table, start: int, group: np.ndarray, p: int, on_error: OnError, schema: pa.Schema,
               fields: dict[str, pa.Field], training: bool) -> Sliced:  # fmt: skip
        """The groups of one slice (``piece``: the partition's rows ``start..``, whole groups; ``group``: each
        partition row's group number), as rows of the output ``schema`` (``fields``: the output fields of the event
        columns whose values it writes)."""
        pipeline, g = self.pipeline, self.groupby
        batch = batch_from_arrow(piece, pipeline.schema, f"<partition {p}>", 0, start)
        # the label check rejects events without their key
        t = pipeline.run_ops(batch, pipeline.ops, on_error, labels=True, output=True, training=training)
        events = t.batch
        groups = Groups.of(group[events.row_ids])
        keep = np.ones(len(groups.starts), np.bool_)
        for bad, a in invalid(g, events, groups):
            reason = f"the group's {a.agg} of '{a.column}' is NaN, infinite or beyond the float32 range"
            rows = events.row_ids[groups.rows(bad)]
            if on_error == "raise":
                raise RowError(events.source, 0, int(rows[0]), a.column, reason)
            t.rejected.append(Rejected(rows, a.column, reason))
            keep &= ~bad
        short = keep & (groups.counts < g.min_len)
        kept = groups.take(keep & ~short)
        out = aggregate(g, events, kept, schema, pipeline.to_arrow, fields.__getitem__)
        quarantined = sum(len(r.rows) for r in t.rejected)
        return Sliced(piece.num_rows, out, t.rejected, piece.num_rows - quarantined - out.num_rows, int(short.sum()))

    def column_name(self, column: str) -> str:
        return column
