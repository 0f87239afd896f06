"""Human-readable descriptions of raw shard directories, processed outputs and artifacts (``etl inspect``)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from etl.errors import ArtifactError
from etl.io.fs import Location
from etl.io.parquet import list_shards, read_footer
from etl.io.processed import SPLITS, describe_stage, is_processed, open_processed
from etl.pipeline.artifacts import read_manifest


def describe(path: Location) -> str:
    """Describe ``path`` (local or an object-storage URL): an artifacts directory (pipeline.json), a processed
    output (manifest.json), the splits of a split run (``train``, ``valid``, ``test``) or Parquet."""
    if (path / "pipeline.json").is_file():
        return describe_artifacts(path)
    if is_processed(path):
        return describe_processed(path)
    splits = [path / s for s in SPLITS if is_processed(path / s)]
    if splits:  # the output directory of a split run (etl.preprocess.split): its splits, each a processed output
        return "\n\n".join(describe_processed(s) for s in splits)
    return describe_parquet(list_shards(path))


def describe_artifacts(path: Location) -> str:
    """The format, ops, vocabulary sizes and cardinalities recorded in ``path``'s pipeline.json (read as
    ``etl.pipeline.artifacts`` reads it; a document of another shape is an ``ArtifactError`` naming it)."""
    doc = read_manifest(path)
    try:
        return _describe_artifacts(path, doc)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise ArtifactError(f"{path / 'pipeline.json'}: not a pipeline.json of this format: {type(e).__name__}: {e}") from None


def _describe_artifacts(path: Location, doc: dict[str, Any]) -> str:
    lines = [
        f"artifacts: {path}",
        f"format: {doc.get('format')} v{doc.get('version')}",
        f"pipeline: {doc.get('pipeline', {}).get('name')}   schema: {doc.get('schema', {}).get('name')}",
        f"id encoding: {doc.get('id_encoding')}",
        "ops: " + ", ".join(o["op"] for o in doc.get("ops", [])),
    ]
    for o in doc.get("pipeline", {}).get("ops", []):
        if isinstance(o, dict) and o.get("op") == "Groupby":  # the last op; no fitted state (etl.pipeline.groupby)
            within = f" sorted by {', '.join(o.get('sort_by', []))}" if o.get("sort_by") else ""
            lines.append(f"Groupby: one row per group of {', '.join(o.get('by', []))}{within}: " + ", ".join(doc.get("output_columns", [])))
    columns = [c.get("name") for c in doc.get("schema", {}).get("columns", [])]
    order = {name: i for i, name in enumerate(columns + doc.get("output_columns", []))}
    for i, o in enumerate(doc.get("ops", [])):
        sizes = o.get("state", {}).get("sizes")
        if sizes:
            names = sorted(sizes, key=lambda c: (order.get(c, len(order)), c))
            shown = ", ".join(f"{k}={sizes[k]:,}" for k in names)
            lines.append(f"{o['op']} ops[{i}] ({_column_range(names, columns)}) vocabulary sizes: {shown}")
    for i, o in enumerate(doc.get("ops", [])):
        folds = o.get("state", {}).get("folds")
        if isinstance(folds, dict):  # TargetEncode's statistics (etl.ops.target_state)
            for c, f in folds.items():
                n, total = sum(f["count"]), sum(f["sum"])
                mean = f", mean target {total / n:.6g}" if n else ""
                lines.append(f"{o['op']} ops[{i}] {c}: {n:,} rows with a target in {len(f['count'])} folds{mean}")
    for i, o in enumerate(doc.get("ops", [])):
        warnings = o.get("state", {}).get("warnings")
        if isinstance(warnings, dict):  # what the fit found doubtful (etl.ops.base.Op.fit_warnings)
            lines += [f"warning: {o['op']} ops[{i}]: column '{c}': {w}" for c, w in warnings.items()]
    cards = doc.get("cardinalities", {})
    if cards:
        names = sorted(cards, key=lambda c: (order.get(c, len(order)), c))
        lines.append("cardinalities (embedding rows): " + ", ".join(f"{k}={cards[k]:,}" for k in names))
    return "\n".join(lines)


def _column_range(names: list[str], columns: list[str]) -> str:
    """``names`` as ``first..last`` when they are three or more consecutive schema ``columns``, else listed."""
    if len(names) >= 3 and names[0] in columns:
        start = columns.index(names[0])
        if columns[start : start + len(names)] == names:
            return f"{names[0]}..{names[-1]}"
    return ", ".join(names)


def describe_processed(path: Location) -> str:
    """Describe a processed output, also one whose run is incomplete (described as partial)."""
    out = open_processed(path, allow_partial=True)
    m, t = out.manifest, out.manifest.totals
    state = "True" if m.complete else f"False (partial: the run stopped after {len(m.files)} file(s))"
    lines = [
        f"processed output: {path}   pipeline: {m.pipeline}   complete: {state}",
        f"files: {len(m.files)}   rows in: {t.rows_in:,}   out: {t.rows_out:,}   quarantined: {t.rows_quarantined:,}",
    ]
    if t.stages is not None:
        shown = [f"{s.stage}: {s.rows_in:,} in, {s.rows_out:,} out" if s.groups_dropped is None else describe_stage(s, t.rows_out) for s in t.stages]
        lines.append(f"stages: {t.rows_removed:,} rows removed   " + "   ".join(shown))
    if m.training is not None:
        which = "training rows (out-of-fold target encodings)" if m.training else "other rows (target encodings of the full statistics)"
        lines.append(f"rows: {which}")
    if m.split is not None:  # one split of a split run (etl.preprocess.split)
        lines.append(f"split: {m.split.role}: {m.split.rows:,} rows ({m.split.rule})")
        if m.split.unseen:
            lines.append("never seen in train: " + ", ".join(f"{u.column} {u.rows:,} rows ({u.distinct:,} distinct)" for u in m.split.unseen))
    if out.parts:
        lines.append(describe_parquet(out.parts))
    if (out.artifacts / "pipeline.json").is_file():
        lines.append(describe_artifacts(out.artifacts))
    return "\n".join(lines)


def describe_parquet(files: list[Location]) -> str:
    rows = groups = 0
    schema: pa.Schema | None = None
    nulls: dict[str, int] = {}
    for f in files:
        meta = read_footer(f)
        rows += meta.num_rows
        groups += meta.num_row_groups
        schema = schema or meta.schema.to_arrow_schema()
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            for c in range(rg.num_columns):
                col = rg.column(c)
                if col.statistics is not None and col.statistics.has_null_count:
                    nulls[col.path_in_schema] = nulls.get(col.path_in_schema, 0) + col.statistics.null_count
    lines = [f"parquet: {len(files)} file(s), {rows:,} rows, {groups} row groups"]
    for field in schema or []:
        n = nulls.get(field.name)
        lines.append(f"  {field.name}: {field.type}" + (f"   nulls {n:,} ({n / rows:.1%})" if n and rows else ""))
    return "\n".join(lines)
