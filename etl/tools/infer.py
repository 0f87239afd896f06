"""Guess a schema and a starter pipeline from a sample of a data set (``etl schema infer``).

The first ``rows`` rows of each input are read: delimited text (CSV/TSV, optionally compressed, with or without a
header line) or Parquet. Every guess is written into the YAML as a comment saying what was seen, so a person can
check it; the YAML parses with ``etl.schema.load_schema`` and ``etl.pipeline.Pipeline.from_file`` as it is.

Text layout:

- delimiter: the one of tab, ``,``, ``;``, ``|`` that splits every line of the first 64 KiB into the same number
  (> 1) of fields; the most fields wins, then that order.
- header: the first line is a header when its fields are distinct, non-empty and not numbers, and at least one
  column's other values are typed (numbers or fixed-width hex) while its first value is not (with no typed column:
  when the first line's values are identifier-like and none of them recurs below it).
- null value: the most frequent of ``NULL_TOKENS`` in the sample, else the empty field only.

Columns (by the present values of the sample):

- label: the first column named like a label (a word ``label``, ``click``, ``clicked``, ``target``, or the name
  ``y``) whose values are all 0 or 1, or a numeric column with the word ``rating`` (a rating is a label whatever
  its values). Without a header: the first 0/1 column.
- Criteo layout (no header, 40 fields: a 0/1 column, 13 integer columns, 26 columns of 8 hex digits): names
  ``label``, ``I1``..``I13``, ``C1``..``C26``; otherwise ``col0``, ``col1``, ...
- numbers: integers (``-?\\d+`` within int64) → ``int64``, other numbers → ``float64``; role ``dense``, except an
  integer column with the word ``id`` in its name (``userId``, ``movie_id``): ``categorical``, encoding ``int``.
  Integer text beyond int64 and within uint64 (64-bit unsigned ids) is kept as text and decoded exactly: ``dtype:
  string``, encoding ``int``; integer text beyond that is a ``string``.
- a column named ``id`` whose sampled values are all distinct is a row id: role ``passthrough`` (copied to the output
  for joining back, never a feature: a vocabulary of it would hold every row).
- hexadecimal text, every value of one width 1..16 → ``categorical``, encoding ``hex`` with that ``width``.
- other text: a ``list`` when at least ``LIST_SHARE`` of the values hold ``|`` (or ``;``), elements encoded as
  above; else ``categorical``, encoding ``string``.

Starter pipeline: dense columns ``FillMissing`` 0, then ``Clamp`` min 0 and ``Log1p`` when the sample has no
negative value (``Log1p`` is NaN below -1), else ``Normalize`` (also for time-like names: ``time``, ``timestamp``,
``date``); categorical and list columns ``Decode``, lists ``FirstX`` (the longest sampled list), then ``Categorify``
(``freq_threshold`` 1) or, for a column whose sampled values are nearly all distinct (at least ``HASH_MIN_VALUES`` of
them, ``HASH_DISTINCT_SHARE`` distinct), ``Hash`` into ``HASH_BUCKETS`` buckets.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import yaml

from etl.errors import InputError
from etl.io.text import check_one_line
from etl.schema import ColumnSpec, Schema, TextLayout, parse_schema

__all__ = ["Inference", "InferredColumn", "infer", "NULL_TOKENS"]

DELIMITERS = ("\t", ",", ";", "|")
LIST_SEPARATORS = ("|", ";")
#: Text that means "missing" in common exports; the most frequent one in the sample becomes ``text.null_value``.
NULL_TOKENS = ("NA", "N/A", "NULL", "null", "None", "\\N", "nan", "NaN")
#: Share of a text column's values that must hold a separator for it to be read as a list.
LIST_SHARE = 0.3
HASH_MIN_VALUES = 1000
HASH_DISTINCT_SHARE = 0.9
HASH_BUCKETS = 1 << 22
HEAD_BYTES = 1 << 16

_INT = re.compile(r"-?\d+\Z")
_FLOAT = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\Z")
_HEX = re.compile(r"[0-9a-fA-F]+\Z")
_IDENT = re.compile(r"[A-Za-z_][\w .\-]*\Z")
_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1
_NAMES = {"\t": "tab", ",": "comma", ";": "semicolon", "|": "pipe"}
_LABEL_WORDS = {"label", "click", "clicked", "target"}
_CRITEO_WHY = "guessed: Criteo layout (no header; 0/1, 13 integer, 26 8-hex-digit columns)"
_TIME_WORDS = {"time", "timestamp", "date", "datetime"}

Kind = Literal["empty", "int", "bigint", "float", "hex", "string"]
Source = Literal["text", "int", "float", "string", "list_int", "list_string"]


@dataclass(frozen=True)
class Values:
    """What the present (non-null) values of a column look like."""

    kind: Kind
    count: int = 0
    distinct: int = 0
    width: int | None = None  # hex digits, when kind == "hex"
    minimum: float = 0.0  # numbers only
    binary: bool = False  # integers, every one 0 or 1
    example: str = ""


def summarise(values: Sequence[str]) -> Values:
    """The kind of ``values`` (present values only, as text): the narrowest of int (within int64), bigint (integer
    text beyond int64, within uint64), float, hex (one width, 1..16 digits), string; ``empty`` when there are none."""
    if not values:
        return Values("empty")
    count, distinct, example = len(values), len(set(values)), values[0]
    if all(_INT.match(v) for v in values):
        ints = [int(v) for v in values]
        if min(ints) < _INT64_MIN or max(ints) > _INT64_MAX:
            big = next(v for v, i in zip(values, ints) if not _INT64_MIN <= i <= _INT64_MAX)
            if min(ints) < _INT64_MIN or max(ints) > _UINT64_MAX:
                return Values("string", count, distinct, example=big)
            return Values("bigint", count, distinct, example=big)
        return Values("int", count, distinct, minimum=min(ints), binary=set(ints) <= {0, 1}, example=example)
    if all(_FLOAT.match(v) for v in values):
        floats = [float(v) for v in values]
        if all(math.isfinite(f) for f in floats):
            return Values("float", count, distinct, minimum=min(floats), example=example)
    widths = {len(v) for v in values}
    if len(widths) == 1 and 1 <= (w := widths.pop()) <= 16 and all(_HEX.match(v) for v in values):
        return Values("hex", count, distinct, width=w, example=example)
    return Values("string", count, distinct, example=example)


@dataclass(frozen=True)
class InferredColumn:
    """A guessed column: its spec, why, and the starter treatment (``label``, ``passthrough``, ``log1p``, ``normalize``,
    ``categorify``, ``hash``)."""

    spec: ColumnSpec
    reason: str
    treatment: str
    first_x: int | None = None  # lists: FirstX keeps this many values


@dataclass
class Inference:
    """A guessed schema and starter pipeline, with the reasons. ``text`` is None for Parquet inputs."""

    name: str
    sources: list[str]
    rows: int
    text: TextLayout | None
    text_reasons: dict[str, str]
    columns: list[InferredColumn]
    left_out: list[str] = field(default_factory=list)

    def schema(self) -> Schema:
        """The guessed schema, validated like a schema file."""
        return parse_schema(yaml.safe_load(self.schema_yaml()), f"<inferred from {self.sources[0]}>")

    def schema_yaml(self) -> str:
        """The schema as YAML, each guess explained by a comment."""
        lines = [f"# Guessed by `etl schema infer` from {', '.join(self.sources)} ({self.rows:,} rows sampled).",
                 "# Check every guess before use.", f"name: {_flow(self.name)}"]  # fmt: skip
        if self.text is None:
            lines.append("# Parquet input: etl preprocess reads it as it is (no text layout).")
        else:
            lines.append("text:")
            for key in ("delimiter", "header", "null_value"):
                lines.append(_commented(f"  {key}: {_flow(getattr(self.text, key))}", self.text_reasons[key]))
        lines.append("columns:")
        for c in self.columns:
            lines.append(_commented(f"  - {_flow(_column_doc(c.spec))}", c.reason))
        lines.extend(f"# left out: {why}" for why in self.left_out)
        return "\n".join(lines) + "\n"

    def pipeline_yaml(self, schema_ref: str) -> str:
        """A starter pipeline as YAML; ``schema_ref`` is the schema's path relative to the pipeline file."""
        lines = ["# Starter pipeline guessed by `etl schema infer`: check the choices against the full data set.",
                 f"name: {_flow(self.name)}", f"schema: {_flow(schema_ref)}", "ops:"]  # fmt: skip
        for op, why in self._ops():
            lines.append(_commented(f"  - {_flow(op)}", why))
        return "\n".join(lines) + "\n"

    def _ops(self) -> list[tuple[dict[str, Any], str]]:
        def by(treatment: str) -> list[str]:
            return [c.spec.name for c in self.columns if c.treatment == treatment]

        def select(names: list[str], role: str) -> str | list[str]:
            every = [c.spec.name for c in self.columns if c.spec.role == role]
            return f"@{role}" if names == every else names

        dense = [c.spec.name for c in self.columns if c.spec.role == "dense"]
        log, norm = by("log1p"), by("normalize")
        keyed = [c.spec.name for c in self.columns if c.spec.role in ("categorical", "list")]
        lists = [c for c in self.columns if c.spec.is_list]
        vocab, hashed = by("categorify"), by("hash")
        ops: list[tuple[dict[str, Any], str]] = []
        if dense:
            ops.append(({"op": "FillMissing", "columns": select(dense, "dense"), "value": 0}, "dense: missing → 0"))
        if log:
            ops.append(({"op": "Clamp", "columns": select(log, "dense"), "min": 0}, "no negative value in the sample; guards Log1p"))
            ops.append(({"op": "Log1p", "columns": select(log, "dense")}, "ln(1 + x)"))
        if norm:
            ops.append(({"op": "Normalize", "columns": select(norm, "dense")}, "negative or time-like values: (x - mean) / std"))
        if keyed:
            ops.append(({"op": "Decode", "columns": keyed}, "raw value → uint64 key, by each column's encoding"))
        for c in lists:
            ops.append(({"op": "FirstX", "columns": [c.spec.name], "x": c.first_x}, f"the longest sampled list has {c.first_x} values"))
        if vocab:
            ops.append(({"op": "Categorify", "columns": vocab, "freq_threshold": 1}, "vocabulary of every value seen"))
        if hashed:
            ops.append(({"op": "Hash", "columns": hashed, "num_buckets": HASH_BUCKETS, "seed": 0},
                        "nearly every sampled value distinct: hashed (set num_buckets to the expected cardinality)"))  # fmt: skip
        if not ops:
            raise InputError(self.sources[0], "no dense, categorical or list column found: nothing for a pipeline to do")
        return ops


def _column_doc(spec: ColumnSpec) -> dict[str, Any]:
    d: dict[str, Any] = {"name": spec.name, "role": spec.role, "dtype": spec.dtype}
    for k in ("encoding", "width", "separator"):
        if getattr(spec, k) is not None:
            d[k] = getattr(spec, k)
    return d


def _flow(value: Any) -> str:
    """``value`` as one line of flow-style YAML."""
    text = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1 << 30, allow_unicode=True)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def _commented(line: str, why: str) -> str:
    return f"{line}  # {why}" if why else line


# ---------------------------------------------------------------------------------------------------------------------
# Reading a sample


@dataclass
class _Sample:
    """The first rows of one input: column names (None for headerless text) and the values as text (None = null)."""

    path: Path
    names: list[str] | None
    columns: list[list[str | None]]
    sources: list[Source]
    delimiter: str | None = None
    delimiter_reason: str = ""
    header_reason: str = ""
    left_out: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.columns[0]) if self.columns else 0


def _is_parquet(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"PAR1"


def _sample_parquet(path: Path, rows: int) -> _Sample:
    try:
        batch = next(pq.ParquetFile(path).iter_batches(batch_size=rows), None)
        schema = pq.read_schema(path)
    except (pa.ArrowException, OSError) as e:
        raise InputError(str(path), f"cannot read Parquet: {e}") from None
    names, columns, sources, left_out = [], [], [], []
    for i, f in enumerate(schema):
        t = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
        source = _parquet_source(t)
        if source is None:
            left_out.append(f"column {f.name!r} ({f.type}): no schema dtype holds it")
            continue
        arr = batch.column(i) if batch is not None else pa.array([], f.type)
        if pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_decode()
        names.append(f.name)
        sources.append(source)
        columns.append([_text(v) for v in arr.to_pylist()])
    return _Sample(path, names, columns, sources, left_out=left_out)


def _parquet_source(t: pa.DataType) -> Source | None:
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = _parquet_source(t.value_type)
        return "list_int" if inner == "int" else "list_string" if inner == "string" else None
    return None


def _text(v: Any) -> Any:
    """A Parquet value as the text it would have in a CSV file (lists: a list of such texts)."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, list):
        return [_text(x) for x in v]
    return repr(v) if isinstance(v, float) else str(v)


def _head_records(path: Path) -> list[str]:
    """The lines of the first ``HEAD_BYTES`` of the (decompressed) file, without a cut last line."""
    try:
        with pa.input_stream(str(path), compression="detect") as f:
            data = f.read(HEAD_BYTES)
    except (pa.ArrowException, OSError) as e:
        raise InputError(str(path), f"cannot read: {e}") from None
    text = data.decode("utf-8", errors="replace")
    lines = text.splitlines()
    if len(data) == HEAD_BYTES and len(lines) > 1:
        lines = lines[:-1]
    return [ln for ln in lines if ln]


def _sniff_delimiter(path: Path, lines: list[str]) -> tuple[str, int, str]:
    """(delimiter, fields per line, reason)."""
    best: tuple[int, str] | None = None
    for d in DELIMITERS:
        try:
            counts = {len(r) for r in csv.reader(io.StringIO("\n".join(lines)), delimiter=d)}
        except csv.Error:
            continue
        if len(counts) == 1 and (n := counts.pop()) > 1 and (best is None or n > best[0]):
            best = (n, d)
    if best is None:
        tried = ", ".join(_NAMES[d] for d in DELIMITERS)
        problem = f"no delimiter found: none of {tried} splits each of the first {len(lines)} lines into the same number (> 1) of fields"
        raise InputError(str(path), problem)
    n, d = best
    return d, n, f"guessed: every sampled line has {n} {_NAMES[d]}-separated fields"


def _sample_text(path: Path, rows: int) -> _Sample:
    lines = _head_records(path)
    if not lines:
        raise InputError(str(path), "empty: no rows to infer from")
    delimiter, n, why = _sniff_delimiter(path, lines)
    names = [f"f{i}" for i in range(n)]
    try:
        reader = pacsv.open_csv(
            pa.input_stream(str(path), compression="detect"),
            read_options=pacsv.ReadOptions(column_names=names, block_size=1 << 20, use_threads=False),
            parse_options=pacsv.ParseOptions(delimiter=delimiter),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in names}, null_values=[],
                                                 strings_can_be_null=False, quoted_strings_can_be_null=False),  # fmt: skip
        )
        batches, got = [], 0
        for batch in reader:
            batches.append(batch)
            got += batch.num_rows
            if got > rows:
                break
    except (pa.ArrowException, OSError) as e:
        raise InputError(str(path), f"cannot read as {_NAMES[delimiter]}-separated text: {str(e)[:300]}") from None
    table = pa.Table.from_batches(batches, reader.schema).slice(0, rows + 1)
    for i in range(n):  # a quote left open would make the sample end early, without a word
        check_one_line(table.column(i).combine_chunks(), f"field {i + 1}", path, 1)
    columns: list[list[str | None]] = [table.column(i).to_pylist() for i in range(n)]
    header, header_why = _detect_header(columns)
    names_out = None
    if header:
        names_out = [str(col[0]) for col in columns]
        columns = [col[1:] for col in columns]
    else:
        columns = [col[:rows] for col in columns]
    return _Sample(path, names_out, columns, ["text"] * n, delimiter, why, header_why)


def _detect_header(columns: list[list[str | None]]) -> tuple[bool, str]:
    first = [str(c[0]) for c in columns]
    rest = [[v for v in c[1:] if v] for c in columns]
    if any(_FLOAT.match(v) for v in first):
        return False, "guessed: the first line holds numbers (not column names)"
    if any(not v for v in first) or len(set(first)) < len(first):
        return False, "guessed: the first line has empty or repeated fields (not column names)"
    for name, values in zip(first, rest):
        kind = summarise(values)
        if kind.kind in ("int", "bigint", "float", "hex") and summarise([*values, name]).kind != kind.kind:
            return True, f"guessed: the first line names the columns ({name!r} above {kind.kind} values)"
        if kind.kind == "hex" and len(name) != kind.width:
            return True, f"guessed: the first line names the columns ({name!r} above {kind.width}-digit hex values)"
    if all(_IDENT.match(v) for v in first) and not any(v in set(values) for v, values in zip(first, rest)):
        return True, "guessed: the first line holds names that do not recur below"
    return False, "guessed: the first line looks like data"


# ---------------------------------------------------------------------------------------------------------------------
# Guessing


def _words(name: str) -> list[str]:
    """``userId`` → ``[user, id]``, ``movie_id`` → ``[movie, id]``."""
    return [w for w in re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()) if w]


def _is_label_name(name: str, v: Values) -> str | None:
    """Why ``name`` with values ``v`` is a label, or None."""
    words = set(_words(name))
    if v.kind in ("int", "float") and "rating" in words:
        return f"guessed: named {name!r} (a rating is a label whatever its values)"
    hit = sorted(words & _LABEL_WORDS) or (["y"] if name.lower() == "y" else [])
    if v.kind == "int" and v.binary and hit:
        return f"guessed: 0/1 values, named {name!r}"
    return None


def _criteo_layout(kinds: list[Values]) -> bool:
    """Headerless Criteo: a 0/1 column, 13 integer columns, 26 columns of 8 hex digits (empty columns fit any)."""
    if len(kinds) != 40 or not (kinds[0].kind == "int" and kinds[0].binary):
        return False
    ints = all(k.kind in ("int", "empty") for k in kinds[1:14])
    hexes = all(k.kind == "empty" or (k.kind == "hex" and k.width == 8) for k in kinds[14:])
    return ints and hexes and any(k.kind == "hex" for k in kinds[14:])


def _present(values: list[Any], nulls: set[str]) -> list[Any]:
    return [v for v in values if v is not None and (isinstance(v, list) or v not in nulls)]


def _null_token(columns: list[list[str | None]]) -> tuple[str, str]:
    counts = Counter(v for col in columns for v in col if v in NULL_TOKENS)
    if not counts:
        return "", "guessed: empty fields are missing values"
    token, n = counts.most_common(1)[0]
    others = [t for t in counts if t != token]
    also = f"; {others} stay values (the format has one null token)" if others else ""
    return token, f"guessed: {token!r} appears {n:,} times in the sample (it and empty fields are missing){also}"


def _guess_scalar(name: str, v: Values, source: Source, role_label: str | None) -> InferredColumn:
    if role_label:
        return InferredColumn(ColumnSpec(name, "label", "int64" if v.kind == "int" else "float64"), role_label, "label")
    if name.lower() == "id" and v.count >= 2 and v.distinct == v.count and source in ("text", "int", "string"):
        dtype = "int64" if v.kind == "int" and source != "string" else "string"
        why = f"guessed: a row id (all {v.count:,} sampled values distinct): copied to the output, not a feature"
        return InferredColumn(ColumnSpec(name, "passthrough", dtype), why, "passthrough")
    words = set(_words(name))
    if v.kind in ("int", "float") and source != "string":
        if v.kind == "int" and "id" in words:
            return InferredColumn(ColumnSpec(name, "categorical", "int64", "int"), f"guessed: integer ids (named {name!r})", "categorify")
        dtype = "int64" if v.kind == "int" else "float64"
        kind = "integers" if v.kind == "int" else "numbers"
        if words & _TIME_WORDS:
            return InferredColumn(ColumnSpec(name, "dense", dtype), f"guessed: {kind}, a time (named {name!r}): standardised", "normalize")
        if v.minimum < 0:
            return InferredColumn(ColumnSpec(name, "dense", dtype), f"guessed: {kind}, some negative (min {v.minimum:g}): standardised", "normalize")
        return InferredColumn(ColumnSpec(name, "dense", dtype), f"guessed: {kind} >= 0", "log1p")
    if v.kind == "int":  # integer text in a Parquet string column
        return _keyed(ColumnSpec(name, "categorical", "string", "int"), v, "guessed: integer text")
    if v.kind == "bigint":
        return _keyed(ColumnSpec(name, "categorical", "string", "int"), v,
                      f"guessed: integer text beyond int64 (e.g. {v.example}): kept as text, decoded to exact uint64 keys")  # fmt: skip
    if v.kind == "hex":
        return _keyed(ColumnSpec(name, "categorical", "string", "hex", v.width), v, f"guessed: every value is {v.width} hex digits")
    if v.kind == "empty":
        return _keyed(ColumnSpec(name, "categorical", "string", "string"), v, "guessed: no value in the sample: kept as text")
    return _keyed(ColumnSpec(name, "categorical", "string", "string"), v, "guessed: text")


def _keyed(spec: ColumnSpec, v: Values, why: str) -> InferredColumn:
    if v.count >= HASH_MIN_VALUES and v.distinct >= HASH_DISTINCT_SHARE * v.count:
        return InferredColumn(spec, f"{why}; {v.distinct:,} distinct in {v.count:,} values", "hash")
    return InferredColumn(spec, why, "categorify")


def _kind(values: list[Any], source: Source) -> Values:
    """``summarise`` for one column. A Parquet number column keeps its kind whatever its values: integers of any
    range (uint64 included), floats with NaN or infinities (which ``FillMissing`` then reports), or none at all."""
    if source.startswith("list"):
        return Values("string")
    if source == "float":
        finite = [f for f in map(float, values) if math.isfinite(f)]
        return Values("float", len(values), len(set(values)), minimum=min(finite, default=0.0), example=values[0] if values else "")
    v = summarise(values)
    if source == "int" and v.kind != "int":
        return Values("int", v.count, v.distinct, minimum=min(map(int, values), default=0), example=v.example)  # uint64, or no value
    return v


def _element_spec(name: str, elements: list[str], sep: str, source: Source) -> tuple[ColumnSpec, str]:
    e = summarise(elements)
    if e.kind == "int" and source != "string":
        return ColumnSpec(name, "list", "int64", "int", None, sep), "integer"
    if e.kind == "int":
        return ColumnSpec(name, "list", "string", "int", None, sep), "integer text"
    if e.kind == "hex":
        return ColumnSpec(name, "list", "string", "hex", e.width, sep), f"{e.width}-digit hex"
    return ColumnSpec(name, "list", "string", "string", None, sep), "text"


def _guess_list(name: str, values: list[Any], source: Source, delimiter: str | None) -> InferredColumn | None:
    """A list column, when ``values`` are Parquet lists or text that often holds a list separator."""
    if source in ("list_int", "list_string"):
        lists = [x for x in values if x]
        elements = [e for x in lists for e in x if e is not None]
        spec, what = _element_spec(name, elements, "|", "int" if source == "list_int" else "string")
        why = f"guessed: Parquet lists of {what} values (the separator only matters for text)"
        return _list_column(spec, why, lists, elements)
    if not values:
        return None
    for sep in LIST_SEPARATORS:
        share = sum(sep in x for x in values) / len(values)
        if sep != delimiter and share >= LIST_SHARE:
            lists = [x.split(sep) for x in values]
            elements = [e for x in lists for e in x]
            spec, what = _element_spec(name, elements, sep, "text")
            why = f"guessed: {100 * share:.0f} % of the values hold {sep!r}: lists of {what} values"
            return _list_column(spec, why, lists, elements)
    return None


def _list_column(spec: ColumnSpec, why: str, lists: list[list[Any]], elements: list[Any]) -> InferredColumn:
    v = Values("string", len(elements), len(set(elements)))
    longest = max((len(x) for x in lists), default=1)
    treatment = _keyed(spec, v, why)
    return InferredColumn(spec, treatment.reason, treatment.treatment, longest)


def infer(paths: Sequence[str | Path], rows: int = 10_000) -> Inference:
    """Guess a schema and starter pipeline from the first ``rows`` rows of each input (see the module docstring).

    Every input must have the layout of the first (same delimiter, header, columns). Raises ``InputError`` for a
    missing, empty or unreadable input, or inputs of different layouts."""
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
        raise ValueError(f"rows must be a positive integer, got {rows!r}")
    files = [Path(p) for p in paths]
    if not files:
        raise InputError("<inputs>", "no input files given")
    samples = []
    for p in files:
        if not p.is_file():
            raise InputError(str(p), "no such file" if not p.exists() else "not a regular file")
        samples.append(_sample_parquet(p, rows) if _is_parquet(p) else _sample_text(p, rows))
    first = samples[0]
    for s in samples[1:]:
        if (s.names, s.delimiter, s.sources) != (first.names, first.delimiter, first.sources) or len(s.columns) != len(first.columns):
            raise InputError(str(s.path), f"its layout (delimiter, header, columns) differs from {first.path}'s")
    columns = [[v for s in samples for v in s.columns[i]] for i in range(len(first.columns))]
    is_text = first.delimiter is not None
    null, null_why = _null_token(columns) if is_text else ("", "")
    nulls = {"", null} if is_text else set()
    present = [_present(col, nulls) for col in columns]
    kinds = [_kind(vals, src) for vals, src in zip(present, first.sources)]

    names, fixed_label = first.names, None
    layout = ""
    if names is None and _criteo_layout(kinds):
        names = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
        layout = "Criteo layout"
        fixed_label = 0
    elif names is None:
        names = [f"col{i}" for i in range(len(columns))]
        fixed_label = next((i for i, k in enumerate(kinds) if k.kind == "int" and k.binary), None)
    label_at, label_why = None, ""
    for i, (n, k) in enumerate(zip(names, kinds)):
        why = _is_label_name(n, k) if fixed_label is None and first.sources[i] != "string" else None
        if fixed_label == i:
            why = _CRITEO_WHY if layout else "guessed: the first 0/1 column of a file without a header"
        if why:
            label_at, label_why = i, why
            break

    out = []
    for i, (n, vals, k, src) in enumerate(zip(names, present, kinds, first.sources)):
        guess = None
        if i != label_at and (src.startswith("list") or k.kind == "string"):
            guess = _guess_list(n, vals, src, first.delimiter)
        if guess is None and layout and i > 0:
            spec = ColumnSpec(n, "dense", "int64") if i < 14 else ColumnSpec(n, "categorical", "string", "hex", 8)
            base = _guess_scalar(n, k if k.kind != "empty" else Values("int", minimum=0), "text", None) if i < 14 else None
            guess = (InferredColumn(spec, f"{layout}; {base.reason.removeprefix('guessed: ')}", base.treatment) if base
                     else _keyed(spec, k, f"guessed: {layout}"))  # fmt: skip
        if guess is None:
            guess = _guess_scalar(n, k, src, label_why if i == label_at else None)
        out.append(guess)

    text = None
    reasons: dict[str, str] = {}
    if first.delimiter is not None:
        text = TextLayout(first.delimiter, first.names is not None, null)
        reasons = {"delimiter": first.delimiter_reason, "header": first.header_reason, "null_value": null_why}
    rows_sampled = sum(s.rows for s in samples)
    inference = Inference(_schema_name(files[0]), [p.name for p in files], rows_sampled, text, reasons, out, first.left_out)
    inference.schema()  # the guess must be a valid schema: a column name a schema refuses is reported here
    return inference


def _schema_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".bz2", ".zst", ".parquet", ".csv", ".tsv", ".txt"):
        name = name.removesuffix(suffix)
    return name or path.name
