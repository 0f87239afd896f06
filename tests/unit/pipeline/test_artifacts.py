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


# ---------------------------------------------------------------- each table is loaded for what made it


def swap_tables(a: str, b: str) -> Callable[[dict[str, Any]], None]:
    """Column ``a``'s vocabulary entry points at ``b``'s table and ``b``'s at ``a``'s."""

    def edit(manifest: dict[str, Any]) -> None:
        tables = manifest["ops"][4]["tables"]
        tables[a], tables[b] = tables[b], tables[a]

    return edit


def copied(art: Path, d: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of ``art`` in ``d`` whose pipeline.json is edited by ``edit``."""
    shutil.copytree(art, d)
    manifest = json.loads((d / "pipeline.json").read_text())
    edit(manifest)
    (d / "pipeline.json").write_text(json.dumps(manifest))
    return d


def test_each_table_records_the_op_column_and_parameters_that_made_it(fitted):
    _, art = fitted
    params = {"freq_threshold": 3, "max_size": None, "oov_buckets": 1}
    for c in CATS:
        metadata = pq.read_schema(art / "04-Categorify" / f"{c}.parquet").metadata
        assert json.loads(metadata[b"etl.made_by"]) == {"op": "Categorify", "column": c, "params": params}
        assert b"nulls" in metadata  # the table's own metadata is kept


def test_tables_of_two_columns_swapped_are_refused_naming_the_file(fitted, tmp_path):
    """Both are valid vocabularies (each passes every check on its contents): only the record tells them apart."""
    _, art = fitted
    d = copied(art, tmp_path / "swapped", swap_tables("C3", "C4"))
    message = rf"^{d / '04-Categorify/C4.parquet'}: table of ops\[4\] \(Categorify\) 'C3': made by another pipeline: "
    message += r"column 'C4' \(this pipeline: 'C3'\)$"
    with pytest.raises(ArtifactError, match=message):
        Pipeline.load(d)


def test_a_table_made_with_other_parameters_is_refused(fitted, tmp_path):
    """The pipeline document says freq_threshold 2; the tables were made with 3 (their counts pass the check of 2)."""
    _, art = fitted

    def lower_threshold(manifest: dict[str, Any]) -> None:
        manifest["pipeline"]["ops"][4]["freq_threshold"] = 2

    d = copied(art, tmp_path / "other", lower_threshold)
    message = r"C1\.parquet: table of ops\[4\] \(Categorify\) 'C1': made by another pipeline: freq_threshold 3 \(this pipeline: 2\)$"
    with pytest.raises(ArtifactError, match=message):
        Pipeline.load(d)


def test_tables_without_a_record_written_by_earlier_versions_still_load(fitted, tmp_path, criteo):
    """They cannot be checked: valid contents load (and give the same ids), as before tables carried records."""
    pipe, art = fitted
    d = tmp_path / "old"
    shutil.copytree(art, d)
    for p in (d / "04-Categorify").iterdir():
        table = pq.read_table(p)
        pq.write_table(table.replace_schema_metadata({k: v for k, v in table.schema.metadata.items() if k != b"etl.made_by"}), p)
        assert b"etl.made_by" not in pq.read_schema(p).metadata
    loaded = Pipeline.load(d)
    for a, b in zip(transform_file(pipe, criteo[0][0]), transform_file(loaded, criteo[0][0])):
        assert pipe.to_arrow(a.batch).equals(loaded.to_arrow(b.batch))
    loaded.save(tmp_path / "resaved")  # saved again, they carry their record
    assert (tmp_path / "resaved/04-Categorify/C3.parquet").read_bytes() == (art / "04-Categorify/C3.parquet").read_bytes()


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
    copied(art, d, edit)
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
