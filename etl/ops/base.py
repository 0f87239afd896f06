"""What every op is: the columns it reads and writes, and ``transform(batch, xp)`` over a backend namespace ``xp``.

Ops never import a compute library beyond numpy for bookkeeping; the per-value work goes through ``xp``, an
``etl.backends.Backend``: the CPU backend ``etl.backends.cpu`` (numpy arrays) or the torch backend
``etl.backends.tensor`` (tensors on CPU or CUDA, uint64 keys held as int64 bits). Both implement the same functions
with the same bits out. Fittable ops add:

- ``new_stats(xp, rows) -> stats``: an empty accumulator: a dict with one independent entry per column (``rows``:
  how many rows it will be given in all when known, else None: a hint to size it, never a limit);
- ``partial_fit(stats, batch, xp)``: add one batch to an accumulator, for the columns the accumulator holds (the
  pipeline gives each column its own accumulator, which fitting threads update in turn); the result must not
  depend on the order of the batches (counts, sums reduced canonically at the end), so shards are fitted in any
  order by any number of workers with the same result;
- ``partials(stats, xp) -> {column: partial}``: the accumulator as plain data (numpy arrays, Arrow arrays,
  numbers: it pickles, no backend objects), so statistics gathered in other processes can be combined;
- ``merge(a, b) -> partial``: the partial of the union of two sets of rows; associative and commutative;
- ``finalize_partials(partials, xp)``: set the fitted state of the columns ``partials`` holds, from one partial
  per column (merged over all rows); ``finalize(stats, xp)`` is ``finalize_partials(partials(stats, xp), xp)``.
  Columns are independent: the pipeline may finalize each column's accumulator on its own, in parallel threads;
- ops whose partials are count tables (``etl.ops.counts.KeyCounts``: Categorify) also have ``rank(counts)``, the
  table thresholded, ordered and cut as the fitted state keeps it, and ``finalize_ranked(column, ranked, xp)``,
  which sets a column's state from the ranked table of all rows: a distributed fit ranks partitions of the keys
  separately and merges them (``etl.ops.counts.merge_ranked``);
- ``state() -> (json_dict, tables)`` and ``load_state(json_dict, tables)``: the fitted state as JSON plus Arrow
  tables named after the column each belongs to (saved as Parquet), never pickle; ``fitted_params()``: the
  parameters the tables depend on, recorded with each (``made_by``), so that a table loads only into the op,
  column and parameters that made it.
- ``fit_warnings()``: what the fit found doubtful (Normalize: a column whose normalized values collapse), one
  line each, kept in the state.

An op whose values for the rows it was fitted on must leave out what those rows contributed (TargetEncode)
overrides ``transform_training``, which ``Pipeline.transform(..., training=True)`` runs instead of ``transform``.

Ops whose values depend on the rows before them in a stream (an online vocabulary) declare the state they keep
with ``stream_specs`` and make it with ``new_stream_state`` (``etl.ops.stream``): the loader drives it, row by
row, and their ``transform`` raises.

An op that finds invalid values raises ``InvalidRows``; the pipeline turns it into a ``RowError`` naming the file,
row and column, or quarantines those rows and runs the op again on the rest. Fitted state is built on the host
(numpy, Arrow) whatever the backend, so artifacts are the same bytes.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa

from etl.backends import Array, Backend
from etl.batch import Batch, Column
from etl.schema import ColumnSpec

if TYPE_CHECKING:
    from etl.ops.counts import KeyCounts
    from etl.ops.stream import StreamSpec, StreamState

Stats = Any


class InvalidRows(Exception):
    """Rows of a batch hold values an op cannot transform. ``mask`` is per row of the batch (a bool array or
    tensor of the backend that found them)."""

    def __init__(self, column: str, mask: Array, reason: str):
        self.column, self.mask, self.reason = column, mask, reason
        super().__init__(f"column '{column}': {reason} ({int(mask.sum())} rows)")


class InvalidState(ValueError):
    """Fitted state given to ``load_state`` is invalid; ``table`` names the state table at fault (None: the JSON
    state)."""

    def __init__(self, problem: str, table: str | None = None):
        self.table = table
        super().__init__(problem)


def made_by(op: str, column: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The record a saved state or fitted table carries of what made it: the op's name, the column it belongs to and
    the parameters its meaning depends on (JSON values)."""
    return {"op": op, "column": column, "params": dict(params)}


def rows_with_bad_elements(col: Column, elem_mask: Array, xp: Backend) -> np.ndarray:
    """Per-row mask (numpy) from a per-value mask of backend ``xp`` (a list row is bad when any of its elements is)."""
    elem_mask = xp.to_numpy(elem_mask)
    if col.offsets is None:
        return elem_mask
    offsets = xp.to_numpy(col.offsets)
    rows = np.zeros(len(offsets) - 1, np.bool_)
    rows[np.searchsorted(offsets, np.flatnonzero(elem_mask), side="right") - 1] = True
    return rows


class Op:
    """Base class. Subclasses set ``name`` (the key used in pipeline YAML) and implement ``transform``."""

    name: ClassVar[str]
    fittable: ClassVar[bool] = False
    #: kind of values the op reads and writes: "number", "raw" (undecoded text/ints), "keys" (uint64), "ids";
    #: None means any kind, passed through unchanged. ``reads = "source"``: the column as the schema declares it
    #: (raw or number), before any op writes it; a tuple of kinds: any of them (``bind_kinds`` says which)
    reads: ClassVar[str | tuple[str, ...] | None] = "number"
    writes: ClassVar[str | None] = "number"
    #: a kind the op also accepts in the columns earlier ops create, and leaves as it is (Decode: the key columns
    #: of DateParts), or None
    keeps: ClassVar[str | None] = None
    #: the op needs every row of a key, in time order (History, ``etl.ops.history``): ``etl preprocess`` brings
    #: them together by an exchange; ``Pipeline.transform`` and the loader on raw shards cannot run it
    keyed: ClassVar[bool] = False
    #: ``columns`` may name crosses: in the pipeline file, an entry of the ``columns`` list that is itself a list of
    #: column names is one input made of those columns (TargetEncode); the op then gets its columns as a list of
    #: names and lists of names
    crosses: ClassVar[bool] = False
    #: ``transform`` writes each of ``columns`` in place from that column alone, with fitted state it never changes:
    #: the op on some of its columns (``on_columns``) gives them the values the whole op gives them. ``etl
    #: preprocess`` transforms a pipeline of such ops a few columns at a time (``etl.pipeline.column_groups``).
    columnwise: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass that sets no ``name`` of its own is named after its class."""
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickle as any object; but an op whose module ``etl.ops.user`` imported from a pipeline's directory pickles
        with that directory, so that a process that has not imported the module (a Dask worker) imports it from
        there (``etl.ops.user.rebuild``)."""
        from etl.ops.user import directory_of, rebuild  # etl.ops.user imports this module

        cls = type(self)
        directory = directory_of(cls)
        if directory is None or "." in cls.__qualname__:
            return super().__reduce_ex__(protocol)
        return rebuild, (str(directory), cls.__module__, cls.__qualname__), self.__getstate__()

    def __init__(self, columns: list[str], **params: Any):
        self.columns = list(columns)
        self.params = params
        self.specs: dict[str, ColumnSpec] = {}

    def on_columns(self, columns: list[str]) -> Op:
        """This op on those of its ``columns`` that ``columns`` names, sharing its parameters and fitted state (a
        ``columnwise`` op only: ``TypeError`` otherwise)."""
        if not self.columnwise:
            raise TypeError(f"{self.name} is not columnwise: it cannot run on some of its columns")
        op = copy.copy(self)
        op.columns = [c for c in self.columns if c in columns]
        op.specs = {c: s for c, s in self.specs.items() if c in op.columns}
        return op

    @classmethod
    def implied_columns(cls, params: dict[str, Any]) -> Any:
        """The ``columns`` selector of a pipeline entry that names none, implied by the entry's other parameters
        ``params``, or None: ``columns`` is required (the default). Expr: the columns its expression names. Raises
        ``ValueError`` when ``params`` imply none."""
        return None

    def bind(self, specs: dict[str, ColumnSpec]) -> None:
        """Attach the raw column specs of the columns this op reads (those that are schema columns)."""
        self.specs = {c: specs[c] for c in self.columns if c in specs}

    @property
    def outputs(self) -> list[str]:
        """Columns this op writes (by default, in place: the columns it reads)."""
        return self.columns

    def source_columns(self) -> list[str]:
        """Schema columns the op reads as the schema declares them (raw, whatever ops before it wrote), besides
        ``columns``: none by default (History: its key, time and tiebreak columns)."""
        return []

    def bind_kinds(self, kinds: dict[str, str]) -> None:
        """Attach the kind of each of ``columns`` as the op reads it (one of ``reads``), once the pipeline has
        followed the kinds through the ops before it. Nothing by default."""

    def check_sources(self, batch: Batch, xp: Backend) -> None:
        """Raise ``InvalidRows`` for the rows of ``batch`` (the schema's columns as read, before any op; backend
        ``xp``) that the
        op's ``source_columns`` make no input of it (History: a missing or malformed key, a missing time); checked
        with the labels (``Pipeline.check_labels``), so that the fit and the transform leave out the same rows.
        Columns the batch does not hold are not checked. None by default."""

    def new_columns(self) -> dict[str, ColumnSpec]:
        """Columns this op creates that later ops select by role (``"@categorical"``) and bind like schema columns,
        with their specs (none by default)."""
        return {}

    def transform(self, batch: Batch, xp: Backend) -> dict[str, Column]:
        raise NotImplementedError

    def transform_training(self, batch: Batch, xp: Backend) -> dict[str, Column]:
        """``transform`` of training rows: the rows the fitted statistics were gathered from
        (``Pipeline.transform(..., training=True)``). The same as ``transform``, but for an op whose value for such
        a row must leave the row's own statistics out (TargetEncode: out-of-fold encodings)."""
        return self.transform(batch, xp)

    @property
    def is_fitted(self) -> bool:
        return True

    def cardinalities(self) -> dict[str, int]:
        """Embedding table size of each id column this op outputs (ids are in [0, size))."""
        return {}

    def cardinalities_given(self, earlier: dict[str, int]) -> dict[str, int]:
        """``cardinalities``, for an op whose id columns take the sizes of columns of earlier ops (``earlier``:
        theirs, by column; History's lists hold the ids of the columns they list)."""
        return self.cardinalities()

    # fittable ops override these
    def new_stats(self, xp: Backend, rows: int | None = None) -> Stats:
        raise NotImplementedError

    def partial_fit(self, stats: Stats, batch: Batch, xp: Backend) -> None:
        raise NotImplementedError

    def partials(self, stats: Stats, xp: Backend) -> dict[str, Any]:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def finalize_partials(self, partials: dict[str, Any], xp: Backend) -> None:
        raise NotImplementedError

    def finalize(self, stats: Stats, xp: Backend) -> None:
        """Set the fitted state of the columns the accumulator holds."""
        self.finalize_partials(self.partials(stats, xp), xp)

    # ops whose partials are count tables override these
    #: the most vocabulary entries kept (None: no limit)
    max_size: int | None = None

    def rank(self, counts: KeyCounts) -> KeyCounts:
        raise NotImplementedError

    def finalize_ranked(self, column: str, ranked: KeyCounts, xp: Backend) -> None:
        raise NotImplementedError

    def state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        return {}, {}

    def fitted_params(self) -> dict[str, Any]:
        """The parameters the fitted tables of ``state`` depend on (JSON values; none by default)."""
        return {}

    def fit_warnings(self) -> list[str]:
        """What the fit found doubtful about the fitted state (one line each, naming the op and the column), kept in
        the state: none by default."""
        return []

    # ops with streaming state override these
    def stream_specs(self) -> list[StreamSpec]:
        """The streaming states this op keeps (``etl.ops.stream``), none by default."""
        return []

    def new_stream_state(self, name: str) -> StreamState:
        """A new streaming state ``name`` (one of ``stream_specs``), starting from the fitted state."""
        raise NotImplementedError

    def load_state(self, doc: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        """Set the fitted state from what ``state`` returned; raise ``ValueError`` (``InvalidState`` naming the
        table when one is at fault) when it is not a state ``finalize`` could have produced."""
        return None

