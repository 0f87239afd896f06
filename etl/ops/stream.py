"""Streaming state: what an op keeps across the rows of a stream, and the contract the loader drives it by.

Some ops give their output column values as a stream of rows goes by, from a state the rows before changed: an
online vocabulary (Categorify ``online: true``, ``etl.ops.online_vocab``) gives ids while it admits and evicts
keys; a per-key history or a running per-key mean would fill their columns from per-key buffers or sums. Such an
op declares each state it keeps (``Op.stream_specs``: one ``StreamSpec``) and makes it on demand
(``Op.new_stream_state``); the loader drives it without knowing the op (``etl.loader.stream_state``):

- the loader's worker threads run every other op of the pipeline; the columns a state reads (``spec.inputs``) are
  carried to it raw, as the ops before it left them (values in a declared dtype and a valid mask per row:
  ``Carried``), and the fields of the columns it writes (``spec.outputs``, dense or single-valued sparse columns of
  the batch) are left for it to fill;
- the assembler thread hands each batch's carried inputs to the state, in the batch's row order, one ``advance``
  per batch; the state returns the values of its output columns for the batch's rows, the events to report with
  the batch, and what the update changed (its undo record), so that the loader can produce the state at any
  position between the consumer and the assembler;
- the state at a position is exported as ``StateArrays``: named integer scalars (``spec.scalars``) and named 1-D
  arrays of one length (one table, ``spec.arrays`` gives each array's dtype); in canonical order (``canonical``)
  the same rows give the same arrays whatever the order the updates left the state in. The loader saves it with its
  position (``state_dict``) and as Parquet + JSON (``etl.pipeline.saved_streams``), with the op, column and
  parameters that made it (``spec.made_by``); a saved state is restored only into a state of the same name and
  ``made_by``, and only once ``check`` takes it.

Each state is driven by one thread at a time (the loader holds a lock around it); states of different columns may
advance in parallel threads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from etl.ops.base import Op, made_by

#: A state: named integer scalars and named 1-D arrays of one length (see the module docstring).
StateArrays = dict[str, np.ndarray | int]


class StreamInput(NamedTuple):
    """A column a state reads, carried to it raw through the loader's worker threads as ``dtype`` values (integer
    columns of the same width are reinterpreted, others converted) with a valid mask."""

    column: str
    dtype: np.dtype


class Carried(NamedTuple):
    """The carried values of one input column over some rows: ``values`` [n] in the input's dtype, ``valid`` [n]
    bool (False: missing)."""

    values: np.ndarray
    valid: np.ndarray


class UndoRecord(Protocol):
    """What one ``advance`` changed, as the state hands it back to ``export(undo=...)``; ``nbytes``: its size."""

    @property
    def nbytes(self) -> int: ...


class RowRejected(ValueError):
    """A state's refusal of one row of the batch it advances over (``row``: its index in the batch; ``column``: the
    column at fault, ``problem``: why). The rows before it are taken; the loader reports it as a ``RowError``
    naming the row's file, row group and row."""

    def __init__(self, row: int, column: str, problem: str):
        self.row, self.column, self.problem = row, column, problem
        super().__init__(f"row {row} of the batch, column '{column}': {problem}")


@dataclass(frozen=True)
class StreamStep:
    """The result of one ``advance``: ``outputs`` (per output column, one value per row of the batch, in row
    order), ``events`` (what to report with the batch, of the op's own type, e.g. ``VocabEvents``; None: nothing),
    ``undo`` (what the update changed) and ``evicted`` (the keys a bounded per-key state dropped to make room for
    the batch's keys: History's ``max_keys``, counted in the loader's stats)."""

    outputs: dict[str, np.ndarray]
    events: Any
    undo: UndoRecord
    evicted: int = 0


@dataclass(frozen=True)
class StreamSpec:
    """One streaming state an op keeps: ``name`` (unique in a pipeline: its key in a loader's state and saved
    states; the column it gives, for a state of one column), ``op`` (the op's name), ``column`` (the column it
    belongs to), ``params`` (JSON values: every parameter the state's meaning depends on), ``kind`` (what it is,
    for messages: "online vocabulary"), ``inputs`` (columns carried to it), ``outputs`` (columns it writes),
    ``scalars`` and ``arrays`` (the names of its state's scalars, and its arrays with their dtypes), ``lengths``
    (per output that is a list column, the output holding each row's list length: the list output's values are
    then the rows' lists one after the other) and ``per_epoch`` (each epoch of a loader starts it from the state
    the op made it with, not from where the epoch before left it: a per-key history, whose rows of a new epoch are
    no later than those seen)."""

    name: str
    op: str
    column: str
    params: dict[str, Any]
    kind: str
    inputs: tuple[StreamInput, ...]
    outputs: tuple[str, ...]
    scalars: tuple[str, ...]
    arrays: dict[str, np.dtype] = field(default_factory=dict)
    lengths: dict[str, str] = field(default_factory=dict)
    per_epoch: bool = False

    @property
    def made_by(self) -> dict[str, Any]:
        """The record a saved state carries of what made it (``etl.ops.base.made_by``)."""
        return made_by(self.op, self.column, self.params)

    def describe(self) -> str:
        """``kind of 'name'``, for messages."""
        return f"{self.kind} of '{self.name}'"


class StreamState(ABC):
    """One streaming state (see the module docstring). Not thread-safe: one thread drives it at a time."""

    spec: StreamSpec

    @abstractmethod
    def advance(self, inputs: Mapping[str, Carried]) -> StreamStep:
        """Take the rows of one batch (``inputs``: the carried values of every input column, at least those of
        ``spec.inputs``), in order, and give the values of the output columns for them. Raising, it may leave the
        state changed midway (the loader then refuses every state until one is loaded)."""

    @abstractmethod
    def export(self, canonical: bool = True, undo: Sequence[Any] = ()) -> StateArrays:
        """The state now, or, given the undo records of the last updates (newest first), the state before them;
        ``canonical=False``: the arrays in any order (a quicker copy that ``restore`` takes as well)."""

    @abstractmethod
    def canonical(self, state: StateArrays) -> StateArrays:
        """``state`` (an ``export``) in canonical order."""

    @abstractmethod
    def check(self, state: StateArrays) -> None:
        """``InvalidState`` naming the problem unless ``restore`` takes ``state`` (of ``spec``'s scalars and
        arrays, typed as declared); changes nothing."""

    @abstractmethod
    def restore(self, state: StateArrays) -> None:
        """Take a state ``export`` gave: the state then behaves exactly as the one exported."""


def stream_specs(ops: list[Op]) -> list[StreamSpec]:
    """The streaming states of ``ops``, in op order."""
    return [s for op in ops for s in op.stream_specs()]


def describe_specs(specs: Iterable[StreamSpec]) -> str:
    """Streaming states for messages: ``online vocabulary of 'C1' (Categorify), ...``."""
    return ", ".join(f"{s.describe()} ({s.op})" for s in specs)
