"""``TargetEncode``: each category's mean target, smoothed towards the prior, out of fold for the training rows.

In a pipeline's ops, after the ops that make the categories ids (Categorify, Hash)::

    - {op: TargetEncode, columns: [item_id, [user_id, item_id]], target: label, kfold: 5, fold_by: user_id,
       seed: 42, smoothing: 20, prefix: "te_"}

It writes, for each entry of ``columns``, the float32 column ``{prefix}{name}`` (a cross ``[a, b]``: ``{prefix}a_b``).

What a category is. TargetEncode reads **ids**, as the ops before it leave them: a category is an id of the column
(Categorify's vocabulary ids, its out-of-vocabulary buckets, the missing id 1; Hash's buckets), or, for a cross, a
combination of the ids of its columns (``cross_key`` of the ids, ``etl.backends.hashing``, seed 0: a 64-bit key, whose
collisions are negligible). So the values Categorify puts in an out-of-vocabulary bucket share that bucket's
statistics, and a missing value is a category of its own. The columns are single-valued (no lists).

The target. ``target`` names a schema column of role label or dense, read as the schema declares it (before any op).
Its values are counted to 2**-20 (``etl.ops.target_stats``: 0/1 labels, ratings in halves, integers exactly), so
that sums are exact and the statistics the same bits on any number of workers, threads or Dask workers. A row
whose target is missing is left out of the statistics (a label never is: the label check rejects such rows, in fit
and transform alike); a present target that is NaN, infinite or beyond ±2**31 makes the row invalid (checked with
the label, so fit and transform leave out the same rows). The target is not read at transform: serving rows need
none.

Statistics. Fitting counts, per category c and fold f, the rows ``N_cf`` and the target sum ``S_cf`` (a row with a
target counts in its own fold), in one pass, as sums that merge in any order. ``N_c``, ``S_c``: over every fold;
``N``, ``S``: over every row; ``N_f``, ``S_f``: over the rows of fold f.

Folds. The fold of a row is, with ``fold_by``, ``reduce(hash64(v, seed), kfold)`` where v is its ``fold_by`` value
as TargetEncode sees it (an id, as a uint64; ``fold_by`` names a categorical column made ids before it), so every row
of a user shares one fold; without ``fold_by``, ``reduce(cross_key([string_key(name), row], seed), kfold)`` where
``name`` is the name of its input file (its last path component: the same wherever the file lies) and ``row`` its
row number in that file (from 0; in ``Pipeline.transform_table``, its position in the table). ``hash64``,
``reduce``, ``cross_key`` and ``string_key`` are the documented functions of ``etl.backends.hashing``. A fold never
depends on how the input is cut into row groups, batches, workers or partitions.

Values. With ``m = smoothing``:

- rows that are not training rows (``Pipeline.transform``, ``transform_table``, validation and test, serving):
  ``(S_c + m * P) / (N_c + m)`` with the prior ``P = S / N``; a category not seen at fit gets ``P``;
- training rows, those the statistics were gathered from (``Pipeline.transform(..., training=True)``; ``etl
  preprocess`` on the rows it fits, ``--training``): out of fold, for a row of fold f, ``(S_c - S_cf + m * P_f) /
  (N_c - N_cf + m)`` with ``P_f = (S - S_f) / (N - N_f)``, the mean target of the rows outside fold f, so no row's
  own target ever reaches its value; ``P_f`` when ``N_c - N_cf + m`` is 0 (a category only seen in fold f, with
  ``m = 0``). A prior over no rows is 0.

Values are computed in float64 from the exact sums and written as float32. ``export_fold: true`` also writes the
int32 column ``{prefix}fold`` (0 .. kfold - 1: the fold of each row, for checking; an integer column the loader
would treat as categorical: leave it off for training).

``mode: ordered`` (streaming, ``etl.ops.target_ordered``): no fit and no folds; the Loader gives each row, in its row
order (``shuffle=False``), ``(s_c + m * P) / (n_c + m)`` from the rows strictly before it in the stream (CatBoost's
ordered target statistics), each epoch from an empty state, kept and resumed like an online vocabulary
(``state_dict``, ``save_vocabulary``). ``Pipeline.transform`` and ``etl preprocess`` refuse such an op.

Fitted state per encoded column: a Parquet table (key uint64, fold int32, count int64, sum float64) with an entry
per (category, fold) seen, ordered by key then fold (a single column's key is its id; a cross's its cross key),
and, in the JSON state, each fold's rows and target sum (``etl.ops.target_state``). Loading checks the table against
them (``InvalidState`` naming the column): every row counts in exactly one category of each encoded column, so the
entries of each fold add up to the fold's totals exactly.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from etl.backends import Array, Backend, LookupTablesProtocol, ValueTableProtocol, cpu
from etl.backends.hashing import check_seed, string_key
from etl.batch import Batch, Column
from etl.errors import ConfigError, FitError
from etl.ops.base import InvalidRows, InvalidState, Op, Stats
from etl.ops.stream import Carried, StreamInput, StreamSpec, StreamState
from etl.ops.target_ordered import STATE_ARRAYS, STATE_SCALARS, OrderedTargetStream
from etl.ops.target_state import loaded_state, saved_state
from etl.ops.target_stats import (
    MAX_SUM_UNITS,
    MAX_TARGET,
    FoldStats,
    FoldSums,
    full_encodings,
    merge_stats,
    out_of_fold_encodings,
    target_units,
)
from etl.schema import ColumnSpec

#: The seed of the cross key of a cross's ids (fixed: a category does not depend on ``seed``, which picks folds).
CROSS_SEED = 0
#: The most folds.
MAX_FOLDS = 100
#: What ``mode`` takes.
MODES = ("kfold", "ordered")

#: Held while an op builds its tables for a backend (one lock for all ops: a build happens once per op and backend).
_BUILDING = threading.Lock()


@dataclass
class _Tables:
    """What a transform on one backend looks up: each encoded column's categories (key → entry 2..; an unseen key →
    0) and its full and out-of-fold value tables (the latter built when training rows first need them)."""

    entries: LookupTablesProtocol
    full: list[ValueTableProtocol]
    out_of_fold: list[ValueTableProtocol] | None = None


class TargetEncode(Op):
    """Target encoding, out of fold for training rows (see the module docstring)."""

    name = "TargetEncode"
    reads, writes = "ids", "number"
    fittable = True
    crosses: ClassVar[bool] = True

    def __init__(self, columns: list[Any], target: Any = None, kfold: Any = 5, fold_by: Any = None, seed: Any = 0, smoothing: Any = 20,
                 prefix: Any = "te_", export_fold: Any = False, mode: Any = "kfold"):  # fmt: skip
        groups = [_group(entry) for entry in columns]
        if not groups:
            raise ValueError("TargetEncode encodes at least one column")
        if not isinstance(target, str) or not target:
            raise ValueError(f"TargetEncode.target must name the column of the target (a label or dense column), got {target!r}")
        if isinstance(kfold, bool) or not isinstance(kfold, int) or not 2 <= kfold <= MAX_FOLDS:
            raise ValueError(f"TargetEncode.kfold must be an integer in [2, {MAX_FOLDS}], got {kfold!r}")
        if fold_by is not None and (not isinstance(fold_by, str) or not fold_by):
            raise ValueError(f"TargetEncode.fold_by must be a column name, got {fold_by!r}")
        check_seed(seed)
        if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not math.isfinite(smoothing) or smoothing < 0:
            raise ValueError(f"TargetEncode.smoothing must be a finite number >= 0, got {smoothing!r}")
        if not isinstance(prefix, str) or not prefix or any(ch in prefix for ch in "/\\\0") or prefix.startswith("."):
            raise ValueError(f"TargetEncode.prefix must be a non-empty text without '/', '\\', NUL or a leading '.', got {prefix!r}")
        if not isinstance(export_fold, bool):
            raise ValueError(f"TargetEncode.export_fold must be true or false, got {export_fold!r}")
        if mode not in MODES:
            raise ValueError(f"TargetEncode.mode must be one of {list(MODES)}, got {mode!r}")
        if mode == "ordered" and (fold_by is not None or export_fold):
            raise ValueError("TargetEncode.fold_by and export_fold are for mode: kfold; mode: ordered has no folds (rows see the rows before)")
        #: "kfold": fitted statistics, out of fold for training rows; "ordered": the loader's running statistics
        self.mode: str = mode
        #: the encoded inputs (one column, or the columns of a cross) and the column each writes
        self.groups = groups
        self.names = [prefix + "_".join(g) for g in groups]
        self.fold_column = f"{prefix}fold" if export_fold else None
        written = self.names + ([self.fold_column] if self.fold_column else [])
        twice = sorted({c for c in written if written.count(c) > 1})
        if twice:
            raise ValueError(f"TargetEncode: two of its inputs write column '{twice[0]}'")
        inputs = list(dict.fromkeys([c for g in groups for c in g] + ([fold_by] if fold_by else [])))
        super().__init__(inputs)
        self.target, self.kfold, self.fold_by, self.seed = target, kfold, fold_by, seed
        self.smoothing = float(smoothing)
        self.stats: dict[str, FoldStats] = {}
        self._tables: dict[str, _Tables] = {}

    # ------------------------------------------------------------------ columns
    @property
    def outputs(self) -> list[str]:
        return self.names + ([self.fold_column] if self.fold_column else [])

    def bind(self, specs: dict[str, ColumnSpec]) -> None:
        """Attach the specs; ``ValueError`` for a list column among its inputs, or a target that is not a label or
        dense column (unknown names are the pipeline's to report)."""
        super().bind(specs)
        lists = [c for c in self.columns if c in self.specs and self.specs[c].is_list]
        if lists:
            raise ValueError(f"TargetEncode: column '{lists[0]}' is a list column; it encodes single values")
        target = specs.get(self.target)
        if target is not None and (target.role not in ("label", "dense") or target.is_list):
            raise ValueError(f"TargetEncode.target: column '{self.target}' is of role {target.role}; the target is a label or dense column")

    def source_columns(self) -> list[str]:
        """The target, read as the schema declares it."""
        return [self.target]

    def cardinalities(self) -> dict[str, int]:
        """The fold column's (when exported): kfold values."""
        return {self.fold_column: self.kfold} if self.fold_column else {}

    def check_sources(self, batch: Batch, xp: Backend) -> None:
        """``InvalidRows`` for the rows whose target is present and NaN, infinite or beyond ±2**31 (a batch without
        the target, as at serving, is not checked)."""
        col = batch.columns.get(self.target)
        if col is None:
            return
        values = np.asarray(xp.to_numpy(col.values), np.float64)
        with np.errstate(invalid="ignore"):
            bad = ~(np.abs(values) <= MAX_TARGET)
        if col.valid is not None:
            bad &= np.asarray(xp.to_numpy(col.valid), np.bool_)
        if bad.any():
            raise InvalidRows(self.target, bad, "target is NaN, infinite or beyond ±2**31 (TargetEncode)")

    # ------------------------------------------------------------------ categories and folds
    def _keys(self, batch: Batch, group: tuple[str, ...], xp: Backend) -> Array:
        """The category key of every row for ``group`` (uint64; int64 bits on the torch backend)."""
        ids = [xp.decode_int(batch[c].array) for c in group]
        if len(ids) == 1:
            return ids[0]
        return xp.cross_keys(ids, [None] * len(ids), CROSS_SEED)[0]

    def _folds(self, batch: Batch, xp: Backend, like: Array) -> Array:
        """The fold of every row (int32 in [0, kfold), on the device of ``like``; see the module docstring)."""
        if self.fold_by is not None:
            return xp.hash_ids(xp.decode_int(batch[self.fold_by].array), None, self.seed, self.kfold, np.dtype(np.int32)) - 2
        name = batch.source.replace("\\", "/").rsplit("/", 1)[-1]
        rows = np.asarray(batch.row_ids, np.int64).view(np.uint64)
        file_key = np.full(len(rows), string_key(name.encode()), np.uint64)
        hashes, _ = cpu.cross_keys([file_key, rows], [None, None], self.seed)
        return xp.from_host(cpu.bucket_ids(hashes, None, self.kfold, np.dtype(np.int32)) - 2, like)

    # ------------------------------------------------------------------ fit
    def new_stats(self, xp: Backend, rows: int | None = None) -> Stats:
        return {name: FoldSums(self.kfold) for name in self.names}

    def partial_fit(self, stats: Stats, batch: Batch, xp: Backend) -> None:
        """Count the rows of ``batch`` with a target in the accumulators ``stats`` holds (on the host, whatever the
        backend)."""
        host = Batch({c: Column(*(None if a is None else xp.to_numpy(a) for a in (batch[c].values, batch[c].valid)))
                      for c in [*self.columns, self.target]}, batch.num_rows, batch.source, batch.row_group, batch.row_ids)  # fmt: skip
        target = host[self.target]
        present = np.ones(host.num_rows, np.bool_) if target.valid is None else np.asarray(target.valid, np.bool_)
        units = target_units(np.where(present, np.asarray(target.values, np.float64), 0.0))
        folds = np.asarray(self._folds(host, cpu, units), np.int64)
        for name, acc in stats.items():
            try:
                acc.add(self._keys(host, self.groups[self.names.index(name)], cpu), folds, units, present)
            except OverflowError as e:
                raise FitError(self.name, self.target, f"{e} (the target of {name}; scale it down)") from None

    def partials(self, stats: Stats, xp: Backend) -> dict[str, FoldStats]:
        """Per encoded column ``stats`` holds: its statistics (``FoldStats``: plain data)."""
        return {name: stats[name].stats() for name in stats}

    def merge(self, a: FoldStats, b: FoldStats) -> FoldStats:
        try:
            return merge_stats(a, b)
        except OverflowError as e:
            raise FitError(self.name, self.target, f"{e} (scale the target down)") from None

    def finalize_partials(self, partials: dict[str, FoldStats], xp: Backend) -> None:
        """Take each column's statistics (``FitError`` when a sum of the target is beyond 2**33, where its float64
        would not be exact)."""
        for name, stats in partials.items():
            if stats.widest_sum() > MAX_SUM_UNITS:
                raise FitError(self.name, self.target, f"a target sum (for {name}) is beyond 2**33, where float64 stops being exact; scale it down")
            self.stats[name] = stats
        self._tables = {}

    @property
    def is_fitted(self) -> bool:
        """Whether the statistics are fitted (``mode: ordered`` fits nothing: its statistics are the stream's)."""
        return self.mode == "ordered" or all(name in self.stats for name in self.names)

    # ------------------------------------------------------------------ transform
    def transform(self, batch: Batch, xp: Backend) -> dict[str, Column]:
        """The full-statistics encodings (rows that are not training rows)."""
        return self._encode(batch, xp, training=False)

    def transform_training(self, batch: Batch, xp: Backend) -> dict[str, Column]:
        """The out-of-fold encodings (training rows)."""
        return self._encode(batch, xp, training=True)

    def _encode(self, batch: Batch, xp: Backend, training: bool) -> dict[str, Column]:
        if self.mode == "ordered":
            raise ConfigError(f"TargetEncode with mode: ordered ({', '.join(self.names)}) gives each row the statistics of the rows before it "
                              "as the Loader streams them (etl.Loader); it cannot transform a batch on its own (etl preprocess, "
                              "transform_table)")  # fmt: skip
        tables = self._built(xp)
        keys = [self._keys(batch, g, xp) for g in self.groups]
        entries = tables.entries.lookup(keys, [None] * len(keys), 0, 1, CROSS_SEED, [np.dtype(np.int64)] * len(keys))
        folds = self._folds(batch, xp, entries[0]) if training or self.fold_column else None
        if training:
            out = {name: Column(t.take(e * self.kfold + folds)) for name, t, e in zip(self.names, self._out_of_fold(xp, tables), entries)}
        else:
            out = {name: Column(t.take(e)) for name, t, e in zip(self.names, tables.full, entries)}
        if self.fold_column:
            out[self.fold_column] = Column(folds)
        return out

    def _built(self, xp: Backend) -> _Tables:
        """The tables of backend ``xp``, built once: the first thread to need them builds them while the others
        wait."""
        t = self._tables.get(xp.__name__)
        if t is None:
            with _BUILDING:
                t = self._tables.get(xp.__name__)
                if t is None:
                    full = [full_encodings(self.stats[name], self.smoothing) for name in self.names]
                    entries = xp.LookupTables([(keys, np.arange(2, 2 + len(keys), dtype=np.int64)) for keys, _ in full])
                    t = self._tables[xp.__name__] = _Tables(entries, [xp.ValueTable(values) for _, values in full])
        return t

    def _out_of_fold(self, xp: Backend, tables: _Tables) -> list[ValueTableProtocol]:
        """The out-of-fold value tables of ``tables`` (backend ``xp``), built when training rows first need them."""
        if tables.out_of_fold is None:
            with _BUILDING:
                if tables.out_of_fold is None:
                    tables.out_of_fold = [xp.ValueTable(out_of_fold_encodings(self.stats[name], self.smoothing)) for name in self.names]
        return tables.out_of_fold

    # ------------------------------------------------------------------ streaming (mode: ordered)
    def stream_specs(self) -> list[StreamSpec]:
        """With ``mode: ordered``, one state per encoded column (``etl.ops.target_ordered``), named after it: it reads
        the group's ids and the target, and writes the column; each epoch starts it empty. None with ``kfold``."""
        if self.mode != "ordered":
            return []
        specs = []
        for group, name in zip(self.groups, self.names):
            params = {"columns": list(group), "target": self.target, "smoothing": self.smoothing}
            inputs = (*(StreamInput(c, np.dtype(np.int64)) for c in group), StreamInput(self.target, np.dtype(np.float64)))
            specs.append(StreamSpec(name, self.name, name, params, "ordered target statistics", inputs, (name,), STATE_SCALARS, STATE_ARRAYS,
                                    per_epoch=True))  # fmt: skip
        return specs

    def new_stream_state(self, name: str) -> StreamState:
        """The (empty) running statistics of the encoded column ``name``."""
        specs = {s.name: s for s in self.stream_specs()}
        if name not in specs:
            raise ValueError(f"TargetEncode: no ordered statistics named {name!r} (its states: {list(specs)})")
        group = self.groups[self.names.index(name)]

        def keys(inputs: Mapping[str, Carried]) -> np.ndarray:
            ids = [np.asarray(inputs[c].values, np.int64).view(np.uint64) for c in group]
            return ids[0] if len(ids) == 1 else cpu.cross_keys(ids, [None] * len(ids), CROSS_SEED)[0]

        return OrderedTargetStream(specs[name], keys, self.target, self.smoothing)

    # ------------------------------------------------------------------ artifacts
    def fitted_params(self) -> dict[str, Any]:
        """What the statistics depend on: the encoded columns, the target and the folds (not ``smoothing``, which the
        encodings apply to them)."""
        return {"columns": [list(g) for g in self.groups], "target": self.target, "kfold": self.kfold, "fold_by": self.fold_by, "seed": self.seed}

    def state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        """The statistics as JSON and one table per encoded column (``etl.ops.target_state``); nothing with ``mode:
        ordered``."""
        return ({}, {}) if self.mode == "ordered" else saved_state(self.stats)

    def load_state(self, doc: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        """Take each column's table and fold totals, checked to be ones ``finalize`` could have written
        (``InvalidState`` naming the column otherwise, ``etl.ops.target_state``); with ``mode: ordered``, nothing (a
        state without tables)."""
        if self.mode == "ordered":
            if doc or tables:
                raise InvalidState(f"TargetEncode with mode: ordered fits nothing, and the state holds {sorted(doc) or sorted(tables)}")
            return
        self.stats = loaded_state(doc, tables, self.names, self.kfold)
        self._tables = {}


def _group(entry: Any) -> tuple[str, ...]:
    """One entry of ``columns``: a column name, or a list of names (two or more: a cross)."""
    if isinstance(entry, str) and entry:
        return (entry,)
    if isinstance(entry, list) and entry and all(isinstance(c, str) and c for c in entry):
        if len(set(entry)) < len(entry):
            raise ValueError(f"TargetEncode: the cross {entry} names a column twice")
        return tuple(entry)
    raise ValueError(f"TargetEncode.columns: expected a column name or a list of names (a cross), got {entry!r}")
