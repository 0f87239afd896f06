"""``Groupby``: one output row per group of events (a session's or a user's lists), a reshaping stage of key scope.

A pipeline file writes it as the **last entry of its ops**, after the ops that turn the events' values into ids
and numbers (so that its lists hold ids, from vocabularies fitted on the events)::

    ops:
      - {op: Decode, columns: [item_id]}
      - {op: Categorify, columns: [item_id]}
      - {op: Groupby, by: [session_id], sort_by: [timestamp], max_len: 20, min_len: 2,
         aggs: {item_id: [list, count, first, last], price: [sum, mean]}}

The rows the ops before it transform are the **events**; Groupby makes of them one row per **group**: the events
whose ``by`` values are equal. The fit (``etl fit``, ``etl preprocess``) sees the events, as every op before
Groupby does. The rules:

- ``by`` (required): schema columns (int64 or text, not lists; any role but drop, passthrough ones included), read
  as the schema declares them, before any op. Two events are in one group when their ``by`` values are equal as
  read: integers exactly, text by its bytes. An event with a missing ``by`` value is invalid (``--on-error``:
  stop naming its file, row and column, or quarantine it).
- Order: each group's events are ordered by ``sort_by`` (schema columns, not lists, read as the schema declares
  them; ascending, missing values first, then NaN, text by its bytes), then by input position (shards in the order
  given, rows in file order). That order decides ``first``, ``last`` and which events a list keeps; nothing
  depends on the number of workers or on how the input was cut into shards.
- An event the label check or an op before Groupby rejects (or whose aggregated value is invalid, see below) is no
  event of its group: it is quarantined or stops the run (``--on-error``), and the group is made of the others (a
  group left with no event has no row).
- ``aggs`` (required): per column, the aggregations, each an output column ``{column}_{agg}``. A column is any
  column the ops before Groupby leave (schema columns but dropped ones, passthrough ones included, and columns
  those ops create), with its values as they leave it:

  ========  =========================================  ==================================================
  agg       accepts                                    writes
  ========  =========================================  ==================================================
  list      single-valued id columns; numbers          the values of the group's last ``max_len`` events,
            (label, dense); passthrough columns (not   oldest first: list<id> (the column's cardinality),
            lists)                                     list<float32> of numbers (a missing one: null), or
                                                       a list of the passthrough column's raw type
  count     any column                                 the group's number of events (all of them, however
                                                       many a list keeps): float32, exact up to 2**24
  first,    id columns (lists too), numbers (label,    the value of the group's first (last) event, typed
  last      dense), passthrough columns                as the output types that column
  sum, mean numbers (label, dense); passthrough        over the group's values (missing ones left out;
  min, max  int64 and float64 columns                  none: missing), in float64, written as float32
  ========  =========================================  ==================================================

  Aggregates of a passthrough column that keep its raw values (list, first, last) and lists of numbers are
  passthrough columns of the output: written, not in loader batches (which carry lists of ids only). A group whose
  float32 aggregate would be NaN, infinite or beyond the float32 range is invalid: its events are quarantined (or
  the run stops, naming its first event).
- ``max_len``: the most values a list keeps (1 .. 65,536), required with ``list``. ``min_len`` (default 1):
  groups of fewer events are dropped (counted in the manifest).
- ``label`` (default ``last``): the schema's label column is in the output under its own name, aggregated so:
  ``first``, ``last``, ``sum``, ``mean``, ``min`` or ``max`` (the loader's ``batch.label``).

The output row of a group holds the ``by`` columns (their values as the ops before Groupby leave them: a
categorified key is its id, a passthrough one its raw value), the label, then the aggregates: the aggregated
columns in output order (schema order, then the columns ops create), each one's aggregations in the order listed.

Where it runs: ``etl preprocess`` (``etl.preprocess.keyed``) brings every group's events together through the
exchange by key (``etl.pipeline.exchange``: rows partitioned by a hash of the ``by`` values, each partition
sorted by (hash, ``by`` values, ``sort_by``, input position)), runs the ops over the events and aggregates
(``etl.pipeline.groups``). ``Pipeline.transform``, serving and the loader on raw shards, which see one batch at a
time, refuse it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa

from etl.errors import SpecError
from etl.schema import Schema

#: The aggregations, and those the label takes.
AGGS = ("list", "count", "first", "last", "sum", "mean", "min", "max")
NUMERIC = ("sum", "mean", "min", "max")
LABEL_AGGS = ("first", "last", *NUMERIC)
#: The most values a list keeps.
MAX_LEN = 1 << 16
PARAMS = ("by", "sort_by", "aggs", "max_len", "min_len", "label")


@dataclass(frozen=True)
class Aggregate:
    """One output column: ``agg`` of ``column``, named ``name`` (``{column}_{agg}``, or the label's name)."""

    column: str
    agg: str
    name: str


class Groupby:
    """One row per group of events (see the module docstring). Build with ``parse``; ``bind`` checks it against the
    pipeline's columns and sets ``outputs``."""

    name: ClassVar[str] = "Groupby"
    scope: ClassVar[str] = "key"

    def __init__(self, by: list[str], sort_by: list[str], aggs: dict[str, list[str]], max_len: int | None, min_len: int, label: str | None):
        self.by, self.sort_by, self.aggs = by, sort_by, aggs
        self.max_len, self.min_len = max_len, min_len
        #: the label's aggregation (None: not given, ``last``)
        self.label = label
        #: the output columns, in order (set by ``bind``): the by columns, the labels, the aggregates
        self.aggregates: list[Aggregate] = []
        self.labels: list[Aggregate] = []
        #: passthrough columns of the output: the by columns and aggregates that keep a passthrough column's values
        self.passthrough: list[str] = []

    @classmethod
    def parse(cls, params: dict[str, Any], path: str, where: str) -> Groupby:
        """A Groupby from its parameters in a pipeline file; ``SpecError`` naming ``path`` and the field."""
        unknown = sorted(set(params) - set(PARAMS))
        if unknown:
            raise SpecError(path, f"{where}.{unknown[0]}", f"unknown parameter of Groupby (it has {', '.join(PARAMS)})")
        by = _names(params.get("by"), path, f"{where}.by", required=True)
        sort_by = _names(params.get("sort_by", []), path, f"{where}.sort_by", required=False)
        twice = sorted({c for c in by + sort_by if (by + sort_by).count(c) > 1})
        if twice:
            raise SpecError(path, where, f"column '{twice[0]}' is named twice among by and sort_by")
        aggs = params.get("aggs")
        if not isinstance(aggs, dict) or not aggs:
            raise SpecError(path, f"{where}.aggs", f"expected a mapping of column → list of aggregations ({', '.join(AGGS)}), got {aggs!r}")
        for c, names in aggs.items():
            if not isinstance(names, list) or not names or any(n not in AGGS for n in names) or len(set(names)) != len(names):
                raise SpecError(path, f"{where}.aggs.{c}", f"expected a list of distinct aggregations among {', '.join(AGGS)}, got {names!r}")
        lists = any("list" in names for names in aggs.values())
        max_len = params.get("max_len")
        if lists:
            max_len = _integer(max_len, 1, MAX_LEN, path, f"{where}.max_len", "required with a list aggregation: the most values a list keeps")
        elif max_len is not None:
            raise SpecError(path, f"{where}.max_len", "max_len is the most values a list keeps: it goes with a list aggregation")
        min_len = _integer(params.get("min_len", 1), 1, None, path, f"{where}.min_len", "")
        label = params.get("label")
        if label is not None and label not in LABEL_AGGS:
            raise SpecError(path, f"{where}.label", f"expected one of {', '.join(LABEL_AGGS)}, got {label!r}")
        return cls(by, sort_by, {str(c): list(v) for c, v in aggs.items()}, max_len, min_len, label)

    def bind(self, schema: Schema, kinds: dict[str, str], is_list: Callable[[str], bool], columns: list[str]) -> None:
        """Check it against the columns the ops before it leave (``columns``, in output order; ``kinds``: each
        one's kind after them: "number", "ids", "passthrough", "raw", "keys"; ``is_list``: whether it is a list
        column) and set the outputs. ``ValueError`` saying what is wrong."""
        specs = {c.name: c for c in schema.columns}
        for field, names in (("by", self.by), ("sort_by", self.sort_by)):
            for c in names:
                if c not in specs:
                    dropped = " (the schema drops it: role drop)" if c in schema.text_names else ""
                    raise ValueError(f"Groupby.{field}: no schema column named '{c}'{dropped}")
                if specs[c].is_list or (field == "by" and specs[c].dtype == "float64"):
                    raise ValueError(f"Groupby.{field}: column '{c}' is {'a list' if specs[c].is_list else 'float64'}; "
                                     f"{'a group key is int64 or text' if field == 'by' else 'events are ordered by single values'}")  # fmt: skip
        for c in self.by:
            if kinds[c] in ("raw", "keys"):
                raise ValueError(f"Groupby.by: column '{c}' is written to the output and holds {kinds[c]} values: turn it into ids "
                                 "(Decode, then Hash or Categorify), or make it a passthrough column to keep its values")  # fmt: skip
        labels = schema.by_role("label")
        if self.label is not None and not labels:
            raise ValueError("Groupby.label aggregates the label column, and the schema has none")
        self.labels = [Aggregate(c, self.label or "last", c) for c in labels]
        unknown = [c for c in self.aggs if c not in columns]
        if unknown:
            dropped = " (the schema drops it: role drop)" if unknown[0] in schema.text_names else ""
            raise ValueError(f"Groupby.aggs: no column named '{unknown[0]}'{dropped}")
        self.aggregates = []
        for c in (c for c in columns if c in self.aggs):
            for agg in self.aggs[c]:
                _check_agg(c, agg, kinds[c], is_list(c), specs[c].dtype if c in specs else None)
                self.aggregates.append(Aggregate(c, agg, f"{c}_{agg}"))
        clash = [a.name for a in self.aggregates if a.name in columns or a.name in specs]
        if clash:
            raise ValueError(f"Groupby: output column '{clash[0]}' would take the name of a column of the events")
        names = [*self.by, *(a.name for a in self.labels), *(a.name for a in self.aggregates)]
        twice = sorted({c for c in names if names.count(c) > 1})
        if twice:
            raise ValueError(f"Groupby: two output columns are named '{twice[0]}' (the by columns, the label and the {{column}}_{{agg}} columns)")
        raw = [c for c in columns if kinds[c] == "passthrough"]
        kept = [a.name for a in self.aggregates
                if (a.column in raw and a.agg in ("list", "first", "last")) or (a.agg == "list" and kinds[a.column] == "number")]  # fmt: skip
        self.passthrough = [c for c in self.by if c in raw] + kept

    @property
    def outputs(self) -> list[str]:
        """The output columns, in order."""
        return [*self.by, *(a.name for a in self.labels), *(a.name for a in self.aggregates)]

    @property
    def value_columns(self) -> list[str]:
        """The columns whose values reach the output (count reads none), each once."""
        seen = [*self.by, *(a.column for a in self.labels), *(a.column for a in self.aggregates if a.agg != "count")]
        return list(dict.fromkeys(seen))

    def output_schema(self, field: Callable[[str], pa.Field]) -> pa.Schema:
        """The output's Arrow schema, given each event column's output field (``field``)."""
        fields = [field(c) for c in self.by]
        for a in [*self.labels, *self.aggregates]:
            f = field(a.column)
            if a.agg == "list":
                fields.append(pa.field(a.name, pa.list_(f.type), nullable=False))
            elif a.agg in ("first", "last"):
                fields.append(f.with_name(a.name))
            else:
                fields.append(pa.field(a.name, pa.float32()))
        return pa.schema(fields)

    def cardinalities(self, events: dict[str, int]) -> dict[str, int]:
        """The embedding table size of each id column of the output, from those of the events' (``events``)."""
        out = {c: events[c] for c in self.by if c in events}
        out |= {a.name: events[a.column] for a in self.aggregates if a.agg in ("list", "first", "last") and a.column in events}
        return out


def _check_agg(column: str, agg: str, kind: str, listed: bool, dtype: str | None) -> None:
    """``ValueError`` unless ``agg`` accepts ``column`` (of ``kind``; ``listed``: a list column; ``dtype``: its
    schema dtype, None for a column an op creates)."""
    where = f"Groupby.aggs.{column}"
    if agg == "count":
        return
    if kind in ("raw", "keys"):
        raise ValueError(f"{where}: column '{column}' holds {kind} values: turn it into ids first (Decode, then Hash or Categorify)")
    if agg == "list" and listed:
        raise ValueError(f"{where}: list takes single-valued ids, numbers or passthrough values, and '{column}' is a list column "
                         "(lists of lists are not made)")  # fmt: skip
    if agg in NUMERIC and not (kind == "number" or (kind == "passthrough" and dtype in ("int64", "float64") and not listed)):
        raise ValueError(f"{where}: {agg} takes numbers (label, dense, passthrough int64 or float64 columns), and '{column}' holds {kind}")


def _names(v: Any, path: str, where: str, required: bool) -> list[str]:
    if not isinstance(v, list) or (required and not v) or not all(isinstance(c, str) and c for c in v):
        need = "a non-empty list" if required else "a list"
        raise SpecError(path, where, f"expected {need} of column names, got {v!r}")
    return list(v)


def _integer(v: Any, low: int, high: int | None, path: str, where: str, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low or (high is not None and v > high):
        span = f">= {low}" if high is None else f"in [{low}, {high:,}]"
        raise SpecError(path, where, f"expected an integer {span}, got {v!r}" + (f" ({what})" if what else ""))
    return v
