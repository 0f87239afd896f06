"""Dataset schemas: the columns of a raw data set, their roles, raw types and encodings.

A schema file (YAML) looks like::

    name: criteo
    text:                      # how the raw delimited text is laid out (used by `etl convert`)
      delimiter: "\\t"
      header: false            # true, false or auto
      null_value: ""
    columns:
      - {name: label, role: label, dtype: int64}
      - {name: I1, role: dense, dtype: int64}
      - {name: C1, role: categorical, dtype: string, encoding: hex, width: 8}
      - {name: genres, role: list, dtype: string, encoding: string, separator: "|", null_values: ["(no genres listed)"]}
      - {name: id, role: passthrough, dtype: string}
      - {name: comment, role: drop}

Every field is documented, with examples, in ``schemas/README.md``.

Roles: ``label`` (training target), ``dense`` (numeric feature), ``categorical`` (one value per row, turned into
an embedding id), ``list`` (multi-hot: a variable-length list of categorical values per row), ``passthrough``
(copied from the raw data to the processed output unchanged, in its raw type; never an op input) and ``drop`` (a
field of the text that is not read at all: it is skipped by ``etl convert`` and is not a column of the raw layout).

``Schema.columns`` holds every column but the dropped ones: those of the raw layout. ``Schema.text_columns`` holds
all of them in the order of a headerless text line, dropped ones included.

Raw dtypes: ``int64``, ``float64``, ``string``. For a list column ``dtype`` is the element type. An int64 column
may declare a ``unit`` (``s``, ``ms``, ``us``, ``ns``): it counts time, and its Parquet shards may hold it as a
timestamp type, read as the count of that unit, exactly.

Encodings (categorical and list columns) say how a raw value becomes a uint64 key (see ``etl.ops.categorical.Decode``):
``hex`` (hexadecimal text, ``width`` digits when given), ``int`` (an integer column, or integer text; values in
[-2**63, 2**64 - 1]) and ``string`` (any text, hashed).

``null_values`` (per column) lists the texts that mean "missing" in that column; it replaces ``text.null_value``
for the column (the empty field is always missing). For a list column they are matched against each element.

An optional top-level ``generate`` section says how ``etl generate`` shapes synthetic rows; today one kind,
``generate: {events: {...}}`` (``EventsSpec``): the rows are one stream of behaviour events (users, items, time), see
``etl.tools.events``. Without it every row is generated independently (``etl.tools.synth``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from etl.errors import SpecError
from etl.io.documents import parse_yaml

ROLES = ("label", "dense", "categorical", "list", "passthrough", "drop")
DTYPES = ("int64", "float64", "string")
ENCODINGS = ("hex", "int", "string")
#: What an int64 column's ``unit`` may be, and each unit in nanoseconds.
UNIT_NANOS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}

#: Where every schema field is documented (named in errors about unknown fields).
SCHEMA_DOCS = "schemas/README.md"

_COLUMN_FIELDS = ("name", "role", "dtype", "encoding", "width", "separator", "null_values", "unit")


@dataclass(frozen=True)
class ColumnSpec:
    """One raw column. ``encoding``/``width`` apply to categorical and list columns, ``separator`` to lists;
    ``null_values`` (None: the schema's ``text.null_value``) to every column read from text; ``unit`` (``s``,
    ``ms``, ``us`` or ``ns``) to single-valued int64 columns: the column counts time in that unit, and a Parquet
    timestamp column is read as its count of them (``etl.io.parquet``)."""

    name: str
    role: str
    dtype: str
    encoding: str | None = None
    width: int | None = None
    separator: str | None = None
    null_values: tuple[str, ...] | None = None
    unit: str | None = None

    @property
    def is_list(self) -> bool:
        return self.role == "list"


@dataclass(frozen=True)
class TextLayout:
    """How raw delimited text files are laid out. ``header``: True (the first line names the columns), False (it
    is data) or ``"auto"`` (decided per file: a header when it equals the schema's column names, all in order)."""

    delimiter: str = ","
    header: bool | Literal["auto"] = False
    null_value: str = ""


@dataclass(frozen=True)
class LogNormal:
    """A log-normal distribution by its median and the standard deviation of its logarithm."""

    median: float
    sigma: float


@dataclass(frozen=True)
class EventsSpec:
    """The schema's ``generate.events`` section: ``etl generate`` writes its rows as one stream of behaviour events
    (``etl.tools.events``). ``user``, ``item``, ``time`` and the optional ``session`` and ``category`` name the
    columns it fills; the other fields shape the stream (``users``/``items`` None: a default from the row count).
    Times are integers in the time column's unit (seconds for the defaults). Documented in schemas/README.md."""

    user: str
    item: str
    time: str
    session: str | None = None
    category: str | None = None
    users: int | None = None
    items: int | None = None
    categories: int = 50
    item_skew: float = 1.1
    follow: float = 0.3
    session_events: float = 6.0
    event_gap: LogNormal = LogNormal(60.0, 1.0)
    session_gap: LogNormal = LogNormal(86_400.0, 1.5)
    ties: float = 0.05
    late: float = 0.01
    lateness: int = 3_600
    start: int = 1_600_000_000

    @property
    def filled(self) -> dict[str, str]:
        """The columns the stream fills, by what they hold (``user``, ``item``, ``time``, ``session``, ``category``)."""
        roles = {"user": self.user, "item": self.item, "time": self.time, "session": self.session, "category": self.category}
        return {k: v for k, v in roles.items() if v is not None}


@dataclass(frozen=True)
class Schema:
    """A data set's columns. ``columns``: the columns of the raw layout (every role but ``drop``), in schema order;
    ``text_columns``: every field of a headerless text line, in order, dropped ones included (default:
    ``columns``)."""

    name: str
    columns: tuple[ColumnSpec, ...]
    text: TextLayout = field(default_factory=TextLayout)
    path: str = "<memory>"
    text_columns: tuple[ColumnSpec, ...] = ()
    events: EventsSpec | None = None

    def __post_init__(self) -> None:
        if not self.text_columns:
            object.__setattr__(self, "text_columns", self.columns)
        if tuple(c for c in self.text_columns if c.role != "drop") != self.columns or any(c.role == "drop" for c in self.columns):
            raise ValueError("columns must be the text columns whose role is not drop, in order")
        names = [c.name for c in self.text_columns]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise SpecError(self.path, "columns", f"duplicate column names {dup}")

    @property
    def names(self) -> list[str]:
        """Names of ``columns`` (the raw layout's)."""
        return [c.name for c in self.columns]

    @property
    def text_names(self) -> list[str]:
        """Names of ``text_columns``: the fields of a headerless line, and a header line that ``header: auto``
        recognises."""
        return [c.name for c in self.text_columns]

    def column(self, name: str) -> ColumnSpec:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)

    def by_role(self, role: str) -> list[str]:
        return [c.name for c in self.columns if c.role == role]


def _require(d: dict[str, Any], key: str, path: str, where: str) -> Any:
    if key not in d:
        raise SpecError(path, f"{where}.{key}", "missing")
    return d[key]


def _unknown(path: str, field: str) -> SpecError:
    return SpecError(path, field, f"unknown field (every schema field is documented in {SCHEMA_DOCS})")


def _parse_null_values(raw: Any, path: str, where: str) -> tuple[str, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
        raise SpecError(path, f"{where}.null_values", f"expected a list of strings, got {raw!r}")
    return tuple(raw)


def _parse_column(raw: Any, path: str, i: int) -> ColumnSpec:
    where = f"columns[{i}]"
    if not isinstance(raw, dict):
        raise SpecError(path, where, f"expected a mapping, got {raw!r}")
    unknown = set(raw) - set(_COLUMN_FIELDS)
    if unknown:
        raise _unknown(path, f"{where}.{sorted(unknown)[0]}")
    name = _require(raw, "name", path, where)
    if not isinstance(name, str) or not name:
        raise SpecError(path, f"{where}.name", f"expected a non-empty string, got {name!r}")
    if any(ch in name for ch in "/\\\0") or name.startswith("."):
        raise SpecError(path, f"{where}.name", f"{name[:80]!r}: a column name names files of fitted tables: no '/', '\\', NUL or leading '.'")
    where = f"columns[{i}] ({name})"
    role = _require(raw, "role", path, where)
    if role not in ROLES:
        raise SpecError(path, f"{where}.role", f"{role!r} is not one of {list(ROLES)}")
    if role == "drop":
        extra = sorted(set(raw) - {"name", "role", "dtype"})
        if extra:
            raise SpecError(path, f"{where}.{extra[0]}", "a dropped column is not read: it has only a name (and optionally a dtype)")
        if raw.get("dtype", "string") not in DTYPES:
            raise SpecError(path, f"{where}.dtype", f"{raw['dtype']!r} is not one of {list(DTYPES)}")
        return ColumnSpec(name, role, "string")
    dtype = _require(raw, "dtype", path, where)
    if dtype not in DTYPES:
        raise SpecError(path, f"{where}.dtype", f"{dtype!r} is not one of {list(DTYPES)}")
    encoding = raw.get("encoding")
    width = raw.get("width")
    separator = raw.get("separator")
    if role in ("categorical", "list"):
        if encoding is None:
            encoding = "int" if dtype == "int64" else "string"
        if encoding not in ENCODINGS:
            raise SpecError(path, f"{where}.encoding", f"{encoding!r} is not one of {list(ENCODINGS)}")
        if dtype == "float64":
            raise SpecError(path, f"{where}.dtype", "categorical values cannot be float64")
        if encoding in ("hex", "string") and dtype != "string":
            raise SpecError(path, f"{where}.encoding", f"{encoding} encoding needs dtype string")
        if width is not None and (encoding != "hex" or not isinstance(width, int) or isinstance(width, bool) or not 1 <= width <= 16):
            raise SpecError(path, f"{where}.width", "width is an integer 1..16 and only applies to hex")
    elif encoding is not None or width is not None:
        raise SpecError(path, f"{where}.encoding", "only categorical and list columns have an encoding")
    if role == "list":
        if not isinstance(separator, str) or not separator:
            raise SpecError(path, f"{where}.separator", "a list column needs a non-empty separator")
    elif separator is not None:
        raise SpecError(path, f"{where}.separator", "only list columns have a separator")
    if role in ("label", "dense") and dtype == "string":
        raise SpecError(path, f"{where}.dtype", f"a {role} column must be int64 or float64")
    null_values = _parse_null_values(raw.get("null_values"), path, where)
    unit = raw.get("unit")
    if unit is not None and (unit not in UNIT_NANOS or dtype != "int64" or role == "list"):
        raise SpecError(path, f"{where}.unit", f"a unit ({', '.join(UNIT_NANOS)}) is what a single-valued int64 column counts, got {unit!r}"
                        f"{'' if dtype == 'int64' and role != 'list' else f' for a {dtype} {role} column'}")  # fmt: skip
    return ColumnSpec(name, role, dtype, encoding, width, separator, null_values, unit)


#: ``generate.events`` fields holding column names, and the roles each may name
_EVENT_COLUMNS = {"user": ("categorical",), "item": ("categorical",), "category": ("categorical",),
                  "time": ("dense", "passthrough"), "session": ("categorical", "passthrough")}


def _number(raw: Any, path: str, where: str, kind: type, low: float, high: float | None = None, low_open: bool = False) -> Any:
    """``raw`` as an int (``kind`` int) or a float within [low, high] ((low, high] when ``low_open``), else SpecError."""
    ok_type = isinstance(raw, int) if kind is int else isinstance(raw, (int, float))
    value = kind(raw) if ok_type and not isinstance(raw, bool) else None
    if value is None or not math.isfinite(value) or value < low or (low_open and value == low) or (high is not None and value > high):
        bounds = f"{'(' if low_open else '['}{low}, {'∞)' if high is None else f'{high}]'}"
        raise SpecError(path, where, f"expected {'an integer' if kind is int else 'a number'} in {bounds}, got {raw!r}")
    return value


def _parse_events(raw: Any, columns: tuple[ColumnSpec, ...], path: str) -> EventsSpec:
    where = "generate.events"
    if not isinstance(raw, dict):
        raise SpecError(path, where, f"expected a mapping, got {raw!r}")
    names = {f.name for f in fields(EventsSpec)}
    unknown = set(raw) - names
    if unknown:
        raise _unknown(path, f"{where}.{sorted(unknown)[0]}")
    by_name = {c.name: c for c in columns}
    kw: dict[str, Any] = {}
    for key, roles in _EVENT_COLUMNS.items():
        name = raw.get(key)
        if name is None and key in ("user", "item", "time"):
            raise SpecError(path, f"{where}.{key}", "missing: the name of a column")
        if name is None:
            continue
        c = by_name.get(name) if isinstance(name, str) else None
        if c is None:
            raise SpecError(path, f"{where}.{key}", f"{name!r} is not a column of the schema")
        if c.role not in roles or (key in ("time", "session") and c.dtype != "int64"):
            need = " int64" if key in ("time", "session") else ""
            raise SpecError(path, f"{where}.{key}", f"column {name!r} ({c.role}, {c.dtype}) must be a{need} column of role {' or '.join(roles)}")
        kw[key] = name
    used = list(kw.values())
    if len(set(used)) != len(used):
        raise SpecError(path, where, f"each filled column must be a different one, got {kw}")
    for key in ("users", "items", "categories", "lateness"):
        if raw.get(key) is not None:
            kw[key] = _number(raw[key], path, f"{where}.{key}", int, 1)
    for key, high in (("follow", 1.0), ("ties", 1.0), ("late", 1.0)):
        if key in raw:
            kw[key] = _number(raw[key], path, f"{where}.{key}", float, 0.0, high)
    if "item_skew" in raw:
        kw["item_skew"] = _number(raw["item_skew"], path, f"{where}.item_skew", float, 0.0, 4.0, low_open=True)
        if kw["item_skew"] == 1.0:
            raise SpecError(path, f"{where}.item_skew", "1.0 is not supported: use 0.99 or 1.01 (the same law, within 1 %)")
    if "session_events" in raw:
        kw["session_events"] = _number(raw["session_events"], path, f"{where}.session_events", float, 1.0, 1e6)
    if "start" in raw:
        kw["start"] = _number(raw["start"], path, f"{where}.start", int, 0, 2**53)
    for key in ("event_gap", "session_gap"):
        if key in raw:
            gap = raw[key]
            if not isinstance(gap, dict) or set(gap) != {"median", "sigma"}:
                raise SpecError(path, f"{where}.{key}", f"expected {{median: NUMBER, sigma: NUMBER}}, got {gap!r}")
            kw[key] = LogNormal(_number(gap["median"], path, f"{where}.{key}.median", float, 0.0, 1e15, low_open=True),
                                _number(gap["sigma"], path, f"{where}.{key}.sigma", float, 0.0, 5.0))
    return EventsSpec(**kw)


def _parse_generate(raw: Any, columns: tuple[ColumnSpec, ...], path: str) -> EventsSpec | None:
    """The ``generate`` section: absent or ``{events: {...}}``."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"events"}:
        raise SpecError(path, "generate", f"expected {{events: {{...}}}} (the one kind of generation a schema sets), got {raw!r}")
    return _parse_events(raw["events"], columns, path)


def parse_schema(doc: Any, path: str = "<memory>") -> Schema:
    """Validate a parsed schema document; raises ``SpecError`` naming the bad field."""
    if not isinstance(doc, dict):
        raise SpecError(path, "<root>", "expected a mapping")
    unknown = set(doc) - {"name", "text", "columns", "description", "generate"}
    if unknown:
        raise _unknown(path, sorted(unknown)[0])
    name = _require(doc, "name", path, "<root>")
    cols = _require(doc, "columns", path, "<root>")
    if not isinstance(cols, list) or not cols:
        raise SpecError(path, "columns", "expected a non-empty list")
    text_doc = doc.get("text") or {}
    if not isinstance(text_doc, dict):
        raise SpecError(path, "text", "expected a mapping")
    unknown = set(text_doc) - {"delimiter", "header", "null_value"}
    if unknown:
        raise _unknown(path, f"text.{sorted(unknown)[0]}")
    text = TextLayout(**text_doc)
    if not isinstance(text.delimiter, str) or len(text.delimiter) != 1:
        raise SpecError(path, "text.delimiter", "expected one character")
    if not (isinstance(text.header, bool) or text.header == "auto"):
        raise SpecError(path, "text.header", f"expected true, false or auto, got {text.header!r}")
    if not isinstance(text.null_value, str):
        raise SpecError(path, "text.null_value", f"expected a string, got {text.null_value!r}")
    text_columns = tuple(_parse_column(c, path, i) for i, c in enumerate(cols))
    columns = tuple(c for c in text_columns if c.role != "drop")
    if not columns:
        raise SpecError(path, "columns", "every column is dropped")
    return Schema(str(name), columns, text, path, text_columns, _parse_generate(doc.get("generate"), columns, path))


def read_yaml(path: Path) -> Any:
    """A YAML document; ``SpecError`` when the file is missing or unreadable, ``YamlError`` (one line naming the file,
    line and column) when it is not YAML (``etl.io.documents.parse_yaml``)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SpecError(str(path), "<file>", "no such file") from None
    except OSError as e:
        raise SpecError(str(path), "<file>", f"cannot read: {e.strerror}") from None
    return parse_yaml(data, str(path))


def load_schema(path: str | Path) -> Schema:
    """Load and validate a schema YAML file: ``path``, or the name of a schema that ships with etl (``"criteo"``,
    see ``etl.resources.resolve``)."""
    from etl.resources import resolve

    where = resolve("schemas", path)
    return parse_schema(read_yaml(where), str(where))


def schema_to_dict(schema: Schema) -> dict[str, Any]:
    """The inverse of ``parse_schema`` (used to embed the schema in artifacts)."""
    cols = []
    for c in schema.text_columns:
        if c.role == "drop":
            cols.append({"name": c.name, "role": c.role})
            continue
        d: dict[str, Any] = {"name": c.name, "role": c.role, "dtype": c.dtype}
        for k in ("encoding", "width", "separator", "unit"):
            if getattr(c, k) is not None:
                d[k] = getattr(c, k)
        if c.null_values is not None:
            d["null_values"] = list(c.null_values)
        cols.append(d)
    t = schema.text
    doc = {"name": schema.name, "text": {"delimiter": t.delimiter, "header": t.header, "null_value": t.null_value}, "columns": cols}
    if schema.events is not None:
        doc["generate"] = {"events": {k: v for k, v in asdict(schema.events).items() if v is not None}}
    return doc
