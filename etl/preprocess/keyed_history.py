"""History's step of ``etl preprocess``'s exchange by key (``etl.preprocess.keyed``): each sorted partition's rows
through the ops before History, History's state, the ``min_len`` rule and the ops after it.

A partition is transformed in slices of ``SLICE_ROWS`` rows: the label check (History's key and time checked with
it, ``History.check_sources``) and the ops before History, the check of its listed numbers
(``History.check_numbers``), History's lists (``etl.ops.history_sorted``, fresh for each partition: a key's rows all
lie in one partition, sorted, so the histories are exact), the ``min_len`` rule (rows shorter are dropped, counted as removed by History, or
quarantined), the ops after it and the output check.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.io.parquet import batch_from_arrow
from etl.ops.history import KEY_HASH, RAW_KEY, RAW_TIME, History, HistoryNumbers
from etl.ops.history_sorted import SortedHistory
from etl.pipeline import OnError, Pipeline, Rejected, Transformed
from etl.pipeline.exchange import HASH
from etl.preprocess.keyed_step import SLICE_ROWS, Sliced


class HistoryStep:
    """History (``op``, one of ``pipeline``'s ops) fed by the exchange by its key (``etl.preprocess.keyed_step``)."""

    groups = False

    def __init__(self, op: History, pipeline: Pipeline):
        self.op, self.pipeline = op, pipeline
        self.name, self.key, self.order, self.lists = op.name, op.key, [op.time, *op.tiebreak], op.lists
        where = pipeline.ops.index(op)
        self.before, self.after = pipeline.ops[:where], pipeline.ops[where + 1 :]
        self.checked = [*self.before, HistoryNumbers(op)] if op.numbers else self.before

    def key_hashes(self, table: pa.Table, source: str, group: int, first_row: int) -> tuple[np.ndarray, np.ndarray]:
        key = batch_from_arrow(table, self.pipeline.schema, source, group, first_row, [self.op.key])[self.op.key]
        hashes, usable, _ = self.op.key_hashes(key)
        return hashes, usable

    def transform(self, table: pa.Table, p: int, on_error: OnError, training: bool = False) -> Iterator[Sliced]:
        spec = self.op.state_spec()
        state = SortedHistory([i.column for i in spec.inputs], spec.outputs, self.op.max_len, self.op.ttl)
        for start in range(0, max(table.num_rows, 1), SLICE_ROWS):
            piece = table.slice(start, SLICE_ROWS)
            t, short = self._slice(state, piece, start, p, on_error, training)
            yield Sliced(piece.num_rows, self.pipeline.to_arrow(t.batch), t.rejected, short, positions=t.batch.row_ids)

    def _slice(self, state: SortedHistory, piece: pa.Table, start: int, p: int, on_error: OnError, training: bool) -> tuple[Transformed, int]:
        """Transform one slice of a sorted partition (``piece``: its rows ``start..``): the transformed batch with
        its rejected rows (their positions in the partition), and the rows ``min_len`` dropped."""
        op, pipeline = self.op, self.pipeline
        batch = batch_from_arrow(piece, pipeline.schema, f"<partition {p}>", 0, start)
        hashes = piece.column(HASH)
        usable = np.asarray(hashes.is_valid().to_numpy(zero_copy_only=False), np.bool_)
        batch = op.with_sources(batch, np.asarray(pc.fill_null(hashes, 0).to_numpy(), np.uint64), usable)
        # the label check refuses rows without a key or time
        t = pipeline.run_ops(batch, self.checked, on_error, labels=True, output=False, training=training)
        outputs = state.advance(op.carried(t.batch))
        t.batch = t.batch.with_columns(op.output_columns(outputs, t.batch))
        dropped = 0
        short = outputs[op.length] < op.min_len
        if short.any():
            if op.on_short == "quarantine":
                t.rejected.append(Rejected(t.batch.row_ids[short], op.length, f"the history holds fewer than min_len {op.min_len} events"))
            else:
                dropped = int(short.sum())
            t.batch = t.batch.take(np.flatnonzero(~short))
        rest = pipeline.run_ops(t.batch, self.after, on_error, labels=False, output=True, training=training)
        t.batch = rest.batch
        t.rejected += rest.rejected
        return t, dropped

    def column_name(self, column: str) -> str:
        """The schema column a batch column stands for (the columns History's run adds name its key and time)."""
        return {RAW_KEY: self.op.key, KEY_HASH: self.op.key, RAW_TIME: self.op.time}.get(column, column)
