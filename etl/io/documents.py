"""Parsing the JSON and YAML documents read from files (manifests, artifacts, saved states, schemas, pipelines).

Every such file is untrusted. The parsers recurse once per level of nesting, so a document nested deeper than the
interpreter's recursion limit (``'[' * 100000 + ']' * 100000``) makes them raise ``RecursionError``, which is no
error of the document's format and would reach the user as a traceback. ``parse_document`` makes it a
``ValueError``, as any other malformed document, which each reader reports in one line naming its file with its
own error type.

YAML files (schemas, pipelines) are parsed by ``parse_yaml``, which reports a malformed one in a single line naming
the file, the line and the column: ``pipe.yaml:3:1: invalid YAML: did not find expected ',' or '}' (while
parsing a flow mapping at 2:8)``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import yaml

from etl.errors import SpecError, YamlError

T = TypeVar("T", str, bytes)

#: ``yaml.safe_load``'s loader, in its C implementation (libyaml) when PyYAML has it: same documents, parsed faster
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_document(data: T, loads: Callable[[T], Any] = json.loads) -> Any:
    """``loads(data)`` (by default ``json.loads``), raising ``ValueError`` instead of ``RecursionError`` for a
    document nested too deeply to parse; other errors are those of ``loads``."""
    try:
        return loads(data)
    except RecursionError:
        raise ValueError("nested too deeply to parse (more levels of arrays or objects than the parser can recurse)") from None


def parse_yaml(data: bytes, name: str) -> Any:
    """The YAML document ``data`` (the bytes of the file ``name``) as plain data (``yaml.safe_load``: mappings,
    lists, text, numbers, dates; never Python objects). Text that is not UTF-8 or not YAML raises ``YamlError``,
    one line ``NAME:LINE:COLUMN: problem`` (1-based); a document nested too deeply to parse, ``SpecError``."""
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        line, column = _place(data, e.start)
        raise YamlError(name, line, column, f"invalid YAML: not UTF-8 text (byte 0x{data[e.start]:02x})") from None
    try:
        return parse_document(text, lambda t: yaml.load(t, Loader=_SAFE_LOADER))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = " ".join(str(e.problem or e.context or "malformed").split())
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        context = e.context_mark and (e.context_mark.line + 1, e.context_mark.column + 1)
        if e.context and e.problem and context:
            problem += f" ({' '.join(e.context.split())}" + (f" at {context[0]}:{context[1]})" if context != (line, column) else ")")
        raise YamlError(name, line, column, f"invalid YAML: {problem}") from None
    except yaml.reader.ReaderError as e:  # a character YAML does not allow (a control character): at a text position
        line, column = _place(text, e.position)
        character = f"unacceptable character #x{e.character:04x}: " if isinstance(e.character, int) else ""
        raise YamlError(name, line, column, f"invalid YAML: {character}{e.reason}") from None
    except (yaml.YAMLError, ValueError) as e:  # ValueError: nested too deeply
        raise SpecError(name, "<file>", f"invalid YAML: {' '.join(str(e).split())}") from None


def _place(data: T, offset: int) -> tuple[int, int]:
    """The 1-based (line, column) of position ``offset`` of ``data`` (text, or bytes: a column in bytes)."""
    newline = "\n" if isinstance(data, str) else b"\n"
    start = data.rfind(newline, 0, offset) + 1
    return data.count(newline, 0, offset) + 1, offset - start + 1
