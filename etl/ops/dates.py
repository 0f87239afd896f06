"""Calendar parts of a date or time column, as new categorical columns."""

from __future__ import annotations

from typing import Any

from etl.backends import Backend
from etl.backends.dates import PARTS, compile_format
from etl.batch import Batch, Column
from etl.ops.base import InvalidRows, Op
from etl.schema import ColumnSpec


class DateParts(Op):
    """Read each column as a date in ``format`` and write one new column per part of ``parts``, named
    ``{column}_{part}``: ``{op: DateParts, columns: [hour], format: "%y%m%d%H", parts: [hour, weekday]}`` writes
    ``hour_hour`` and ``hour_weekday``.

    ``format``: ``"unix"`` (Unix seconds, UTC) or a fixed-width ``strptime`` format (``%Y %y %m %d %H %M %S %%``
    and literal text); the full rules, and what counts as a date, are in ``etl.backends.dates``. ``parts``: any of
    ``year``, ``month`` (1-12), ``day`` (1-31), ``hour`` (0-23), ``minute`` (0-59) and ``weekday`` (0 = Monday
    .. 6 = Sunday), each one the format determines (a format without ``%d`` has no ``day`` nor ``weekday``).

    The columns are read as the schema declares them (int64 or text, not lists), before any op writes them;
    they are left as they are. The new columns are categorical columns that already hold keys: the part's
    integer value as a uint64 key (2014 → key 2014), missing where the value is missing. Later ``@categorical``
    selectors include them, Hash and Categorify take them as they are, Decode leaves them alone, and a
    Categorify vocabulary records their raw value as decimal text. A present value that is not a date in the
    format (text that does not match it, month 13, February 30, Unix seconds beyond years 1-9999) is invalid
    (``InvalidRows``)."""

    name = "DateParts"
    reads, writes = "source", "keys"

    def __init__(self, columns: list[str], format: Any, parts: Any):
        super().__init__(columns)
        self.format = compile_format(format)
        if not isinstance(parts, list) or not parts or any(p not in PARTS for p in parts):
            raise ValueError(f"DateParts.parts must be a non-empty list of {list(PARTS)}, got {parts!r}")
        twice = sorted({p for p in parts if parts.count(p) > 1})
        if twice:
            raise ValueError(f"DateParts.parts: '{twice[0]}' is listed more than once")
        for p in parts:
            if not self.format.has(p):
                raise ValueError(f"DateParts: format {self.format.text!r} does not determine the {p}")
        self.parts: list[str] = list(parts)

    def bind(self, specs: dict[str, ColumnSpec]) -> None:
        """Attach the specs and check each column can be read: int64 or string, not a list; int64 needs a format of
        directives only (or ``unix``). Raises ``ValueError``."""
        super().bind(specs)
        for c, spec in self.specs.items():
            if spec.is_list:
                raise ValueError(f"DateParts: column '{c}' is a list column")
            if spec.dtype not in ("int64", "string"):
                raise ValueError(f"DateParts: column '{c}' is {spec.dtype}; dates are read from int64 or string columns")
            if spec.dtype == "int64" and not self.format.unix and not self.format.digits_only:
                raise ValueError(f"DateParts: column '{c}' is int64; format {self.format.text!r} has literal text, which integers cannot hold")

    @property
    def outputs(self) -> list[str]:
        return [f"{c}_{p}" for c in self.columns for p in self.parts]

    def new_columns(self) -> dict[str, ColumnSpec]:
        return {name: ColumnSpec(name, "categorical", "int64", "int") for name in self.outputs}

    def transform(self, batch: Batch, xp: Backend) -> dict[str, Column]:
        out = {}
        for c in self.columns:
            col = batch[c]
            parts, bad = xp.date_parts(col.values, col.valid, self.format)
            if bad is not None:
                raise InvalidRows(c, bad, f"not a date in format {self.format.text!r}")
            for p in self.parts:
                out[f"{c}_{p}"] = Column(xp.decode_int(parts[PARTS.index(p)]), col.valid)
        return out
