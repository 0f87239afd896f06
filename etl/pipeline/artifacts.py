"""Artifacts: the fitted state of a pipeline on disk, and the check that artifacts belong to a pipeline.

An artifacts directory holds ``pipeline.json`` — format name and version, the pipeline and schema documents, each
op's fitted JSON state, the output columns and their cardinalities — plus ``<op index>-<op>/<table>.parquet``
for fitted tables (vocabularies). Loading never unpickles anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from etl.errors import ArtifactError
from etl.ids import DESCRIPTION as ID_ENCODING
from etl.io.files import atomic_write_bytes, atomic_write_parquet
from etl.schema import parse_schema, schema_to_dict

if TYPE_CHECKING:
    from etl.pipeline.core import Backend, Pipeline

ARTIFACT_FORMAT = "etl-artifacts"
ARTIFACT_VERSION = 1


def save(pipeline: Pipeline, directory: str | Path) -> None:
    """Write the fitted state of ``pipeline``: ``pipeline.json`` plus one Parquet file per fitted table (atomic
    per file)."""
    if not pipeline.is_fitted:
        raise ArtifactError("cannot save an unfitted pipeline")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ops_doc = []
    for i, op in enumerate(pipeline.ops):
        doc, tables = op.state()
        names = {}
        for name, table in tables.items():
            rel = f"{i:02d}-{op.name}/{name}.parquet"
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_parquet(table, d / rel)
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
    atomic_write_bytes(d / "pipeline.json", json.dumps(manifest, indent=1, sort_keys=True).encode())


def load(directory: str | Path, xp: Backend, build: type[Pipeline]) -> Pipeline:
    """Rebuild a fitted pipeline (of class ``build``, with backend ``xp``) from artifacts written by ``save``.
    Raises ``ArtifactError`` when the directory holds no artifacts, artifacts of another format version, or files
    that cannot be read."""
    d = Path(directory)
    try:
        manifest = json.loads((d / "pipeline.json").read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{d}: no pipeline.json (not an artifacts directory)") from None
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{d / 'pipeline.json'}: invalid JSON: {e}") from None
    if manifest.get("format") != ARTIFACT_FORMAT or manifest.get("version") != ARTIFACT_VERSION:
        found = f"{manifest.get('format')!r} version {manifest.get('version')!r}"
        raise ArtifactError(f"{d}: artifacts format {found}, expected {ARTIFACT_FORMAT!r} version {ARTIFACT_VERSION}")
    schema = parse_schema(manifest["schema"], str(d / "pipeline.json"))
    pipe = build(manifest["pipeline"], schema, str(d / "pipeline.json"), xp)
    for op, entry in zip(pipe.ops, manifest["ops"]):
        tables = {}
        for name, rel in entry["tables"].items():
            try:
                tables[name] = pq.read_table(d / rel)
            except (OSError, pa.ArrowException) as e:
                raise ArtifactError(f"{d / rel}: cannot read: {e}") from None
        try:
            op.load_state(entry["state"], tables)
        except (KeyError, ValueError) as e:
            raise ArtifactError(f"{d}: state of {op.name}: {e}") from None
    return pipe


def check_match(fitted: Pipeline, spec: Pipeline, artifacts: str | Path) -> None:
    """Raise ``ArtifactError`` unless ``fitted`` (loaded from ``artifacts``) was fitted with the pipeline document
    and the schema columns of ``spec``."""
    if fitted.doc != spec.doc or fitted.schema.columns != spec.schema.columns:
        raise ArtifactError(f"{artifacts}: these artifacts were fitted with another pipeline or schema than {spec.path}")
