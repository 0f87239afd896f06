"""Sequences in loader batches: the list columns of one ``History`` op (``etl.ops.history``) share their lengths.

A ``Sequence`` names them: its list columns (``hist_item``, ``hist_category``, ...) and its lengths column
(``hist_len``). In a ``LoaderBatch`` the lengths column is no sparse feature: it comes as ``batch.lengths[name]``
([B] int32, each row's history length), out of ``sparse`` and ``to_kjt``; the lists come as jagged values +
offsets in ``batch.lists`` as any list column and, with ``pad_to``, also padded:

- ``Padding``: one list column as a dense ``[B, L]`` tensor of ids (``batch.padded[column]``), in the batch's
  sparse id dtype. A row's history fills ``min(length, L)`` positions, oldest first; a history longer than ``L``
  keeps its latest ``L`` entries (the ones a next-item model attends to). The other positions hold ``etl.ids.PAD``
  (0): the id no op gives to a value (1 is a missing value, 2 on the ops' own ids, such as Categorify's
  out-of-vocabulary buckets and vocabulary), so ``padded != 0`` is the mask of the entries. ``pad_side="right"``
  puts the entries first (``[e1, e2, 0, 0]``), ``"left"`` last (``[0, 0, e1, e2]``: the latest entry always in
  the last column, as SASRec reads it). The lengths stay the histories' lengths (at most ``max_len``): ``arange(L) <
  lengths`` (right) or ``arange(L) >= L - lengths`` (left) is the mask of the entries, also for a history longer
  than ``L``.

The padded tensors live in the loader's ring slots beside ``label``, ``dense`` and ``sparse`` (allocated once,
filled by the assembler thread from the batch's lists, copied to the device as the other fields).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numba as nb
import numpy as np

from etl.batch import Array
from etl.errors import ConfigError
from etl.ops.base import Op
from etl.ops.history import History

#: Where ``Loader(pad_side=...)`` puts the entries' padding.
PAD_SIDES = ("left", "right")


@dataclass(frozen=True)
class Sequence:
    """The list columns of one History op (``lists``) and the column of their shared lengths (``length``)."""

    length: str
    lists: tuple[str, ...]


@dataclass(frozen=True)
class Padding:
    """List column ``column`` (of the sequence whose lengths are ``length``) padded to ``[B, pad_to]`` on
    ``side`` (see the module docstring); ``field``: its ring field."""

    column: str
    length: str
    pad_to: int
    side: str

    @property
    def field(self) -> str:
        return f"padded:{self.column}"


def sequences_of(ops: list[Op], lists: list[str], sparse: list[str]) -> tuple[Sequence, ...]:
    """The sequences of a pipeline's ``ops`` whose columns are in its batches (``lists``: the list columns,
    ``sparse``: the single-valued integer ones), in op order. ``ConfigError`` for a History whose lists hold numbers
    or passthrough values (``History.check_loadable``)."""
    for op in ops:
        if isinstance(op, History):
            op.check_loadable()
    return tuple(Sequence(op.length, tuple(op.lists)) for op in ops
                 if isinstance(op, History) and op.length in sparse and all(c in lists for c in op.lists))  # fmt: skip


def paddings(sequences: tuple[Sequence, ...], pad_to: int | Mapping[str, int] | None, pad_side: str) -> tuple[Padding, ...]:
    """The list columns to pad: with ``pad_to`` an int, every list of every sequence to it; a mapping gives a
    length per sequence, named by its lengths column (``{"hist_len": 50}``; the sequences it leaves out are not
    padded). ``ConfigError`` for a length below 1, a name that is no sequence's lengths column, a ``pad_side`` not
    in ``PAD_SIDES``, or ``pad_to`` without a sequence."""
    if pad_side not in PAD_SIDES:
        raise ConfigError(f"pad_side must be 'left' or 'right', got {pad_side!r}")
    if pad_to is None:
        return ()
    if not sequences:
        raise ConfigError("pad_to pads the lists of a History op; this loader's batches have none")
    names = [s.length for s in sequences]
    wanted = dict(pad_to) if isinstance(pad_to, Mapping) else dict.fromkeys(names, pad_to)
    for name, size in wanted.items():
        if name not in names:
            raise ConfigError(f"pad_to names {name!r}: a History op's lengths column is one of {names}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(f"pad_to must be an integer >= 1 (or a mapping of lengths column to one), got {size!r} for {name!r}")
    return tuple(Padding(c, s.length, wanted[s.length], pad_side) for s in sequences if s.length in wanted for c in s.lists)


def pad_into(values: Array, offsets: Array, out: np.ndarray, side: str) -> None:
    """Write the lists (``values``, ``offsets`` [n + 1]) into ``out`` [n, L] as the module docstring says."""
    if len(offsets) != out.shape[0] + 1 or out.dtype != values.dtype:
        raise ValueError(f"pad_into: {len(offsets) - 1} lists of {values.dtype} into {out.shape} {out.dtype}")
    _pad(values, offsets, out, side == "left")


@nb.njit(nogil=True, cache=True)
def _pad(values, offsets, out, left):
    n, size = out.shape
    for i in range(n):
        end = offsets[i + 1]
        take = min(end - offsets[i], size)
        first = size - take if left else 0
        for j in range(size):
            out[i, j] = 0
        for k in range(take):
            out[i, first + k] = values[end - take + k]
