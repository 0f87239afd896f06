"""Saved streaming states (``etl.ops.stream``): their form in a loader's ``state_dict`` and on disk, and the check
that a saved state is one of a pipeline's states. Everything read here is untrusted and checked here.

A state (``StateArrays``) is saved with the record of what made it (``StreamSpec.made_by``: op, column and
parameters) and read back only as a state of the same name and record, with its scalars integers and its arrays of
the declared dtypes and one length (``ConfigError`` for a ``state_dict``, ``ArtifactError`` naming the file for a
directory, one line naming the state and what differs); ``StreamState.check`` then checks the contents.

- In a ``state_dict`` (plain values: dicts, str, int, None, bytes; no pickled objects), under ``STATE_KEY``: per
  state name, ``made_by`` (the record), its scalars as ints and its arrays as the bytes of little-endian arrays of
  their dtypes. The form written before states carried a record (under ``LEGACY_KEY``: per online vocabulary its
  scalars and arrays, the same way) is still read, with nothing to check the record against.
- On disk, in a directory of its own: ``stream_state.json`` (format name and version; per state its record, its
  scalars, its arrays' names and dtypes, and the path of its table) plus one Parquet table per state
  (``online-NN.parquet``, NN its place in the JSON: the arrays as columns of those types, no nulls, and the record
  again in the schema's metadata (``etl.pipeline.made_by``), so that a table given to another state is refused too;
  written last, the JSON). The older ``online_vocabulary.json`` (format ``etl-online-vocabulary`` version 1: per column its ``rows``
  and the path of its table), written before states carried a record, is still read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from etl.errors import ArtifactError, ConfigError, EtlError
from etl.io.arrow import from_numpy, to_numpy
from etl.io.documents import parse_document
from etl.io.files import atomic_write_bytes, atomic_write_parquet
from etl.io.fs import Location, location
from etl.ops.stream import StateArrays, StreamSpec
from etl.pipeline.artifacts import read_table
from etl.pipeline.made_by import check_record, stamped, table_record

#: States by name.
State = dict[str, StateArrays]

STATE_KEY = "streams"
LEGACY_KEY = "online_vocab"
FORMAT, VERSION, FILE = "etl-stream-state", 1, "stream_state.json"
LEGACY_FORMAT, LEGACY_VERSION, LEGACY_FILE = "etl-online-vocabulary", 1, "online_vocabulary.json"


# ---------------------------------------------------------------------------------------------- state_dict
def to_dict(state: State, specs: Mapping[str, StreamSpec]) -> dict[str, Any]:
    """``state`` (canonical) in its ``state_dict`` form (see the module docstring)."""
    return {n: {"made_by": specs[n].made_by, **{k: int(s[k]) for k in specs[n].scalars},
                **{k: np.asarray(s[k], t.newbyteorder("<")).tobytes() for k, t in specs[n].arrays.items()}}
            for n, s in state.items()}  # fmt: skip


def holds_states(saved: Mapping[str, Any]) -> bool:
    """Whether a loader's ``state_dict`` holds streaming states (in either form)."""
    return STATE_KEY in saved or LEGACY_KEY in saved


def from_dict(saved: Mapping[str, Any], specs: Mapping[str, StreamSpec]) -> State:
    """The states a loader's ``state_dict`` holds, checked to be states of ``specs`` (``ConfigError``)."""
    legacy = STATE_KEY not in saved
    if legacy and LEGACY_KEY not in saved:
        raise ConfigError(f"state_dict has no {STATE_KEY} (no {LEGACY_KEY} either): it was saved by a loader without streaming states "
                          f"({_kinds(specs)})")  # fmt: skip
    doc = _same_names(saved[LEGACY_KEY if legacy else STATE_KEY], specs, lambda problem: ConfigError(f"state_dict: {problem}"))
    state = {}
    for n, spec in specs.items():
        entry = doc[n]

        def error(problem: str, spec: StreamSpec = spec) -> EtlError:
            return ConfigError(f"state_dict: {spec.describe()}: {problem}")

        if not isinstance(entry, dict):
            raise error(f"expected a dict, got {type(entry).__name__}")
        if not legacy:
            check_record(entry.get("made_by"), spec.made_by, error)
        try:
            arrays = {k: np.frombuffer(entry[k], t.newbyteorder("<")).astype(t) for k, t in spec.arrays.items()}
        except (KeyError, TypeError, ValueError) as e:
            raise error(f"malformed arrays: {type(e).__name__}: {e}") from None
        state[n] = _checked(_scalars(entry, spec, error), arrays, error)
    return state


# ---------------------------------------------------------------------------------------------- directory
def save(directory: str | Location, state: State, specs: Mapping[str, StreamSpec]) -> None:
    """Write ``state`` (canonical) into ``directory`` (see the module docstring; atomic per file)."""
    d = location(directory)
    d.mkdir(parents=True, exist_ok=True)
    entries = {}
    for i, (n, s) in enumerate(state.items()):
        spec = specs[n]
        table = pa.Table.from_arrays([from_numpy(np.asarray(s[k], t)) for k, t in spec.arrays.items()], schema=_schema(spec))
        table = stamped(table, spec.made_by)
        rel = f"online-{i:02d}.parquet"
        atomic_write_parquet(table, d / rel, use_dictionary=False)
        entries[n] = {"made_by": spec.made_by, "scalars": {k: int(s[k]) for k in spec.scalars}, "arrays": _dtypes(spec), "table": rel}
    doc = {"format": FORMAT, "version": VERSION, "states": entries}
    atomic_write_bytes(d / FILE, json.dumps(doc, indent=1, sort_keys=True, allow_nan=False).encode())


def load(directory: str | Location, specs: Mapping[str, StreamSpec]) -> tuple[State, dict[str, Location]]:
    """The states saved in ``directory`` (by ``save``, or in the older format), checked to be states of ``specs``
    (``ArtifactError`` naming the file), and per state the file that holds its table (for later errors)."""
    d = location(directory)
    path, legacy = d / FILE, False
    doc = _read_json(path)
    if doc is None:
        path, legacy = d / LEGACY_FILE, True
        doc = _read_json(path)
    if doc is None:
        raise ArtifactError(f"{d}: no {FILE} (nor the older {LEGACY_FILE}): not a saved streaming state")
    fmt, version, field = (LEGACY_FORMAT, LEGACY_VERSION, "columns") if legacy else (FORMAT, VERSION, "states")
    if not isinstance(doc, dict) or doc.get("format") != fmt or doc.get("version") != version:
        raise ArtifactError(f"{path}: not format {fmt!r} version {version}")
    entries = _same_names(doc.get(field), specs, lambda problem: ArtifactError(f"{path}: field '{field}': {problem}"))
    state, tables = {}, {}
    for n, spec in specs.items():
        entry, where = entries[n], f"{field}.{n}"

        def error(problem: str, spec: StreamSpec = spec, where: str = where) -> EtlError:
            return ArtifactError(f"{path}: field '{where}': {spec.describe()}: {problem}")

        if not isinstance(entry, dict):
            raise error(f"expected a JSON object, got {type(entry).__name__}")
        if not legacy:
            check_record(entry.get("made_by"), spec.made_by, error)
            if entry.get("arrays") != _dtypes(spec):
                raise error(f"arrays {entry.get('arrays')!r}, expected {_dtypes(spec)}")
        scalars = _scalars(entry if legacy else entry.get("scalars"), spec, error)
        rel = entry.get("table")
        table = read_table(d, rel, f"{where}.table", path.name)  # a relative path inside d
        tables[n] = d / str(rel)
        schema = _schema(spec)
        if not table.schema.equals(schema) or any(table.column(k).null_count for k in spec.arrays):
            raise ArtifactError(f"{tables[n]}: expected columns {schema.names} typed {[str(f.type) for f in schema]}, no nulls")
        if not legacy:

            def table_error(problem: str, spec: StreamSpec = spec, at: Location = tables[n]) -> EtlError:
                return ArtifactError(f"{at}: table of {spec.describe()}: {problem}")

            check_record(table_record(table), spec.made_by, table_error)
        state[n] = _checked(scalars, {k: to_numpy(table.column(k)) for k in spec.arrays}, error)
    return state, tables


# ---------------------------------------------------------------------------------------------- checks
def _same_names(doc: Any, specs: Mapping[str, StreamSpec], error: Callable[[str], EtlError]) -> dict[str, Any]:
    """``doc``, which must be a dict with one entry per state of ``specs`` (``error`` otherwise)."""
    if not isinstance(doc, dict) or set(doc) != set(specs):
        found = sorted(map(str, doc)) if isinstance(doc, dict) else doc
        raise error(f"streaming states {found!r}, this loader has {sorted(specs)} ({_kinds(specs)})")
    return doc


def _scalars(doc: Any, spec: StreamSpec, error: Callable[[str], EtlError]) -> dict[str, int]:
    """``spec``'s scalars in ``doc``, each an integer."""
    if not isinstance(doc, dict):
        raise error(f"no scalars {list(spec.scalars)}")
    out = {}
    for k in spec.scalars:
        v = doc.get(k)
        if not isinstance(v, int) or isinstance(v, bool):
            raise error(f"scalar '{k}': expected an integer, got {v!r}")
        out[k] = v
    return out


def _checked(scalars: dict[str, int], arrays: dict[str, np.ndarray], error: Callable[[str], EtlError]) -> StateArrays:
    """The state of ``scalars`` and ``arrays``, whose arrays must have one length."""
    if len({len(a) for a in arrays.values()}) > 1:
        raise error(f"arrays {list(arrays)} differ in length")
    return {**scalars, **arrays}


def _schema(spec: StreamSpec) -> pa.Schema:
    return pa.schema([(k, pa.from_numpy_dtype(t)) for k, t in spec.arrays.items()])


def _dtypes(spec: StreamSpec) -> dict[str, str]:
    return {k: t.name for k, t in spec.arrays.items()}


def _kinds(specs: Mapping[str, StreamSpec]) -> str:
    return ", ".join(sorted({s.kind for s in specs.values()})) or "none"


def _read_json(path: Location) -> Any:
    """The parsed JSON at ``path``, or None when there is no such file."""
    try:
        return parse_document(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:  # json.JSONDecodeError, UnicodeDecodeError, nested too deeply
        raise ArtifactError(f"{path}: cannot read: {e}") from None
