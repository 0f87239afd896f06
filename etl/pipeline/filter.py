"""The ``Filter`` stage: keep the rows of a row group that match a condition on raw columns.

A pipeline file names it in its ``stages`` list (``etl.pipeline.stages``)::

    stages:
      - {stage: Filter, where: {column: I1, op: ">=", value: 0}}
      - {stage: Filter, where: {all: [{column: label, op: not_null}, {any: [{column: C1, op: in, value: [a, b]},
                                                                          {not: {column: I2, op: "<", value: 5}}]}]}}

A condition is a comparison ``{column: C, op: OP, value: V}``, a null test ``{column: C, op: is_null}`` (or
``not_null``), or a combination: ``{all: [conditions]}`` (every one holds), ``{any: [conditions]}`` (at least
one holds), ``{not: condition}``. Nothing is evaluated as code: the condition is data, compiled into vectorised
Arrow and numpy kernels over the row group.

Semantics (each leaf is true or false for every row; ``all``, ``any`` and ``not`` combine those booleans):

- Columns are the schema's columns (any role but ``drop``) as read from Parquet, before any op: a dense column
  holds its raw numbers, not the filled and log-transformed ones.
- ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=`` compare with ``value``; ``in`` and ``not_in`` with a non-empty list
  of values. A null never matches a comparison (``!=`` and ``not_in`` included); ``is_null`` and ``not_null``
  test for it. So ``{not: {column: I1, op: ">", value: 0}}`` keeps the nulls of I1, ``{column: I1, op: "<=",
  value: 0}`` does not. A float NaN is a value, not a null: it matches ``!=`` and ``not_in`` only.
- ``value`` must fit the column's schema dtype: an integer for ``int64``, a number for ``float64``, a string for
  ``string`` (never a boolean). Integers compare exactly, whatever their width in the file (unsigned 64-bit
  included); strings compare by their UTF-8 bytes (the order of code points).
- List columns only take ``is_null`` and ``not_null`` (a null list, not an empty one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from etl.errors import SpecError
from etl.io.arrow import strings, to_numpy
from etl.schema import ColumnSpec, Schema

COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")
SETS = ("in", "not_in")
NULL_TESTS = ("is_null", "not_null")
OPS = COMPARISONS + SETS + NULL_TESTS

_NUMPY = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}
#: pyarrow.compute's function of each comparison (the module is imported when a filter runs, not with this one:
#: ``etl preprocess`` without a Filter stage never loads it)
_ARROW = {"==": "equal", "!=": "not_equal", "<": "less", "<=": "less_equal", ">": "greater", ">=": "greater_equal"}


def _array(table: pa.Table, name: str) -> pa.Array:
    """Column ``name`` of ``table`` as one array, a dictionary decoded."""
    col = table.column(name)
    arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return arr.dictionary_decode() if pa.types.is_dictionary(arr.type) else arr


def _bools(arr: pa.Array) -> np.ndarray:
    """A boolean Arrow array as a numpy bool array, null as False."""
    import pyarrow.compute as pc

    return np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), dtype=np.bool_)


@dataclass(frozen=True)
class Leaf:
    """One test on one column: ``op`` (one of ``OPS``) with ``value`` (a scalar, a list for ``in``/``not_in``,
    None for the null tests). ``text``: the column holds strings (compared as UTF-8 bytes)."""

    column: str
    op: str
    value: Any
    text: bool

    def mask(self, table: pa.Table) -> np.ndarray:
        import pyarrow.compute as pc

        arr = _array(table, self.column)
        if self.op in NULL_TESTS:
            nulls = _bools(arr.is_null())
            return nulls if self.op == "is_null" else ~nulls
        valid = _bools(arr.is_valid())
        if self.text:
            binary = arr.cast(pa.large_binary())
            if self.op in SETS:
                found = _bools(pc.is_in(binary, value_set=strings(self.value).cast(pa.large_binary())))
            else:
                return _bools(getattr(pc, _ARROW[self.op])(binary, strings([self.value]).cast(pa.large_binary())[0]))
        else:
            values = to_numpy(pc.fill_null(arr, 0)) if arr.null_count else to_numpy(arr)
            if self.op in SETS:
                found = np.isin(values, _representable(self.value, values.dtype))
            else:
                return valid & _NUMPY[self.op](values, self.value)
        return valid & (found if self.op == "in" else ~found)

    @property
    def columns(self) -> list[str]:
        return [self.column]


def _representable(values: list[int | float], dtype: np.dtype) -> np.ndarray:
    """``values`` as an array of ``dtype`` (the dtype of a column's values) for ``np.isin``: an integer column
    leaves out the values it cannot hold (no value of the column equals them), a float column takes them all."""
    if not np.issubdtype(dtype, np.integer):
        return np.array(values, np.float64)
    info = np.iinfo(dtype)
    held = [int(v) for v in values if (isinstance(v, int) or v.is_integer()) and info.min <= v <= info.max]
    return np.array(held, dtype)


@dataclass(frozen=True)
class Combined:
    """``all`` (every part holds), ``any`` (one part holds) or ``not`` (the one part does not hold)."""

    how: str
    parts: tuple[Leaf | Combined, ...]

    def mask(self, table: pa.Table) -> np.ndarray:
        masks = [p.mask(table) for p in self.parts]
        if self.how == "not":
            return ~masks[0]
        reduce = np.logical_and if self.how == "all" else np.logical_or
        return reduce.reduce(masks) if len(masks) > 1 else masks[0]

    @property
    def columns(self) -> list[str]:
        return [c for p in self.parts for c in p.columns]


Condition = Leaf | Combined


class Filter:
    """Keep the rows where the condition ``where`` holds (see the module docstring), in their order."""

    name: ClassVar[str] = "Filter"
    scope: ClassVar[str] = "rows"

    def __init__(self, where: Condition):
        self.where = where
        self.columns: list[str] = list(dict.fromkeys(where.columns))

    @classmethod
    def parse(cls, params: dict[str, Any], schema: Schema, path: str, where: str) -> Filter:
        """The stage of ``params`` (the mapping of the pipeline file, ``stage`` left out), checked against
        ``schema``: ``SpecError`` naming ``path`` and the field (``where`` is the stage's own) for an unknown or
        missing parameter, an unknown column or operator, or a value of the wrong type for its column."""
        unknown = sorted(set(params) - {"where"})
        if unknown:
            raise SpecError(path, f"{where}.{unknown[0]}", "unknown parameter of Filter (it has where)")
        if "where" not in params:
            raise SpecError(path, f"{where}.where", "missing: the condition rows must meet to be kept")
        return cls(_condition(params["where"], {c.name: c for c in schema.columns}, path, f"{where}.where"))

    def select(self, table: pa.Table, rows: np.ndarray, at: Any = None) -> np.ndarray:
        """The positions of ``rows`` (positions in ``table``, in order) whose row matches the condition (which
        reads values only: where the row group lies, ``at``, plays no part)."""
        return rows[self.where.mask(table)[rows]]


def _condition(doc: Any, specs: dict[str, ColumnSpec], path: str, where: str) -> Condition:
    if not isinstance(doc, dict):
        raise SpecError(path, where, f"expected a condition mapping ({{column, op, value}}, all, any or not), got {doc!r}")
    combined = [k for k in ("all", "any", "not") if k in doc]
    if combined:
        how = combined[0]
        if len(doc) != 1:
            raise SpecError(path, where, f"'{how}' stands alone in its mapping, got keys {sorted(doc)}")
        inner = doc[how]
        if how == "not":
            return Combined("not", (_condition(inner, specs, path, f"{where}.not"),))
        if not isinstance(inner, list) or not inner:
            raise SpecError(path, f"{where}.{how}", f"expected a non-empty list of conditions, got {inner!r}")
        return Combined(how, tuple(_condition(c, specs, path, f"{where}.{how}[{i}]") for i, c in enumerate(inner)))
    return _leaf(doc, specs, path, where)


def _leaf(doc: dict[str, Any], specs: dict[str, ColumnSpec], path: str, where: str) -> Leaf:
    unknown = sorted(set(doc) - {"column", "op", "value"})
    if unknown:
        raise SpecError(path, f"{where}.{unknown[0]}", "unknown key of a condition (it has column, op and value; or all, any, not)")
    column, op = doc.get("column"), doc.get("op")
    if not isinstance(column, str):
        raise SpecError(path, f"{where}.column", f"expected a column name, got {column!r}")
    spec = specs.get(column)
    if spec is None:
        raise SpecError(path, f"{where}.column", f"no column named '{column}' in the schema (columns: {', '.join(specs)})")
    if op not in OPS:
        raise SpecError(path, f"{where}.op", f"unknown operator {op!r}; known: {', '.join(OPS)}")
    if op in NULL_TESTS:
        if "value" in doc:
            raise SpecError(path, f"{where}.value", f"{op} takes no value")
        return Leaf(column, op, None, spec.dtype == "string")
    if spec.is_list:
        raise SpecError(path, f"{where}.op", f"column '{column}' is a list column: only {' and '.join(NULL_TESTS)} apply to it")
    if "value" not in doc:
        raise SpecError(path, f"{where}.value", f"missing: {op} compares with a value")
    value = doc["value"]
    if op in SETS:
        if not isinstance(value, list) or not value:
            raise SpecError(path, f"{where}.value", f"{op} takes a non-empty list of values, got {value!r}")
        for v in value:
            _check_value(v, spec, path, f"{where}.value")
    else:
        _check_value(value, spec, path, f"{where}.value")
    return Leaf(column, op, value, spec.dtype == "string")


def _check_value(value: Any, spec: ColumnSpec, path: str, where: str) -> None:
    """``SpecError`` unless ``value`` fits ``spec``'s dtype: an int for int64, an int or float for float64, a str
    for string (a bool for none)."""
    kinds = {"int64": (int,), "float64": (int, float), "string": (str,)}[spec.dtype]
    if isinstance(value, bool) or not isinstance(value, kinds):
        wanted = {"int64": "an integer", "float64": "a number", "string": "a string"}[spec.dtype]
        raise SpecError(path, where, f"{value!r} is not {wanted}, the type of column '{spec.name}' ({spec.dtype})")
