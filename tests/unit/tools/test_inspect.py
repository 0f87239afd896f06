"""etl.tools.inspect.describe of raw Parquet, a processed output and an artifacts directory: the key facts appear; a
manifest or file that cannot be read is a typed error naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.errors import ArtifactError, InputError
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.tools.inspect import describe
from tests.conftest import REPO, criteo_table

SIZES = [250, 130]


@pytest.fixture(scope="module")
def tables() -> list[pa.Table]:
    return [criteo_table(n, seed=i) for i, n in enumerate(SIZES)]


@pytest.fixture(scope="module")
def raw(tmp_path_factory, tables: list[pa.Table]) -> Path:
    d = tmp_path_factory.mktemp("raw")
    for i, t in enumerate(tables):
        pq.write_table(t, d / f"{i}.parquet", row_group_size=100)
    return d


@pytest.fixture(scope="module")
def processed(tmp_path_factory, raw: Path) -> Path:
    out = tmp_path_factory.mktemp("processed")
    preprocess(Pipeline.from_file(REPO / "pipelines/criteo.yaml"), sorted(raw.glob("*.parquet")), out)
    return out


def test_raw_parquet(raw: Path, tables: list[pa.Table]) -> None:
    text = describe(raw)
    lines = text.splitlines()
    assert lines[0] == "parquet: 2 file(s), 380 rows, 5 row groups"
    assert "  label: int64" in lines
    for name in ("I1", "C26"):
        nulls = sum(t.column(name).null_count for t in tables)
        kind = "int64" if name.startswith("I") else "string"
        assert f"  {name}: {kind}   nulls {nulls:,} ({nulls / 380:.1%})" in lines
    assert describe(raw / "0.parquet").startswith("parquet: 1 file(s), 250 rows, 3 row groups")


def test_processed_output(processed: Path) -> None:
    text = describe(processed)
    lines = text.splitlines()
    assert lines[0] == f"processed output: {processed}   pipeline: criteo   complete: True"
    assert lines[1] == "files: 2   rows in: 380   out: 380   quarantined: 0"
    assert lines[2] == "parquet: 2 file(s), 380 rows, 5 row groups"
    assert "  label: float" in lines and "  I13: float" in lines and "  C1: int32" in lines
    assert f"artifacts: {processed / 'artifacts'}" in lines  # its artifacts are described too


def test_artifacts(processed: Path) -> None:
    art = processed / "artifacts"
    lines = describe(art).splitlines()
    assert lines[:3] == [f"artifacts: {art}", "format: etl-artifacts v1", "pipeline: criteo   schema: criteo"]
    assert "ops: FillMissing, Clamp, Log1p, Decode, Categorify" in lines
    cards = Pipeline.load(art).cardinalities()
    cards_line = next(line for line in lines if line.startswith("cardinalities (embedding rows): "))
    assert f"C1={cards['C1']:,}" in cards_line and f"C26={cards['C26']:,}" in cards_line
    sizes_line = next(line for line in lines if line.startswith("Categorify ops[4] (C1..C26) vocabulary sizes: "))
    sizes = Pipeline.load(art).ops[4].state()[0]["sizes"]
    assert sizes_line.endswith(": " + ", ".join(f"C{i}={sizes[f'C{i}']:,}" for i in range(1, 27)))  # schema order
    assert cards_line.endswith(": " + ", ".join(f"C{i}={cards[f'C{i}']:,}" for i in range(1, 27)))


def test_artifacts_of_several_vocabulary_ops_are_told_apart(tmp_path: Path) -> None:
    """MovieLens fits two Categorify ops: each line names its op index and columns."""
    raw = tmp_path / "raw"
    raw.mkdir()
    pq.write_table(pa.table({"userId": [1, 2, 2], "movieId": [10, 10, 11], "rating": [4.0, 3.5, 5.0],
                             "timestamp": [100, 200, 300], "genres": [["A", "B"], ["B"], ["C", "A"]]}), raw / "0.parquet")  # fmt: skip
    p = Pipeline.from_file(REPO / "pipelines/movielens.yaml")
    p.fit([raw / "0.parquet"])
    p.save(tmp_path / "art")
    lines = describe(tmp_path / "art").splitlines()
    assert "Categorify ops[1] (userId, movieId) vocabulary sizes: userId=2, movieId=2" in lines
    assert "Categorify ops[3] (genres) vocabulary sizes: genres=3" in lines


def test_target_encoding_is_described(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    pq.write_table(pa.table({"userId": [1, 2, 2, 3], "movieId": [10, 10, 11, 10], "rating": [4.0, 3.5, 5.0, 1.0],
                             "timestamp": [100, 200, 300, 400], "genres": [["A"], ["B"], ["C", "A"], None]}), raw / "0.parquet")  # fmt: skip
    preprocess(Pipeline.from_file(REPO / "pipelines/movielens_target.yaml"), [raw / "0.parquet"], tmp_path / "out")
    lines = describe(tmp_path / "out").splitlines()
    assert "rows: training rows (out-of-fold target encodings)" in lines
    assert "TargetEncode ops[5] te_userId: 4 rows with a target in 5 folds, mean target 3.375" in lines
    assert "TargetEncode ops[5] te_movieId: 4 rows with a target in 5 folds, mean target 3.375" in lines
    assert "rows:" not in describe(tmp_path / "out" / "artifacts")


def test_incomplete_processed_output(processed: Path, tmp_path: Path) -> None:
    doc = json.loads((processed / "manifest.json").read_text())
    doc["complete"], doc["files"] = False, doc["files"][:1]
    doc["totals"] = {k: doc["files"][0][k] for k in ("rows_in", "rows_out", "rows_quarantined")}
    (tmp_path / "part-00000.parquet").write_bytes((processed / "part-00000.parquet").read_bytes())
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    lines = describe(tmp_path).splitlines()
    assert lines[0].endswith("complete: False (partial: the run stopped after 1 file(s))")
    assert lines[1].startswith("files: 1   rows in: 250")
    assert lines[2] == "parquet: 1 file(s), 250 rows, 3 row groups"
    assert not any(line.startswith("artifacts:") for line in lines)  # none in this directory


def test_unreadable_inputs_are_typed_errors(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text('{"format": "etl-manifest", "version": 1, "files": []}')
    with pytest.raises(InputError, match="manifest.json: manifest field 'totals' is missing"):
        describe(tmp_path)
    (tmp_path / "manifest.json").write_text("{oops")
    with pytest.raises(InputError, match="not a JSON manifest"):
        describe(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputError, match="not a readable Parquet file"):
        describe(bad)
    for text in ("{oops", "[" * 100_000 + "]" * 100_000):
        (bad / "pipeline.json").write_text(text)
        with pytest.raises(ArtifactError, match="pipeline.json: invalid JSON"):
            describe(bad)
    (bad / "pipeline.json").write_text("[]")
    with pytest.raises(ArtifactError, match="pipeline.json: field '<root>': expected a JSON object, got list"):
        describe(bad)
    (bad / "pipeline.json").write_text('{"format": "etl-artifacts", "version": 1, "ops": 5}')
    with pytest.raises(ArtifactError, match="pipeline.json: not a pipeline.json of this format"):
        describe(bad)
