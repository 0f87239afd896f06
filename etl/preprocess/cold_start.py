"""Cold start in a split run (``etl.preprocess.split``): the values of a valid or test split that the vocabularies
fitted on the train rows lack.

For every Categorify column of the pipeline (in pipeline order), over the split's rows that reach Categorify (the
rows the row-scope stages pass on, placed in the split, that the label check and the ops before Categorify keep):
the values whose key is not in the column's vocabulary (so they get an out-of-vocabulary id; with
``freq_threshold: 1`` and no ``max_size``, exactly the values no train row holds), counted as the rows holding at
least one (a list column's row may hold several) and the distinct values among them (distinct keys: Decode's).
Missing values are not counted (they get the missing id, in train too).

One pass over the shards in threads, reading the columns that feed Categorify. Memory: the distinct unseen keys of
each column, 8 bytes each.
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa

from etl.io.arrow import from_numpy, to_numpy
from etl.io.fs import Location
from etl.io.parquet import batch_from_arrow
from etl.io.processed import Unseen
from etl.ops.categorical import Categorify
from etl.pipeline import Pipeline
from etl.pipeline.plan import fit_plan
from etl.pipeline.split_rows import ROLE_CODES, Assignment
from etl.pipeline.stages import RowGroupAt
from etl.preprocess.split_pass import each_row_group
from etl.runtime.progress import Progress


class _Distinct:
    """The distinct keys added so far (merged into one sorted array once more are waiting than are held)."""

    def __init__(self) -> None:
        self.held = np.zeros(0, np.uint64)
        self.waiting: list[np.ndarray] = []
        self.count = 0

    def add(self, keys: np.ndarray) -> None:
        self.waiting.append(np.unique(keys))
        self.count += len(self.waiting[-1])
        if self.count > max(len(self.held), 1 << 16):
            self.merge()

    def merge(self) -> np.ndarray:
        self.held = np.unique(np.concatenate([self.held, *self.waiting]))
        self.waiting, self.count = [], 0
        return self.held


def unseen_in_train(pipeline: Pipeline, assignment: Assignment, role: str, shards: list[Location], workers: int,
                    progress: Progress | None = None) -> tuple[Unseen, ...]:  # fmt: skip
    """The values of the rows of split ``role`` (``assignment`` places the rows of ``shards``) that the vocabularies
    of ``pipeline`` (fitted on train; its stages those before the split) lack, per Categorify column, in pipeline
    order (see the module docstring); ``workers`` threads, ``progress`` hears of the ``"unseen"`` pass."""
    ops = [op for op in pipeline.ops if isinstance(op, Categorify)]
    if not ops:
        return ()
    prep, columns = fit_plan(pipeline, list(ops))
    vocab = {c: np.sort(to_numpy(op.vocab[c].column("key"))) for op in ops for c in op.columns}
    rows = dict.fromkeys(vocab, 0)
    distinct = {c: _Distinct() for c in vocab}
    code = ROLE_CODES[role]
    lock = threading.Lock()

    def work(index: int, part: pa.Table, at: RowGroupAt, positions: np.ndarray) -> None:
        mine = assignment.roles(part, np.full(len(positions), index, np.int64), at.first_row + positions) == code
        batch = batch_from_arrow(part.filter(from_numpy(mine)), pipeline.schema, at.source, at.row_group, columns=columns)
        t = pipeline.run_ops(batch, prep, "quarantine", labels=True, output=False)
        for c in vocab:
            col = t.batch[c]
            keys = np.asarray(col.array, np.uint64)
            found = np.searchsorted(vocab[c], keys)
            unseen = vocab[c][np.minimum(found, max(len(vocab[c]) - 1, 0))] != keys if len(vocab[c]) else np.ones(len(keys), np.bool_)
            if col.valid is not None:
                unseen &= np.asarray(col.valid, np.bool_)
            held = np.flatnonzero(unseen)
            if col.offsets is not None:  # a list column: the rows of its unseen values
                held = np.unique(np.searchsorted(np.asarray(col.offsets), held, side="right") - 1)
            with lock:
                rows[c] += len(held)
                distinct[c].add(keys[unseen])

    each_row_group(pipeline, list(dict.fromkeys([*columns, *assignment.columns])), shards, workers, work, progress, name="unseen")
    return tuple(Unseen(c, rows[c], len(distinct[c].merge())) for c in vocab)
