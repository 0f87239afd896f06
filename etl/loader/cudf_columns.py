"""Parquet row groups decoded on the GPU by cudf, handed over as device columns: the only module that imports cudf.

``read_columns`` reads one row group of a file straight into device memory (``pylibcudf.io.parquet.read_parquet``,
the row group selected in the reader's options) and returns the rows of a piece in the **device column layout**
that ``etl.loader.device_columns`` consumes: per column an ``etl.batch.Column`` of torch tensors on the GPU, made
from cudf's buffers through ``__cuda_array_interface__`` without a copy where the layout allows:

- int64 / float64 columns: ``values`` of the schema's dtype (other integer or float widths converted on the
  device; unsigned 64-bit numbers of a label or dense column converted to float64 by value, keys keep their bits),
  ``valid`` bool from the null mask (None without nulls);
- string columns: ``etl.batch.Strings`` (``data`` uint8, ``starts``/``ends`` int64 from the offsets) and ``valid``.

Text is not decoded here: the host part of the pipeline (``Decode``) runs next with the torch backend on the same
device, so hex and integer text is decoded on the GPU by the same code, with the same errors, as on every other
path (cudf's ``str.htoi`` would accept what ``Decode`` refuses). List columns are not read (``unavailable`` says
so). Work is queued on the calling thread's current stream; the tensors are ready once it has been synchronised.
"""

from __future__ import annotations

import importlib.util

import torch

from etl.batch import Column, Strings
from etl.schema import Schema

_TORCH_TYPES = {
    "INT8": torch.int8, "INT16": torch.int16, "INT32": torch.int32, "INT64": torch.int64,
    "UINT8": torch.uint8, "UINT16": torch.int16, "UINT32": torch.int32, "UINT64": torch.int64,
    "FLOAT32": torch.float32, "FLOAT64": torch.float64,
}  # fmt: skip
_WIDENED_UNSIGNED = {"UINT16": 1 << 16, "UINT32": 1 << 32}  # read as the signed type of the same width, then fixed up


def unavailable(device: torch.device, schema: Schema) -> str | None:
    """Why ``reader="cudf"`` cannot run here, in one line, or None when it can."""
    if device.type != "cuda":
        return f"reader='cudf' decodes Parquet into GPU memory: it needs device='cuda', not {str(device)!r}"
    if not torch.cuda.is_available():
        return f"reader='cudf' needs a GPU: torch {torch.__version__} sees no CUDA device"
    if importlib.util.find_spec("pylibcudf") is None:
        return "reader='cudf' needs cudf, which is not installed (pip install 'etl[gpu]')"
    lists = [c.name for c in schema.columns if c.is_list]
    if lists:
        return f"reader='cudf' does not read list columns (column '{lists[0]}'); use the default reader"
    return None


def read_columns(path: str, schema: Schema, columns: list[str], row_group: int, start: int, length: int,
                 device: torch.device) -> dict[str, Column]:  # fmt: skip
    """Rows ``[start, start + length)`` of row group ``row_group`` of the local Parquet file ``path``: ``columns``
    in the device column layout (see the module docstring), on ``device``."""
    import pylibcudf as plc  # imported here: only this reader needs it

    options = plc.io.parquet.ParquetReaderOptions.builder(plc.io.types.SourceInfo([path])).build()
    options.set_columns(columns)
    options.set_row_groups([[row_group]])
    read = plc.io.parquet.read_parquet(options)
    names = read.column_names()
    out = {}
    for name, col in zip(names, read.tbl.columns()):
        spec = schema.column(name)
        whole = _strings(col, device) if spec.dtype == "string" else _numbers(col, spec.dtype, spec.role in ("label", "dense"), device)
        valid = _valid(col, device)
        out[name] = Column(_rows(whole, start, length), None if valid is None else valid[start : start + length])
    return out


def _buffer(span: object | None, device: torch.device) -> torch.Tensor:
    """A device buffer (``gpumemoryview``) as a uint8 tensor on ``device``, without a copy (empty when None)."""
    if span is None:
        return torch.zeros(0, dtype=torch.uint8, device=device)
    return torch.as_tensor(span, device=device).view(torch.uint8)


def _numbers(col: object, dtype: str, numbers: bool, device: torch.device) -> torch.Tensor:
    """The values of a fixed-width column as ``dtype`` ("int64" or "float64")."""
    type_name = col.type().id().name  # type: ignore[attr-defined]
    if type_name not in _TORCH_TYPES:
        raise TypeError(f"cudf column of type {type_name} is not a number column")
    raw = _buffer(col.data(), device).view(_TORCH_TYPES[type_name])  # type: ignore[attr-defined]
    values = raw[col.offset() : col.offset() + col.size()]  # type: ignore[attr-defined]
    if type_name in _WIDENED_UNSIGNED:
        values = values.to(torch.int64) % _WIDENED_UNSIGNED[type_name]
    if type_name == "UINT64" and numbers:  # the 64 bits as a number (keys keep their bits)
        low = (values & 0xFFFFFFFF).to(torch.float64)
        return ((values >> 32) & 0xFFFFFFFF).to(torch.float64) * 4294967296.0 + low
    return values.to(torch.int64 if dtype == "int64" else torch.float64)


def _strings(col: object, device: torch.device) -> Strings:
    """A string column's bytes and offsets (its first child) as ``Strings``."""
    offsets_col = col.child(0)  # type: ignore[attr-defined]
    width = torch.int64 if offsets_col.type().id().name == "INT64" else torch.int32
    offsets = _buffer(offsets_col.data(), device).view(width)
    offsets = offsets[col.offset() : col.offset() + col.size() + 1].to(torch.int64)  # type: ignore[attr-defined]
    return Strings(_buffer(col.data(), device), offsets[:-1], offsets[1:])  # type: ignore[attr-defined]


def _valid(col: object, device: torch.device) -> torch.Tensor | None:
    """The null mask (bit i of the little-endian bitmask: row i is present) as a bool tensor, or None."""
    if col.null_count() == 0:  # type: ignore[attr-defined]
        return None
    bits = _buffer(col.null_mask(), device)  # type: ignore[attr-defined]
    shifts = torch.arange(8, dtype=torch.uint8, device=device)
    unpacked = ((bits.unsqueeze(1) >> shifts) & 1).reshape(-1).to(torch.bool)
    return unpacked[col.offset() : col.offset() + col.size()]  # type: ignore[attr-defined]


def _rows(values: torch.Tensor | Strings, start: int, length: int) -> torch.Tensor | Strings:
    """Rows ``[start, start + length)`` of a column's values (views)."""
    if isinstance(values, Strings):
        return Strings(values.data, values.starts[start : start + length], values.ends[start : start + length])
    return values[start : start + length]
