"""The record a saved table carries of what made it, and the check that it was made for where it is loaded.

A fitted table (a Categorify vocabulary, ``etl.pipeline.artifacts``) and a saved streaming state's table
(``etl.pipeline.saved_streams``) hold values that mean something only for the op, column and parameters that made
them: C4's vocabulary read as C3's gives C3's keys the ids of C4's (most of them out-of-vocabulary ids), and no
check on the table's contents can tell. Each such table carries its record (``etl.ops.base.made_by``: op, column and parameters, as JSON) in its
Parquet schema's metadata under ``MADE_BY``, and is loaded only where the record is the one the loading op would
write.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from etl.errors import EtlError
from etl.io.documents import parse_document

#: The key of a saved table's schema metadata that holds its record (JSON).
MADE_BY = b"etl.made_by"


def stamped(table: pa.Table, record: dict[str, Any]) -> pa.Table:
    """``table`` with ``record`` in its schema metadata (its other metadata kept)."""
    return table.replace_schema_metadata({**(table.schema.metadata or {}), MADE_BY: json.dumps(record, sort_keys=True)})


def table_record(table: pa.Table) -> Any:
    """The record in ``table``'s schema metadata: None when it has none; the metadata's bytes when they are no
    JSON (a record ``check_record`` refuses)."""
    text = (table.schema.metadata or {}).get(MADE_BY)
    if text is None:
        return None
    try:
        return parse_document(text)
    except ValueError:  # json.JSONDecodeError, UnicodeDecodeError, too deep
        return text


def check_record(saved: Any, mine: dict[str, Any], error: Callable[[str], EtlError]) -> None:
    """``error`` unless ``saved`` is the record ``mine``, naming what differs (``made by another pipeline: column
    'C4' (this pipeline: 'C3')``)."""
    if saved == mine:
        return
    if not isinstance(saved, dict) or not isinstance(saved.get("params"), dict):
        raise error(f"no valid record of what made it (made_by {saved!r:.200})")
    found = {"op": saved.get("op"), "column": saved.get("column"), **saved["params"]}
    wanted = {"op": mine["op"], "column": mine["column"], **mine["params"]}
    keys = sorted(found.keys() | wanted.keys())
    diffs = [f"{k} {_shown(found, k)} (this pipeline: {_shown(wanted, k)})" for k in keys if _shown(found, k) != _shown(wanted, k)]
    raise error(f"made by another pipeline: {', '.join(diffs) or f'record {saved!r:.200}'}")


def _shown(record: dict[str, Any], key: str) -> str:
    """``record[key]`` for messages (``<none>`` when it has no such key)."""
    return repr(record[key]) if key in record else "<none>"
