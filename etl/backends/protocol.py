"""What a backend is: the functions and classes that ops and pipelines call on a backend namespace ``xp``.

A backend is a module. ``etl.backends.cpu`` (numpy arrays, numba kernels) and ``etl.backends.tensor`` (torch tensors
on CPU or CUDA) both implement ``Backend``, with the same semantics and the same bits out (``etl.backends.tensor``
lists the exceptions). A module satisfies a Protocol structurally, so ``xp: Backend = cpu`` type-checks; the
assignments at the end of this module make a type checker verify both backends.

Types: ``Array`` stands for the backend's own array type, ``numpy.ndarray`` on the CPU backend and
``torch.Tensor`` on the torch backend (where uint64 keys are int64 tensors holding the same bits); the type checker
treats it as ``Any``, since no single static type covers both. A ``valid`` mask is a bool ``Array``, or None when no
value is missing; ``out_dtype`` is the numpy dtype of the ids (int32 or int64, ``etl.ids.id_dtype``). Results
that leave the backend (fitted statistics, counted keys, rendered text) are numpy whatever the backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from etl.backends.dates import DateFormat
from etl.batch import Array, Strings


class KeyCounterProtocol(Protocol):
    """Counts occurrences of keys over many batches, in memory proportional to the number of distinct keys."""

    def add(self, keys: Array, valid: Array | None) -> None:
        """Count each present key once."""
        ...

    def at_least(self, threshold: int) -> tuple[np.ndarray, np.ndarray]:
        """Host numpy (uint64 keys, int64 counts) of the keys counted at least ``threshold`` times (and at least
        once), in an order of the backend's choosing."""
        ...


class LookupTablesProtocol(Protocol):
    """The vocabularies of several columns (uint64 key → int64 id), looked up together."""

    def lookup(
        self, keys: list[Array], valids: list[Array | None], oov_base: int, oov_n: int, seed: int, out_dtypes: list[np.dtype]
    ) -> list[Array]:
        """ids of each column's ``keys`` in its table; an absent key gets ``oov_base + reduce(hash64(key, seed),
        oov_n)``, a missing one 1."""
        ...


class ValueTableProtocol(Protocol):
    """A constant host table of values (float64), kept on each device that reads it, gathered by index."""

    def take(self, idx: Array) -> Array:
        """``values[idx]`` (int64 indices in range) as an array of the backend, on the device of ``idx``."""
        ...


class Backend(Protocol):
    """The backend interface. Ids follow ``etl.ids`` (missing → 1, the op's own ids from 2); hashes and string keys
    follow ``etl.backends.hashing``."""

    @property
    def __name__(self) -> str:
        """The backend's module name: a key for what an op builds once per backend."""
        ...

    # ---- dense
    def fill_null(self, values: Array, valid: Array | None, value: float) -> Array:
        """float64 copy of ``values`` with missing entries replaced by ``value``."""
        ...

    def clamp(self, values: Array, lo: float | None, hi: float | None) -> Array:
        """float64 values limited to [lo, hi] (a bound of None is open)."""
        ...

    def log1p(self, values: Array) -> Array:
        """float64 ln(1 + x)."""
        ...

    def normalize(self, values: Array, mean: float, std: float) -> Array:
        """float64 (x - mean) / std."""
        ...

    def moments(self, values: Array, valid: Array | None) -> tuple[int, float, float] | None:
        """(count, sum, sum of squared deviations from their mean) of the present values in float64, or None when
        no value is present."""
        ...

    def magnitudes(self, values: Array, valid: Array | None) -> tuple[np.ndarray, float, float] | None:
        """The present values counted by their top 12 bits as float64 (sign and binary exponent: 4,096 counts),
        with their min and max, or None when no value is present."""
        ...

    def bucketize(self, values: Array, valid: Array | None, boundaries: np.ndarray, out_dtype: np.dtype) -> Array:
        """id = 2 + number of ``boundaries`` (sorted float64) <= value; missing → 1."""
        ...

    def nonfinite_mask(self, values: Array, valid: Array | None) -> Array | None:
        """Rows whose present value is NaN or ±inf, or None when there are none."""
        ...

    def first_nonfinite(self, columns: list[tuple[Array, Array | None]]) -> tuple[int, Array] | None:
        """The first of ``columns`` (values, valid) holding a present NaN or ±inf, as (its index, its
        ``nonfinite_mask``), or None."""
        ...

    def as_float32(self, values: Array) -> Array:
        """Float values rounded to float32 as the output holds them (beyond ±float32 max: ±inf); other values as
        they are."""
        ...

    def elementwise(self, fn: str, *args: Array | float) -> Array:
        """``fn`` applied value by value to ``args`` (arrays of one length, or numbers; at least one array but for the
        arithmetic functions), for ``etl.ops.expr``: "float64" (a float64 copy), "add", "sub", "mul", "div", "neg",
        "abs", "sqrt", "log1p" (float64 values), "lt", "le", "gt", "ge", "eq", "ne", "isnan" (bool), "and", "or",
        "not" (of bool arrays), "where" (condition, a, b: a where it holds, else b). Float64 arithmetic as IEEE 754
        rounds it (±inf and NaN where it overflows or is undefined)."""
        ...

    # ---- host data and lists
    def to_numpy(self, x: Array | Strings) -> Any:
        """The array as a numpy array on the host (``Strings`` as ``Strings`` of numpy arrays), dtype kept."""
        ...

    def from_host(self, values: np.ndarray, like: Array) -> Array:
        """The host numpy array ``values`` as an array of the backend, on the device of ``like``, dtype kept."""
        ...

    def ValueTable(self, values: np.ndarray) -> ValueTableProtocol:
        """A value table (``ValueTableProtocol``) of the host array ``values``."""
        ...

    def is_keys(self, values: Array | Strings) -> bool:
        """Whether ``values`` are decoded keys rather than raw values."""
        ...

    def take(self, values: Array | Strings, idx: Array) -> Array | Strings:
        """``values[idx]``; for text, the strings at positions ``idx`` compacted into a new buffer."""
        ...

    def first_x(self, offsets: Array, x: int) -> tuple[Array, Array]:
        """Keep the first ``x`` elements of each list: (element indices to keep, new offsets)."""
        ...

    # ---- decode raw values into uint64 keys, and back
    def decode_hex(self, s: Strings, valid: Array | None, width: int | None) -> tuple[Array, Array | None]:
        """Hex text (exactly ``width`` digits, or 1-16 when None) → keys; returns (keys, bad) where bad marks
        malformed present values (None if none)."""
        ...

    def decode_int_text(self, s: Strings, valid: Array | None) -> tuple[Array, Array | None]:
        """Decimal integer text (1-20 digits, a value in [-2**63, 2**64 - 1]) → the value's uint64 word as keys (a
        negative value: its two's complement); (keys, bad)."""
        ...

    def decode_string(self, s: Strings, valid: Array | None) -> Array:
        """Any text → ``string_key`` of its UTF-8 bytes."""
        ...

    def decode_int(self, values: Array) -> Array:
        """Integer values → their two's-complement bits as keys."""
        ...

    def encode_hex(self, keys: Array, valid: Array | None, width: int) -> tuple[np.ndarray, np.ndarray]:
        """The inverse of ``decode_hex``: ``width`` lowercase hex digits per present key, as numpy Arrow string
        buffers (int32 offsets, bytes)."""
        ...

    # ---- dates
    def date_parts(self, values: Array | Strings, valid: Array | None, fmt: DateFormat) -> tuple[Array, Array | None]:
        """The calendar parts (``etl.backends.dates.PARTS``) of text or int64 ``values`` read with ``fmt``, as an
        int64 [len(PARTS), n] array (0 under missing values and values that are not a date), and bad: the present
        values that are not a date in ``fmt`` (None when there are none)."""
        ...

    # ---- keys → ids
    def hash_ids(self, keys: Array, valid: Array | None, seed: int, n: int, out_dtype: np.dtype) -> Array:
        """id = 2 + reduce(hash64(key, seed), n); missing → 1."""
        ...

    def hash_columns(self, keys: list[Array], valids: list[Array | None], seed: int, n: int, out_dtype: np.dtype) -> list[Array]:
        """``hash_ids`` of several columns."""
        ...

    def bucket_ids(self, hashes: Array, valid: Array | None, n: int, out_dtype: np.dtype) -> Array:
        """id = 2 + reduce(hash, n) for values that are already hashes; missing → 1."""
        ...

    def cross_keys(self, keys: list[Array], valids: list[Array | None], seed: int) -> tuple[Array, Array | None]:
        """``cross_key`` of aligned key columns; a row is missing when any input is missing."""
        ...

    def LookupTables(self, tables: list[tuple[np.ndarray, np.ndarray]]) -> LookupTablesProtocol:
        """Lookup tables built from host (keys, ids) pairs, one per column."""
        ...

    def KeyCounter(self, rows: int | None = None) -> KeyCounterProtocol:
        """An empty key counter; ``rows``: the number of keys it will be given in all, when known (a sizing hint)."""
        ...


if TYPE_CHECKING:  # a type checker verifies that both backends implement the interface
    from etl.backends import cpu, tensor

    _cpu: Backend = cpu
    _tensor: Backend = tensor
