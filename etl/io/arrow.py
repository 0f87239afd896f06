"""Arrow arrays built from numpy arrays and Python strings over their buffers.

``pyarrow.array`` (and ``pyarrow.table`` over numpy arrays or lists) imports pandas the first time it runs, to
recognise pandas objects: a quarter of a second or more of a short command's start-up. The command line's paths
build their arrays here instead, from the buffers, with the same result as ``pyarrow.array``: same type, values
and nulls.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa


def validity(valid: np.ndarray | None) -> pa.Buffer | None:
    """The Arrow validity bitmap of ``valid`` (bool, True where a value is present); None when nothing is missing."""
    if valid is None or bool(valid.all()):
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def from_numpy(values: np.ndarray, type: pa.DataType | None = None, valid: np.ndarray | None = None) -> pa.Array:
    """``values`` (a 1-d numpy array of numbers or bools) as an Arrow array of ``type`` (default: the type of
    ``values``' dtype), null where ``valid`` is False. ``values`` is converted to ``type``'s numpy dtype first
    when it differs, as ``values.astype`` would (no copy when it is already of that dtype)."""
    t = pa.from_numpy_dtype(values.dtype) if type is None else type
    if values.ndim != 1:
        raise ValueError(f"from_numpy: a 1-d array is needed, got shape {values.shape}")
    nulls = validity(valid)
    if pa.types.is_boolean(t):
        data = pa.py_buffer(np.packbits(values.astype(np.bool_, copy=False), bitorder="little"))
    else:
        data = pa.py_buffer(np.ascontiguousarray(values.astype(t.to_pandas_dtype(), copy=False)))
    null_count = 0 if nulls is None or valid is None else len(values) - int(np.count_nonzero(valid))
    return pa.Array.from_buffers(t, len(values), [nulls, data], null_count=null_count)


def strings(texts: Sequence[str]) -> pa.Array:
    """Python strings as an Arrow ``string`` array (no nulls)."""
    encoded = [s.encode() for s in texts]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    large = pa.Array.from_buffers(pa.large_string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])
    return large.cast(pa.string())


def to_numpy(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The values of an Arrow array (or chunked array) of fixed-width numbers without nulls, as a numpy array
    (no copy when it has one chunk). ``TypeError`` for other types, ``ValueError`` when a value is null."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()
    t = arr.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
        raise TypeError(f"to_numpy: an array of fixed-width numbers is needed, got {t}")
    if arr.null_count:
        raise ValueError(f"to_numpy: {arr.null_count} null value(s)")
    dtype = np.dtype(t.to_pandas_dtype())
    if len(arr) == 0:
        return np.zeros(0, dtype)
    return np.frombuffer(arr.buffers()[1], dtype)[arr.offset : arr.offset + len(arr)]
