"""Artifacts: round trip, files and format, version and error checks, and the check that artifacts match the
pipeline they are used with (by preprocess and by the loader)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl import Loader
from etl.errors import ArtifactError
from etl.io.parquet import batch_from_arrow
from etl.pipeline import Pipeline, check_match
from etl.preprocess import preprocess
from tests.unit.pipeline.conftest import CATS, PIPELINES, transform_file


def test_artifacts_round_trip(fitted, criteo):
    pipe, art = fitted
    loaded = Pipeline.load(art)
    assert loaded.is_fitted and loaded.output_columns == pipe.output_columns
    assert loaded.cardinalities() == pipe.cardinalities()
    assert loaded.output_schema() == pipe.output_schema()
    for path in criteo[0][:2]:
        for a, b in zip(transform_file(pipe, path), transform_file(loaded, path)):
            assert pipe.to_arrow(a.batch).equals(loaded.to_arrow(b.batch))


def test_artifact_files(fitted, criteo):
    pipe, art = fitted
    files = sorted(str(p.relative_to(art)) for p in art.rglob("*") if p.is_file())
    assert files == sorted(["pipeline.json"] + [f"04-Categorify/{c}.parquet" for c in CATS])
    for c in CATS:
        v = pq.read_table(art / "04-Categorify" / f"{c}.parquet")
        assert v.column_names == ["key", "raw", "count", "id"]
        assert [f.type for f in v.schema] == [pa.uint64(), pa.string(), pa.int64(), pa.int64()]
        assert v.column("id").to_pylist() == list(range(3, 3 + v.num_rows))
        counts = v.column("count").to_pylist()
        assert counts == sorted(counts, reverse=True) and min(counts) >= 3
        chunks = pq.ParquetFile(art / "04-Categorify" / f"{c}.parquet").metadata.row_group(0)
        assert not any("DICTIONARY" in e for i in range(chunks.num_columns) for e in chunks.column(i).encodings)
    manifest = json.loads((art / "pipeline.json").read_text())
    assert manifest["format"] == "etl-artifacts" and manifest["version"] == 1
    assert manifest["output_columns"] == pipe.output_columns
    assert manifest["cardinalities"] == pipe.cardinalities()
    for p in art.rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            assert not data.startswith(b"\x80")  # no pickle stream
            assert b"pickle" not in data.lower()
            assert p.suffix in (".json", ".parquet")


@pytest.mark.parametrize("field,value", [("version", 2), ("version", "1"), ("format", "other")])
def test_artifact_version_check(fitted, tmp_path, field, value):
    _, art = fitted
    d = tmp_path / "a"
    shutil.copytree(art, d)
    m = json.loads((d / "pipeline.json").read_text())
    m[field] = value
    (d / "pipeline.json").write_text(json.dumps(m))
    with pytest.raises(ArtifactError, match="version"):
        Pipeline.load(d)


def test_artifact_errors(fitted, tmp_path):
    _, art = fitted
    with pytest.raises(ArtifactError, match="pipeline.json"):
        Pipeline.load(tmp_path)
    d = tmp_path / "bad"
    shutil.copytree(art, d)
    (d / "pipeline.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="invalid JSON"):
        Pipeline.load(d)
    d2 = tmp_path / "missing_vocab"
    shutil.copytree(art, d2)
    (d2 / "04-Categorify" / "C7.parquet").unlink()
    with pytest.raises(ArtifactError, match="C7"):
        Pipeline.load(d2)
    unfitted = Pipeline.from_file(PIPELINES / "criteo.yaml")
    with pytest.raises(ArtifactError):
        unfitted.save(tmp_path / "x")
    with pytest.raises(ArtifactError, match="not fitted"):
        unfitted.transform(batch_from_arrow(pq.read_table(next(art.parent.parent.glob("criteo*/part-0.parquet"))), unfitted.schema))


# ---------------------------------------------------------------- artifacts match the pipeline they are used with


def another_encoding(manifest: dict[str, Any]) -> None:
    """The embedded schema reads C1 as plain strings instead of 8 hex digits (the pipeline document is unchanged)."""
    c1 = next(c for c in manifest["schema"]["columns"] if c["name"] == "C1")
    assert c1["encoding"] == "hex"
    c1["encoding"] = "string"
    del c1["width"]


def another_pipeline(manifest: dict[str, Any]) -> None:
    """The embedded pipeline document has another name (the schema is unchanged)."""
    manifest["pipeline"]["name"] = "another"


MISMATCHES: dict[str, Callable[[dict[str, Any]], None]] = {"schema": another_encoding, "pipeline": another_pipeline}


def edited_artifacts(art: Path, d: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    shutil.copytree(art, d)
    manifest = json.loads((d / "pipeline.json").read_text())
    edit(manifest)
    (d / "pipeline.json").write_text(json.dumps(manifest))
    assert Pipeline.load(d).is_fitted  # valid artifacts: only the match check can refuse them
    return d


def test_check_match(fitted, tmp_path):
    _, art = fitted
    spec = Pipeline.from_file(PIPELINES / "criteo.yaml")
    check_match(Pipeline.load(art), spec, art)
    for what, edit in sorted(MISMATCHES.items()):
        d = edited_artifacts(art, tmp_path / what, edit)
        with pytest.raises(ArtifactError, match="another pipeline or schema") as ei:
            check_match(Pipeline.load(d), spec, d)
        assert str(d) in str(ei.value) and str(spec.path) in str(ei.value)


@pytest.mark.parametrize("what", sorted(MISMATCHES))
def test_preprocess_refuses_artifacts_of_another_pipeline_or_schema(fitted, criteo, tmp_path, what):
    _, art = fitted
    paths = criteo[0][:1]
    spec = Pipeline.from_file(PIPELINES / "criteo.yaml")
    preprocess(spec, paths, tmp_path / "ok", artifacts=art)  # the artifacts of this pipeline are used
    d = edited_artifacts(art, tmp_path / "art", MISMATCHES[what])
    with pytest.raises(ArtifactError, match="another pipeline or schema"):
        preprocess(spec, paths, tmp_path / "out", artifacts=d)
    assert not (tmp_path / "out" / "artifacts").exists()


@pytest.mark.parametrize("what", sorted(MISMATCHES))
def test_loader_refuses_artifacts_of_another_pipeline_or_schema(fitted, criteo, tmp_path, what):
    _, art = fitted
    paths = criteo[0][:1]
    Loader(paths, pipeline=PIPELINES / "criteo.yaml", artifacts=art, batch_size=50)  # the artifacts of this pipeline
    d = edited_artifacts(art, tmp_path / "art", MISMATCHES[what])
    with pytest.raises(ArtifactError, match="another pipeline or schema"):
        Loader(paths, pipeline=PIPELINES / "criteo.yaml", artifacts=d, batch_size=50)
