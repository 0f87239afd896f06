"""Dataset schemas: the columns of a raw data set, their roles, raw types and encodings.

A schema file (YAML) looks like::

    name: criteo
    text:                      # how the raw delimited text is laid out (used by `etl convert`)
      delimiter: "\\t"
      header: false
      null_value: ""
    columns:
      - {name: label, role: label, dtype: int64}
      - {name: I1, role: dense, dtype: int64}
      - {name: C1, role: categorical, dtype: string, encoding: hex, width: 8}
      - {name: genres, role: list, dtype: string, encoding: string, separator: "|"}

Roles: ``label`` (training target), ``dense`` (numeric feature), ``categorical`` (one value per row, turned into
an embedding id) and ``list`` (multi-hot: a variable-length list of categorical values per row).

Raw dtypes: ``int64``, ``float64``, ``string``. For a list column ``dtype`` is the element type.

Encodings (categorical and list columns) say how a raw value becomes a uint64 key (see ``etl.ops.categorical.Decode``):
``hex`` (hexadecimal text, ``width`` digits when given), ``int`` (an integer column, or integer text) and
``string`` (any text, hashed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from etl.errors import SpecError

ROLES = ("label", "dense", "categorical", "list")
DTYPES = ("int64", "float64", "string")
ENCODINGS = ("hex", "int", "string")


@dataclass(frozen=True)
class ColumnSpec:
    """One raw column. ``encoding``/``width`` apply to categorical and list columns, ``separator`` to lists."""

    name: str
    role: str
    dtype: str
    encoding: str | None = None
    width: int | None = None
    separator: str | None = None

    @property
    def is_list(self) -> bool:
        return self.role == "list"


@dataclass(frozen=True)
class TextLayout:
    """How raw delimited text files are laid out."""

    delimiter: str = ","
    header: bool = False
    null_value: str = ""


@dataclass(frozen=True)
class Schema:
    name: str
    columns: tuple[ColumnSpec, ...]
    text: TextLayout = field(default_factory=TextLayout)
    path: str = "<memory>"

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise SpecError(self.path, "columns", f"duplicate column names {dup}")

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

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


def _parse_column(raw: Any, path: str, i: int) -> ColumnSpec:
    where = f"columns[{i}]"
    if not isinstance(raw, dict):
        raise SpecError(path, where, f"expected a mapping, got {raw!r}")
    unknown = set(raw) - {"name", "role", "dtype", "encoding", "width", "separator"}
    if unknown:
        raise SpecError(path, f"{where}.{sorted(unknown)[0]}", "unknown field")
    name = _require(raw, "name", path, where)
    if not isinstance(name, str) or not name:
        raise SpecError(path, f"{where}.name", f"expected a non-empty string, got {name!r}")
    if any(ch in name for ch in "/\\\0") or name.startswith("."):
        raise SpecError(path, f"{where}.name", f"{name[:80]!r}: a column name names files of fitted tables: no '/', '\\', NUL or leading '.'")
    where = f"columns[{i}] ({name})"
    role = _require(raw, "role", path, where)
    if role not in ROLES:
        raise SpecError(path, f"{where}.role", f"{role!r} is not one of {list(ROLES)}")
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
    return ColumnSpec(name, role, dtype, encoding, width, separator)


def parse_schema(doc: Any, path: str = "<memory>") -> Schema:
    """Validate a parsed schema document; raises ``SpecError`` naming the bad field."""
    if not isinstance(doc, dict):
        raise SpecError(path, "<root>", "expected a mapping")
    unknown = set(doc) - {"name", "text", "columns", "description"}
    if unknown:
        raise SpecError(path, sorted(unknown)[0], "unknown field")
    name = _require(doc, "name", path, "<root>")
    cols = _require(doc, "columns", path, "<root>")
    if not isinstance(cols, list) or not cols:
        raise SpecError(path, "columns", "expected a non-empty list")
    text_doc = doc.get("text") or {}
    if not isinstance(text_doc, dict):
        raise SpecError(path, "text", "expected a mapping")
    unknown = set(text_doc) - {"delimiter", "header", "null_value"}
    if unknown:
        raise SpecError(path, f"text.{sorted(unknown)[0]}", "unknown field")
    text = TextLayout(**text_doc)
    if not isinstance(text.delimiter, str) or len(text.delimiter) != 1:
        raise SpecError(path, "text.delimiter", "expected one character")
    if not isinstance(text.header, bool):
        raise SpecError(path, "text.header", "expected true or false")
    columns = tuple(_parse_column(c, path, i) for i, c in enumerate(cols))
    return Schema(str(name), columns, text, path)


def read_yaml(path: Path) -> Any:
    """A YAML document; ``SpecError`` when the file is missing or not YAML."""
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SpecError(str(path), "<file>", "no such file") from None
    except yaml.YAMLError as e:
        raise SpecError(str(path), "<file>", f"invalid YAML: {e}") from None


def load_schema(path: str | Path) -> Schema:
    """Load and validate a schema YAML file."""
    return parse_schema(read_yaml(Path(path)), str(path))


def schema_to_dict(schema: Schema) -> dict[str, Any]:
    """The inverse of ``parse_schema`` (used to embed the schema in artifacts)."""
    cols = []
    for c in schema.columns:
        d: dict[str, Any] = {"name": c.name, "role": c.role, "dtype": c.dtype}
        for k in ("encoding", "width", "separator"):
            if getattr(c, k) is not None:
                d[k] = getattr(c, k)
        cols.append(d)
    t = schema.text
    return {"name": schema.name, "text": {"delimiter": t.delimiter, "header": t.header, "null_value": t.null_value}, "columns": cols}
