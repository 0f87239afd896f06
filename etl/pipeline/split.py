"""The ``split:`` section of a pipeline file: which rows are train, valid and test rows.

``etl preprocess`` of a pipeline with a split (or given ``--split``, ``preprocess(..., split=...)``) writes
``OUT/train``, ``OUT/valid`` and ``OUT/test``, every statistic fitted on the train rows only
(``etl.preprocess.split``). Two kinds::

    split: {by: time, column: timestamp, train_until: 889000000, valid_until: 891000000}
    split: {by: time, column: timestamp, train_until: {quantile: 0.8}, valid_until: {quantile: 0.9}}
    split: {by: last, key: userId, time: timestamp, valid: 1, test: 1}

``by: time``: a row is a train row when ``column < train_until``, a valid row when ``train_until <= column <
valid_until``, a test row when ``column >= valid_until``. Without ``valid_until`` there is no valid split: every
row at or after ``train_until`` is a test row (and ``OUT/valid`` is not written).

- ``column``: a schema column of dtype int64 or float64 (any role but drop, a passthrough one included), compared
  as stored: no op's transform is applied to it.
- A bound is a number of the column's dtype (an integer for an int64 column), or, for an int64 column with a
  schema ``unit`` (a time: ``s``, ``ms``, ``us``, ``ns``), an ISO 8601 date or time (``"2018-01-01"``,
  ``"2018-01-01T12:00:00Z"``; without a time zone, UTC), which counts as the first value of the column's unit at
  or after that instant; or ``{quantile: q}`` (0 < q < 1): the value ``v[floor(q * N)]`` of the column's N values
  sorted ascending (q taken as written in decimal), computed exactly over every row that reaches the split in a
  first pass (it holds the column's values in memory: 8 bytes per row). Ties at a bound all go to the later split,
  so a quantile split puts at most ``floor(q * N)`` rows before it. ``train_until`` must not exceed
  ``valid_until``.

``by: last``: each key's latest ``test`` events are test rows, the ``valid`` events before them valid rows, the
rest train rows. Events are ordered as History orders them (``etl.ops.history``): by ``time``, then by the
``tiebreak`` columns (missing values first, text by its bytes), then by input position (shards in the run's order,
rows in file order); two rows have the same key when History would say so (their keys equal as Decode reads them).
A key with at most ``valid + test`` events has no train row (its latest events fill test, then valid).

- ``key``: a single-valued schema column (int64 or text); ``time``: an int64 column; ``tiebreak`` (optional): a
  list of single-valued schema columns; any role but drop for all of them, passthrough ones included.
- ``valid`` (default 1, may be 0: no valid split) and ``test`` (default 1, at least 1): events per key.

Which rows reach the split: those the row-scope stages (``stages:``, e.g. ``Filter``) pass on. Every such row must
have a value in the split's columns (the time column; for ``by: last`` the key and time): a row without one cannot
be placed and stops the run with a ``RowError`` naming its file, row and column, whatever ``--on-error`` (put a
``Filter`` with ``not_null`` before it to leave such rows out). A pipeline that ends with Groupby takes no split.

The text of ``--split`` (``split_option``) is this mapping in YAML (or JSON) flow style, or the path of a YAML file
holding it. The pipeline document keeps the split as given (dates as ISO text), so the artifacts record it.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

from etl.errors import SpecError
from etl.io.documents import parse_document
from etl.io.processed import SPLITS
from etl.schema import UNIT_NANOS, ColumnSpec, Schema, read_yaml

#: The splits, in the order they are written and reported (each to the subdirectory of its name).
ROLES = SPLITS
#: Where the split section is documented.
SPLIT_DOCS = "pipelines/README.md#split"


@dataclass(frozen=True)
class Quantile:
    """A bound given as a quantile of the column's values: ``fraction`` = q as written (an exact fraction)."""

    fraction: Fraction

    def __str__(self) -> str:
        return f"{{quantile: {float(self.fraction)}}}"

    def index(self, n: int) -> int:
        """The position of the bound among ``n`` values sorted ascending: ``floor(q * n)``, at most ``n - 1``."""
        return min(math.floor(self.fraction * n), max(n - 1, 0))


Bound = int | float | Quantile


@dataclass(frozen=True)
class TimeSplit:
    """``by: time``: train rows before ``train_until``, valid rows before ``valid_until`` (None: no valid split),
    test rows from then on, comparing ``column`` as stored (bounds in its values: ISO dates converted)."""

    column: str
    train_until: Bound
    valid_until: Bound | None

    @property
    def roles(self) -> tuple[str, ...]:
        return ROLES if self.valid_until is not None else ("train", "test")

    @property
    def columns(self) -> list[str]:
        return [self.column]


@dataclass(frozen=True)
class LastSplit:
    """``by: last``: each ``key``'s latest ``test`` events (by ``time``, ``tiebreak``, input position) are test
    rows, the ``valid`` before them valid rows, the others train rows."""

    key: str
    time: str
    tiebreak: tuple[str, ...]
    valid: int
    test: int

    @property
    def roles(self) -> tuple[str, ...]:
        return ROLES if self.valid else ("train", "test")

    @property
    def columns(self) -> list[str]:
        return [self.key, self.time, *(c for c in self.tiebreak if c not in (self.key, self.time))]


Split = TimeSplit | LastSplit


def parse_split(doc: Any, schema: Schema, path: str, where: str = "split") -> Split | None:
    """The split of a pipeline document's ``split`` field (``doc``; None when absent: no split), checked against
    ``schema``; ``SpecError`` naming ``path`` and the field otherwise."""
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise SpecError(path, where, f"expected a mapping such as {{by: time, column: ..., train_until: ...}} (see {SPLIT_DOCS}), got {doc!r}")
    by = doc.get("by")
    if by == "time":
        return _time_split(doc, schema, path, where)
    if by == "last":
        return _last_split(doc, schema, path, where)
    raise SpecError(path, f"{where}.by", f"expected time or last, got {by!r} (see {SPLIT_DOCS})")


def canonical(doc: Any) -> Any:
    """``doc`` (a split section) with the dates and times YAML read from unquoted text (``2018-01-01``) as ISO
    text, as a JSON document holds them."""
    if isinstance(doc, dict):
        return {k: canonical(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [canonical(v) for v in doc]
    if isinstance(doc, datetime.date):
        return doc.isoformat()
    return doc


def split_option(text: str) -> dict[str, Any]:
    """The split section given as ``--split``'s ``text``: the path of a YAML file holding the mapping, or the
    mapping in YAML/JSON flow style (``{by: time, column: timestamp, train_until: 889000000}``). ``SpecError``
    naming the file (or ``--split``) when it is not a mapping; its fields are checked by ``parse_split``."""
    path = Path(text)
    if text.strip() and not text.lstrip().startswith("{") and path.is_file():
        doc, name = read_yaml(path), str(path)
    else:
        name = "--split"
        try:
            doc = parse_document(text, yaml.safe_load)
        except (yaml.YAMLError, ValueError) as e:
            raise SpecError(name, "<text>", f"invalid YAML: {e}") from None
    if not isinstance(doc, dict):
        raise SpecError(name, "<text>", f"expected a mapping such as '{{by: time, column: timestamp, train_until: 889000000}}' or the path of a "
                        f"YAML file holding one, got {text!r}")  # fmt: skip
    return canonical(doc)


def _known(doc: dict[str, Any], fields: tuple[str, ...], path: str, where: str) -> None:
    unknown = sorted(set(doc) - set(fields))
    if unknown:
        raise SpecError(path, f"{where}.{unknown[0]}", f"unknown field of a split by {doc['by']} (it has {', '.join(fields)})")


def _column(c: Any, schema: Schema, path: str, field: str, dtypes: tuple[str, ...]) -> ColumnSpec:
    """The single-valued schema column named ``c`` (field ``field``), of one of ``dtypes``."""
    if not isinstance(c, str):
        raise SpecError(path, field, f"expected a column name, got {c!r}")
    if c not in schema.names:
        dropped = " (the schema drops it: role drop)" if c in schema.text_names else ""
        raise SpecError(path, field, f"no schema column named '{c}'{dropped}")
    spec = schema.column(c)
    if spec.is_list:
        raise SpecError(path, field, f"column '{c}' is a list column: a split reads one value per row")
    if spec.dtype not in dtypes:
        raise SpecError(path, field, f"column '{c}' is of dtype {spec.dtype}; expected {' or '.join(dtypes)}")
    return spec


def _time_split(doc: dict[str, Any], schema: Schema, path: str, where: str) -> TimeSplit:
    _known(doc, ("by", "column", "train_until", "valid_until"), path, where)
    spec = _column(doc.get("column"), schema, path, f"{where}.column", ("int64", "float64"))
    if "train_until" not in doc:
        raise SpecError(path, f"{where}.train_until", "missing: the first time of the rows after the train rows")
    train = _bound(doc["train_until"], spec, path, f"{where}.train_until")
    valid = _bound(doc["valid_until"], spec, path, f"{where}.valid_until") if doc.get("valid_until") is not None else None
    if valid is not None and isinstance(train, Quantile) == isinstance(valid, Quantile):
        low, high = (train.fraction, valid.fraction) if isinstance(train, Quantile) and isinstance(valid, Quantile) else (train, valid)
        if low > high:  # type: ignore[operator]
            raise SpecError(path, f"{where}.valid_until", f"{doc['valid_until']!r} is before train_until {doc['train_until']!r}")
    return TimeSplit(spec.name, train, valid)


def _bound(v: Any, spec: ColumnSpec, path: str, where: str) -> Bound:
    """A bound of column ``spec``: a number of its dtype, an ISO date or time (an int64 column with a unit), or
    ``{quantile: q}``."""
    if isinstance(v, dict):
        if set(v) != {"quantile"}:
            raise SpecError(path, where, f"expected {{quantile: q}}, got {v!r}")
        q = v["quantile"]
        if isinstance(q, bool) or not isinstance(q, int | float) or not 0 < q < 1:
            raise SpecError(path, f"{where}.quantile", f"expected a number strictly between 0 and 1, got {q!r}")
        return Quantile(Fraction(repr(float(q))))
    if isinstance(v, str | datetime.date):
        return _instant(v, spec, path, where)
    if spec.dtype == "int64" and (isinstance(v, bool) or not isinstance(v, int)):
        raise SpecError(path, where, f"{v!r} is not an integer, the type of column '{spec.name}' (int64)")
    if isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, float) and not math.isfinite(v)):
        raise SpecError(path, where, f"{v!r} is not a finite number, the type of column '{spec.name}' ({spec.dtype})")
    return v


def _instant(v: str | datetime.date, spec: ColumnSpec, path: str, where: str) -> int:
    """An ISO date or time as a bound of the int64 column ``spec`` that counts its ``unit``: the first count at or
    after that instant (UTC when the text has no time zone)."""
    if spec.unit is None:
        raise SpecError(path, where, f"{str(v)!r}: an ISO date bounds a column with a schema unit (s, ms, us, ns); column '{spec.name}' has none, "
                        "give the bound as a number of the column")  # fmt: skip
    try:
        t = v if isinstance(v, datetime.date) else datetime.datetime.fromisoformat(v.strip())
    except ValueError:
        raise SpecError(path, where, f"{v!r} is not an ISO 8601 date or time (such as '2018-01-01' or '2018-01-01T12:00:00Z')") from None
    if not isinstance(t, datetime.datetime):
        t = datetime.datetime(t.year, t.month, t.day)
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.UTC)
    delta = t - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    nanos = ((delta.days * 86400 + delta.seconds) * 10**6 + delta.microseconds) * 1000
    unit = UNIT_NANOS[spec.unit]
    return -(-nanos // unit)  # the first count whose instant is at or after it


def _last_split(doc: dict[str, Any], schema: Schema, path: str, where: str) -> LastSplit:
    _known(doc, ("by", "key", "time", "tiebreak", "valid", "test"), path, where)
    key = _column(doc.get("key"), schema, path, f"{where}.key", ("int64", "string")).name
    time = _column(doc.get("time"), schema, path, f"{where}.time", ("int64",)).name
    tiebreak = doc.get("tiebreak", [])
    if not isinstance(tiebreak, list):
        raise SpecError(path, f"{where}.tiebreak", f"expected a list of column names, got {tiebreak!r}")
    names = tuple(_column(c, schema, path, f"{where}.tiebreak[{i}]", ("int64", "float64", "string")).name for i, c in enumerate(tiebreak))
    counts = {}
    for name, low in (("valid", 0), ("test", 1)):
        n = doc.get(name, 1)
        if isinstance(n, bool) or not isinstance(n, int) or n < low:
            raise SpecError(path, f"{where}.{name}", f"expected an integer >= {low} (events per key), got {n!r}")
        counts[name] = n
    return LastSplit(key, time, names, counts["valid"], counts["test"])
