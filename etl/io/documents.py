"""Parsing the JSON and YAML documents read from files (manifests, artifacts, saved states, schemas, pipelines).

Every such file is untrusted. The parsers recurse once per level of nesting, so a document nested deeper than the
interpreter's recursion limit (``'[' * 100000 + ']' * 100000``) makes them raise ``RecursionError``, which is no
error of the document's format and would reach the user as a traceback. ``parse_document`` makes it a
``ValueError``, as any other malformed document, which each reader reports in one line naming its file with its
own error type.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T", str, bytes)


def parse_document(data: T, loads: Callable[[T], Any] = json.loads) -> Any:
    """``loads(data)`` (by default ``json.loads``), raising ``ValueError`` instead of ``RecursionError`` for a
    document nested too deeply to parse; other errors are those of ``loads``."""
    try:
        return loads(data)
    except RecursionError:
        raise ValueError("nested too deeply to parse (more levels of arrays or objects than the parser can recurse)") from None
