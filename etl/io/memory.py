"""Raw rows held in memory (the serving path) → an Arrow table that ``etl.io.parquet.batch_from_arrow`` reads.

Accepted: a ``pyarrow.Table`` (or ``RecordBatch``), a pandas or polars ``DataFrame``, any object that exports an
Arrow stream (``__arrow_c_stream__``), and a ``dict`` of column name → list (or numpy array) of values. A value
``None`` is a missing value in every column (so is NaN in a pandas float column: pandas has no other missing
value for floats). Each schema column found keeps its Arrow type when that type can hold the column
(``etl.io.parquet.check_type``), else it is cast to the raw type of ``etl.io.text.raw_arrow_schema``, safely:
a column of only ``None`` (typed null), whole floats in an integer column (pandas turns an integer column with a
missing value into floats) and the like; text is never parsed into numbers. A value the raw type cannot hold is
an ``InputError`` naming the column.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from etl.errors import InputError
from etl.io.parquet import check_type
from etl.io.text import raw_arrow_schema
from etl.schema import Schema

#: The name rows held in memory have in error messages.
SOURCE = "<table>"


def arrow_table(data: Any, schema: Schema) -> pa.Table:
    """``data`` (see the module docstring) as an Arrow table whose columns named by ``schema`` have types that
    ``batch_from_arrow`` accepts; other columns are left as they are."""
    table = _to_arrow(data)
    raw = raw_arrow_schema(schema)
    for spec in schema.columns:
        if spec.name not in table.column_names:
            continue
        i = table.column_names.index(spec.name)
        column = table.column(i)
        try:
            check_type(SOURCE, spec, column.type)
            continue
        except InputError as e:
            wrong_type = e
        target = raw.field(spec.name).type
        if not _castable(column.type, target):
            raise wrong_type
        try:
            column = column.cast(target, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise InputError(SOURCE, f"{wrong_type.problem}, and they cannot be read as {target}: {e}", column=spec.name) from None
        table = table.set_column(i, pa.field(spec.name, target), column)
    return table


def _castable(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether values of type ``source`` are cast to ``target`` at all: nulls to anything, numbers to numbers (the
    cast then refuses values that would change), lists element by element. Text is never parsed into numbers."""
    if pa.types.is_null(source):
        return True
    if pa.types.is_list(source) or pa.types.is_large_list(source):
        return pa.types.is_list(target) and _castable(source.value_type, target.value_type)
    numeric = (pa.types.is_integer, pa.types.is_floating)
    return any(f(source) for f in numeric) and any(f(target) for f in numeric)


def _to_arrow(data: Any) -> pa.Table:
    """``data`` as an Arrow table, each column with the type Arrow infers (null for a column of only None)."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, dict):
        return _from_dict(data)
    module = type(data).__module__.split(".")[0]
    if module == "pandas":
        return pa.Table.from_pandas(data, preserve_index=False)
    if module == "polars":
        return data.to_arrow()
    if hasattr(data, "__arrow_c_stream__"):
        return pa.table(data)
    raise TypeError(f"expected a pyarrow Table, a pandas or polars DataFrame or a dict of lists, got {type(data).__name__}")


def _from_dict(data: dict[str, Any]) -> pa.Table:
    arrays = {}
    for name, values in data.items():
        try:
            arrays[str(name)] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise InputError(SOURCE, f"values Arrow cannot read as one column: {e}", column=str(name)) from None
    lengths = {name: len(a) for name, a in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise InputError(SOURCE, f"columns of different lengths: {lengths}")
    return pa.table(arrays)
