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

Raw dtypes: ``int64``, ``float64``, ``string``. For a list column ``dtype`` is the element type.

Encodings (categorical and list columns) say how a raw value becomes a uint64 key (see ``etl.ops.categorical.Decode``):
``hex`` (hexadecimal text, ``width`` digits when given), ``int`` (an integer column, or integer text; values in
[-2**63, 2**64 - 1]) and ``string`` (any text, hashed).

``null_values`` (per column) lists the texts that mean "missing" in that column; it replaces ``text.null_value``
for the column (the empty field is always missing). For a list column they are matched against each element.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from etl.errors import SpecError
from etl.io.documents import parse_document

ROLES = ("label", "dense", "categorical", "list", "passthrough", "drop")
DTYPES = ("int64", "float64", "string")
ENCODINGS = ("hex", "int", "string")

#: Where every schema field is documented (named in errors about unknown fields).
SCHEMA_DOCS = "schemas/README.md"

_COLUMN_FIELDS = ("name", "role", "dtype", "encoding", "width", "separator", "null_values")


@dataclass(frozen=True)
class ColumnSpec:
    """One raw column. ``encoding``/``width`` apply to categorical and list columns, ``separator`` to lists;
    ``null_values`` (None: the schema's ``text.null_value``) to every column read from text."""

    name: str
    role: str
    dtype: str
    encoding: str | None = None
    width: int | None = None
    separator: str | None = None
    null_values: tuple[str, ...] | None = None

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
class Schema:
    """A data set's columns. ``columns``: the columns of the raw layout (every role but ``drop``), in schema order;
    ``text_columns``: every field of a headerless text line, in order, dropped ones included (default:
    ``columns``)."""

    name: str
    columns: tuple[ColumnSpec, ...]
    text: TextLayout = field(default_factory=TextLayout)
    path: str = "<memory>"
    text_columns: tuple[ColumnSpec, ...] = ()

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
    return ColumnSpec(name, role, dtype, encoding, width, separator, null_values)


def parse_schema(doc: Any, path: str = "<memory>") -> Schema:
    """Validate a parsed schema document; raises ``SpecError`` naming the bad field."""
    if not isinstance(doc, dict):
        raise SpecError(path, "<root>", "expected a mapping")
    unknown = set(doc) - {"name", "text", "columns", "description"}
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
    return Schema(str(name), columns, text, path, text_columns)


#: ``yaml.safe_load``'s loader, in its C implementation (libyaml) when PyYAML has it: same documents, parsed faster
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(path: Path) -> Any:
    """A YAML document; ``SpecError`` when the file is missing or not YAML (not UTF-8, nested too deeply)."""
    try:
        return parse_document(path.read_text(), lambda text: yaml.load(text, Loader=_SAFE_LOADER))
    except FileNotFoundError:
        raise SpecError(str(path), "<file>", "no such file") from None
    except (yaml.YAMLError, ValueError) as e:  # ValueError: UnicodeDecodeError, nested too deeply
        raise SpecError(str(path), "<file>", f"invalid YAML: {e}") from None


def load_schema(path: str | Path) -> Schema:
    """Load and validate a schema YAML file."""
    return parse_schema(read_yaml(Path(path)), str(path))


def schema_to_dict(schema: Schema) -> dict[str, Any]:
    """The inverse of ``parse_schema`` (used to embed the schema in artifacts)."""
    cols = []
    for c in schema.text_columns:
        if c.role == "drop":
            cols.append({"name": c.name, "role": c.role})
            continue
        d: dict[str, Any] = {"name": c.name, "role": c.role, "dtype": c.dtype}
        for k in ("encoding", "width", "separator"):
            if getattr(c, k) is not None:
                d[k] = getattr(c, k)
        if c.null_values is not None:
            d["null_values"] = list(c.null_values)
        cols.append(d)
    t = schema.text
    return {"name": schema.name, "text": {"delimiter": t.delimiter, "header": t.header, "null_value": t.null_value}, "columns": cols}
