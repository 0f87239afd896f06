"""Artifacts: the fitted state of a pipeline on disk, and the check that artifacts belong to a pipeline.

An artifacts directory holds ``pipeline.json`` — format name and version, the pipeline and schema documents, each
op's fitted JSON state, the output columns and their cardinalities — plus ``<op index>-<op>/<table>.parquet``
for fitted tables (vocabularies), each with the record of the op, column and parameters that made it in its schema
metadata (``etl.pipeline.made_by``), so that a table given to another column or op (two table paths of
``pipeline.json`` swapped) is refused. A pipeline with ops of the user's own modules (``MODULE:CLASS``,
``etl.ops.user``) also records ``op_directory``, the directory of the pipeline file it was read from, where loading
looks for those modules after the Python path (loading imports them: it runs their code). Tables written before
they carried a record load unchecked. Loading never unpickles anything.

The state of a loader's streaming states (online vocabularies) is saved apart, in a directory of its own
(``etl.pipeline.saved_streams``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from etl.errors import ArtifactError, SpecError
from etl.ids import DESCRIPTION as ID_ENCODING
from etl.io.documents import parse_document
from etl.io.files import atomic_write_bytes, atomic_write_parquet, check_no_linked_directories
from etl.io.fs import Location, Url, arrow_source, is_within, location
from etl.ops.base import InvalidState, made_by
from etl.ops.user import is_user_op
from etl.pipeline.made_by import check_record, stamped, table_record
from etl.schema import parse_schema, schema_to_dict

if TYPE_CHECKING:
    from etl.pipeline.core import Backend, Pipeline

ARTIFACT_FORMAT = "etl-artifacts"
ARTIFACT_VERSION = 1


def save(pipeline: Pipeline, directory: str | Location) -> None:
    """Write the fitted state of ``pipeline``: ``pipeline.json`` plus one Parquet file per fitted table, with its
    record (atomic per file). A NaN or infinite number in the JSON state raises ``ArtifactError`` (JSON never
    holds them); a directory under ``directory`` that is a symbolic link raises ``OutputError`` before anything is
    written (``etl.io.files.check_no_linked_directories``).

    The tables are written without dictionary encoding: they hold mostly distinct values (a vocabulary's keys,
    texts and ids), which Parquet's dictionary pages only fall back from, at twice the cost of the plain write and
    with larger files."""
    if not pipeline.is_fitted:
        raise ArtifactError("cannot save an unfitted pipeline")
    d = location(directory)
    check_no_linked_directories(d)
    d.mkdir(parents=True, exist_ok=True)
    ops_doc = []
    for i, op in enumerate(pipeline.ops):
        doc, tables = op.state()
        names = {}
        for name, table in tables.items():
            rel = f"{i:02d}-{op.name}/{name}.parquet"
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_parquet(stamped(table, made_by(op.name, name, op.fitted_params())), d / rel, use_dictionary=False)
            names[name] = rel
        ops_doc.append({"op": op.name, "state": doc, "tables": names})
    manifest = {
        "format": ARTIFACT_FORMAT,
        "version": ARTIFACT_VERSION,
        "pipeline": pipeline.doc,
        "schema": schema_to_dict(pipeline.schema),
        "output_columns": pipeline.output_columns,
        "cardinalities": pipeline.cardinalities(),
        "id_encoding": ID_ENCODING,
        "ops": ops_doc,
    }
    if pipeline.op_directory is not None and any(is_user_op(str(entry["op"])) for entry in pipeline.doc["ops"]):
        manifest["op_directory"] = str(pipeline.op_directory)
    try:
        text = json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False)
    except ValueError as e:
        raise ArtifactError(f"{d / 'pipeline.json'}: the fitted state holds a NaN or infinite number: {e}") from None
    atomic_write_bytes(d / "pipeline.json", text.encode())


def load(directory: str | Location, xp: Backend, build: type[Pipeline]) -> Pipeline:
    """Rebuild a fitted pipeline (of class ``build``, with backend ``xp``) from artifacts written by ``save``.

    Raises ``ArtifactError`` naming the file (and the field of ``pipeline.json``) when the directory holds no
    artifacts, artifacts of another format version, a malformed ``pipeline.json``, a table path that is not a
    relative path inside the directory, a table whose record names another op, column or parameters than the
    entry it is read for, or files that cannot be read or hold an invalid fitted state. A table without a record
    (written by an earlier version) cannot be checked so: it loads when its contents are valid."""
    d = location(directory)
    path = d / "pipeline.json"
    manifest = read_manifest(d)
    try:
        schema = parse_schema(_field(manifest, "schema", dict, path), str(path))
        op_directory = _field(manifest, "op_directory", str, path) if "op_directory" in manifest else None
        pipe = build(_field(manifest, "pipeline", dict, path), schema, str(path), xp, op_directory=op_directory and Path(op_directory))
    except SpecError as e:
        raise ArtifactError(str(e)) from None
    entries = _field(manifest, "ops", list, path)
    if len(entries) != len(pipe.ops):
        raise ArtifactError(f"{path}: field 'ops': {len(entries)} entries, the pipeline has {len(pipe.ops)} ops")
    for i, (op, entry) in enumerate(zip(pipe.ops, entries)):
        where = f"ops[{i}]"
        if not isinstance(entry, dict) or entry.get("op") != op.name:
            raise ArtifactError(f"{path}: field '{where}': expected the state of op {op.name}")
        state = _field(entry, "state", dict, path, where)
        rels = _field(entry, "tables", dict, path, where)
        tables = {name: read_table(d, rel, f"{where}.tables.{name}") for name, rel in rels.items()}
        for name, table in tables.items():
            _check_made_by(table, made_by(op.name, name, op.fitted_params()), d / rels[name], f"{where} ({op.name}) '{name}'")
        try:
            op.load_state(state, tables)
        except (KeyError, TypeError, ValueError) as e:
            at_fault = d / rels[e.table] if isinstance(e, InvalidState) and e.table in rels else path
            raise ArtifactError(f"{at_fault}: state of {where} ({op.name}): {e}") from None
    pipe.split_spec = None  # recorded in its document: the run that fitted it resolved it
    return pipe


def read_manifest(d: Location) -> dict[str, Any]:
    """The parsed ``pipeline.json`` of ``d``: a JSON object of this format and version (its fields are checked by
    ``load``, as it reads them)."""
    path = d / "pipeline.json"
    try:
        manifest = parse_document(path.read_bytes())
    except FileNotFoundError:
        raise ArtifactError(f"{d}: no pipeline.json (not an artifacts directory)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path}: cannot read: {e}") from None
    except ValueError as e:  # json.JSONDecodeError, nested too deeply
        raise ArtifactError(f"{path}: invalid JSON: {e}") from None
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{path}: field '<root>': expected a JSON object, got {type(manifest).__name__}")
    if manifest.get("format") != ARTIFACT_FORMAT or manifest.get("version") != ARTIFACT_VERSION:
        found = f"{manifest.get('format')!r} version {manifest.get('version')!r}"
        raise ArtifactError(f"{d}: artifacts format {found}, expected {ARTIFACT_FORMAT!r} version {ARTIFACT_VERSION}")
    return manifest


def _field(doc: dict[str, Any], key: str, kind: type, path: Location, where: str = "") -> Any:
    """``doc[key]``, which must be of type ``kind``; ``where`` prefixes the field name in the error."""
    name = f"{where}.{key}" if where else key
    if key not in doc:
        raise ArtifactError(f"{path}: field '{name}': missing")
    if not isinstance(doc[key], kind):
        raise ArtifactError(f"{path}: field '{name}': expected a {kind.__name__}, got {type(doc[key]).__name__}")
    return doc[key]


def _check_made_by(table: pa.Table, mine: dict[str, Any], path: Location, what: str) -> None:
    """``ArtifactError`` naming ``path`` unless ``table`` has no record (an earlier version's) or the record
    ``mine``."""
    saved = table_record(table)
    if saved is not None:
        check_record(saved, mine, lambda problem: ArtifactError(f"{path}: table of {what}: {problem}"))


def read_table(d: Location, rel: Any, field: str, doc: str = "pipeline.json") -> pa.Table:
    """Read the table at ``rel`` (field ``field`` of the JSON file ``doc`` in ``d``), which must be a relative path
    resolving (symbolic links followed) inside ``d`` (in object storage: a relative key without ``..``)."""
    if not isinstance(rel, str) or not rel or Path(rel).is_absolute():
        raise ArtifactError(f"{d / doc}: field '{field}': expected a relative path, got {rel!r}")
    target = d / rel
    if ".." in Path(rel).parts if isinstance(d, Url) else not is_within(target.resolve(), d.resolve()):
        raise ArtifactError(f"{d / doc}: field '{field}': table path {rel!r} resolves outside {d}: tables must lie in the directory of {doc}")
    source, filesystem = arrow_source(target)
    try:  # ParquetFile, not pq.read_table: that one imports pyarrow.dataset, and pandas with it (half a second)
        with pq.ParquetFile(source, filesystem=filesystem) as f:
            return f.read()
    except (OSError, pa.ArrowException) as e:
        raise ArtifactError(f"{target}: cannot read: {e}") from None


def check_match(fitted: Pipeline, spec: Pipeline, artifacts: str | Location) -> None:
    """Raise ``ArtifactError`` unless ``fitted`` (loaded from ``artifacts``) was fitted with the pipeline document
    and the schema columns of ``spec``. Their ``split`` sections are not compared: a split says which rows the
    statistics were fitted on (the artifacts record it), not what the ops do."""
    if _without_split(fitted.doc) != _without_split(spec.doc) or fitted.schema.columns != spec.schema.columns:
        raise ArtifactError(f"{artifacts}: these artifacts were fitted with another pipeline or schema than {spec.path}")


def _without_split(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "split"}
