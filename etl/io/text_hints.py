"""Delimited text read as the wrong thing, and what the user most likely meant: text split at another delimiter
than the schema's (``delimiter_hint``), or text given where Parquet shards are expected (``convert_hint``, which
shows the ``etl convert`` command that makes the shards). Also how text is opened (``open_text``: decompressed on
the fly by its name's ending), for ``etl.io.text`` and the hints alike."""

from __future__ import annotations

import csv
import json
import shlex
from collections import Counter
from collections.abc import Callable

import pyarrow as pa

from etl.io.fs import Location, Url
from etl.schema import Schema

#: the delimiters ``delimiter_hint`` tries, by the word that names them
DELIMITERS = {",": "comma", "\t": "tab", ";": "semicolon", "|": "pipe"}
#: the bytes of text ``is_text`` and ``line_text`` look at
_HEAD_BYTES = 1 << 20


def open_text(path: Location) -> pa.NativeFile:
    """``path`` opened for streaming, decompressed on the fly when its name ends in ``.gz``, ``.bz2``, ``.zst``, ..."""
    if not isinstance(path, Url):
        return pa.input_stream(str(path), compression="detect")
    try:
        codec = pa.Codec.detect(path.name).name
    except (TypeError, ValueError):  # no compression extension
        codec = None
    return pa.input_stream(path.open("rb"), compression=codec)


def _head(path: Location) -> bytes:
    """The first ``_HEAD_BYTES`` of ``path``'s text (decompressed); empty when it cannot be read."""
    try:
        with open_text(path) as stream:
            return stream.read(_HEAD_BYTES)
    except (pa.ArrowException, OSError):
        return b""


def line_text(path: Location, number: int) -> str | None:
    """Line ``number`` (1-based) of ``path`` when it lies within the first MiB of text, else None."""
    lines = _head(path).decode("utf-8", "replace").splitlines()
    return lines[number - 1] if 0 < number <= len(lines) else None


def delimiter_hint(path: Location, schema: Schema, fits: Callable[[list[str]], bool], line: str) -> str:
    """When ``line`` split at another of ``DELIMITERS`` than the schema's gives fields that ``fits``: a hint, to
    append to the error, naming that delimiter and how to set it (or infer a schema); else nothing."""
    for delimiter, word in DELIMITERS.items():
        if delimiter != schema.text.delimiter and delimiter in line and fits(next(csv.reader([line], delimiter=delimiter))):
            says = DELIMITERS.get(schema.text.delimiter, repr(schema.text.delimiter))
            return (f"; the line looks {word}-separated, and the schema {schema.path} says {says}-separated: set "
                    f"text: {{delimiter: {json.dumps(delimiter)}}} in a copy of the schema, or guess one with: etl schema infer {path}")
    return ""


def is_text(path: Location) -> bool:
    """Whether ``path`` holds delimited text (decompressed by its name's ending): UTF-8 without NUL bytes, not
    Parquet, with a line break or a delimiter in its first MiB."""
    head = _head(path)
    if not head or head.startswith(b"PAR1") or b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 3:  # more than a character cut at the end of the head
            return False
    return any(d.encode() in head for d in (*DELIMITERS, "\n"))


def convert_hint(path: Location, schema: str = "SCHEMA") -> str | None:
    """When ``path``, given where raw Parquet shards are expected, is delimited text (a file not named
    ``*.parquet``), or a directory holding no ``*.parquet`` file but text files: what it is and the ``etl convert``
    command (with ``schema``, a schema file or shipped name) that makes shards of it (of a directory: of its files
    with the most common name ending). None otherwise."""
    if path.name.endswith(".parquet"):
        return None
    if path.is_dir():
        if any(path.glob("*.parquet")):
            return None
        texts = sorted((p for p in path.iterdir() if not p.name.startswith(".") and p.is_file() and is_text(p)), key=str)
        if not texts:
            return None
        endings = Counter(_ending(p) for p in texts)
        ending = max(sorted(endings), key=lambda e: endings[e])  # the most common one: the data, not a README.txt
        texts = [p for p in texts if _ending(p) == ending]
        source = path / f"*{ending}"
        shown = ", ".join(p.name for p in texts[:3]) + (", ..." if len(texts) > 3 else "")
        what = f"a directory of delimited text ({len(texts)} *{ending} file(s): {shown})"
        stem = path.name
    elif path.is_file() and is_text(path):
        source, what, stem = path, "delimited text", path.name[: -len(_ending(path))] or path.name
    else:
        return None
    out = path.parent / f"{stem}_raw"
    return (f"{what}, not Parquet shards: convert it first, then read the shards it writes: etl convert {shlex.quote(str(source))} "
            f"--schema {shlex.quote(schema)} --out {shlex.quote(str(out))}")


def _ending(path: Location) -> str:
    """The ending of ``path``'s name from its first dot (``.csv.gz``), or empty."""
    name = path.name.lstrip(".")
    return name[name.index("."):] if "." in name else ""
