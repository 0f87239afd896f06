"""Tampered artifacts are refused at the door (``Pipeline.load``) with an ``ArtifactError`` naming the file and the
field: a malformed ``pipeline.json``, table paths leaving the artifacts directory, invalid vocabulary tables,
invalid fitted numbers, and (through ``etl preprocess``) tables swapped between columns and a ``pipeline.json``
nested too deeply to parse."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.errors import ArtifactError
from etl.pipeline import Pipeline
from etl.schema import parse_schema
from tests.conftest import REPO, criteo_table

SCHEMA = {
    "name": "tiny",
    "columns": [
        {"name": "label", "role": "label", "dtype": "int64"},
        {"name": "I1", "role": "dense", "dtype": "int64"},
        {"name": "C1", "role": "categorical", "dtype": "string", "encoding": "hex", "width": 8},
    ],
}
OPS = [
    {"op": "FillMissing", "columns": "@dense", "value": 0},
    {"op": "Normalize", "columns": "@dense"},
    {"op": "Decode", "columns": "@categorical"},
    {"op": "Categorify", "columns": "@categorical", "freq_threshold": 2, "oov_buckets": 3},
]
VOCAB = "03-Categorify/C1.parquet"


def tiny_pipeline() -> Pipeline:
    return Pipeline({"name": "tiny", "ops": OPS}, parse_schema(SCHEMA))


@pytest.fixture(scope="module")
def art(tmp_path_factory) -> Path:
    """Artifacts of the tiny pipeline fitted on one shard (C1 vocabulary: 3 keys seen at least twice)."""
    d = tmp_path_factory.mktemp("tiny")
    keys = ["0000000a"] * 4 + ["0000000b"] * 3 + ["0000000c"] * 3 + ["0000000d"] + [None]
    n = len(keys)
    shard = d / "part-0.parquet"
    pq.write_table(pa.table({"label": [i % 2 for i in range(n)], "I1": list(range(n)), "C1": keys}), shard)
    pipe = tiny_pipeline()
    pipe.fit([shard])
    pipe.save(d / "art")
    return d / "art"


def tampered(art: Path, d: Path, edit: Callable[[dict[str, Any]], Any]) -> Path:
    """A copy of ``art`` whose manifest is replaced by ``edit(manifest)`` (or edited in place when it returns None)."""
    shutil.copytree(art, d)
    manifest = json.loads((d / "pipeline.json").read_text())
    result = edit(manifest)
    (d / "pipeline.json").write_text(json.dumps(manifest if result is None else result))
    return d


def test_untampered_artifacts_load(art):
    assert Pipeline.load(art).is_fitted


# ---------------------------------------------------------------- 1. malformed pipeline.json


def _set(path: list[str | int], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(m: dict[str, Any]) -> None:
        for k in path[:-1]:
            m = m[k]
        m[path[-1]] = value

    return edit


def _delete(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda m: m.pop(key) and None


MALFORMED: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "a list": (lambda m: [m], "<root>"),
    "a string": (lambda m: "pipeline", "<root>"),
    "no schema": (_delete("schema"), "schema"),
    "schema a list": (_set(["schema"], []), "schema"),
    "schema invalid": (_set(["schema", "columns"], "x"), "columns"),
    "no pipeline": (_delete("pipeline"), "pipeline"),
    "pipeline a string": (_set(["pipeline"], "criteo"), "pipeline"),
    "pipeline without ops": (lambda m: m["pipeline"].pop("ops") and None, "ops"),
    "no ops": (_delete("ops"), "ops"),
    "ops a mapping": (_set(["ops"], {}), "ops"),
    "one op too few": (lambda m: m["ops"].pop() and None, "ops"),
    "one op too many": (lambda m: m["ops"].append(m["ops"][0]), "ops"),
    "op entry a list": (_set(["ops", 1], []), "ops[1]"),
    "op entry of another op": (_set(["ops", 1, "op"], "Clamp"), "ops[1]"),
    "no state": (lambda m: m["ops"][1].pop("state") and None, "ops[1].state"),
    "state a list": (_set(["ops", 1, "state"], [1]), "ops[1].state"),
    "no tables": (lambda m: m["ops"][3].pop("tables") and None, "ops[3].tables"),
    "tables a list": (_set(["ops", 3, "tables"], ["x"]), "ops[3].tables"),
    "table path a number": (_set(["ops", 3, "tables", "C1"], 3), "ops[3].tables.C1"),
    "Normalize state without mean": (lambda m: m["ops"][1]["state"].pop("mean") and None, "mean"),
    "Categorify without vocabulary": (_set(["ops", 3, "tables"], {}), "C1"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_manifest_is_refused(art, tmp_path, case):
    edit, field = MALFORMED[case]
    d = tampered(art, tmp_path / "a", edit)
    with pytest.raises(ArtifactError) as ei:
        Pipeline.load(d)
    assert "pipeline.json" in str(ei.value) and field in str(ei.value)


def test_manifest_json_null_not_utf8_or_nested_too_deeply_is_refused(art, tmp_path):
    d = tampered(art, tmp_path / "a", lambda m: None)
    for data in (b"null", b"\xff\xfe{}", b"[" * 100_000 + b"]" * 100_000):
        (d / "pipeline.json").write_bytes(data)
        with pytest.raises(ArtifactError, match="pipeline.json"):
            Pipeline.load(d)


# ---------------------------------------------------------------- 2. table paths stay inside the directory


@pytest.mark.parametrize("rel", ["../outside.parquet", "03-Categorify/../../outside.parquet", "ABSOLUTE", ""])
def test_table_path_outside_the_directory_is_refused(art, tmp_path, rel):
    outside = tmp_path / "outside.parquet"
    shutil.copy(art / VOCAB, outside)  # a valid table: only its place refuses it
    if rel == "ABSOLUTE":
        rel = str(outside)
    d = tampered(art, tmp_path / "a", _set(["ops", 3, "tables", "C1"], rel))
    with pytest.raises(ArtifactError, match=r"pipeline.json: field 'ops\[3\].tables.C1'"):
        Pipeline.load(d)


def test_table_symlink_resolving_outside_is_refused(art, tmp_path):
    outside = tmp_path / "outside.parquet"
    shutil.copy(art / VOCAB, outside)
    d = tampered(art, tmp_path / "a", lambda m: None)
    (d / VOCAB).unlink()
    os.symlink(outside, d / VOCAB)
    with pytest.raises(ArtifactError, match="resolves outside"):
        Pipeline.load(d)
    (d / VOCAB).unlink()
    os.symlink("C1-copy.parquet", d / VOCAB)  # a link inside the directory is followed
    shutil.copy(outside, d / "03-Categorify" / "C1-copy.parquet")
    assert Pipeline.load(d).is_fitted


# ---------------------------------------------------------------- 3. vocabulary tables


def _with_column(name: str, values: list[Any] | pa.Array) -> Callable[[pa.Table], pa.Table]:
    def edit(t: pa.Table) -> pa.Table:
        i = t.column_names.index(name)
        return t.set_column(i, name, pa.array(values, t.schema.field(name).type) if isinstance(values, list) else values)

    return edit


# The vocabulary of the fixture: keys 0xa (count 4), 0xb (3), 0xc (3), ids 5, 6, 7 (2 reserved + 3 OOV buckets).
VOCAB_EDITS: dict[str, Callable[[pa.Table], pa.Table]] = {
    "id 2**40": _with_column("id", [5, 6, 2**40]),
    "id 1e6": _with_column("id", [5, 6, 10**6]),
    "id 0": _with_column("id", [0, 6, 7]),
    "id -5": _with_column("id", [5, 6, -5]),
    "ids shifted into the OOV range": _with_column("id", [4, 5, 6]),
    "ids swapped": _with_column("id", [6, 5, 7]),
    "id repeated": _with_column("id", [5, 5, 7]),
    "id missing": _with_column("id", [5, None, 7]),
    "key repeated": _with_column("key", [10, 11, 11]),
    "key repeated at another count": _with_column("key", [11, 10, 11]),  # in count-then-key order, yet twice
    "key missing": _with_column("key", [10, None, 12]),
    "count below freq_threshold": _with_column("count", [4, 3, 1]),
    "count missing": _with_column("count", [4, None, 3]),
    "counts ascending": _with_column("count", [3, 3, 4]),
    "tie not by key ascending": _with_column("key", [10, 12, 11]),
    "id as int32": _with_column("id", pa.array([5, 6, 7], pa.int32())),
    "key as int64": _with_column("key", pa.array([10, 11, 12], pa.int64())),
    "count as float": _with_column("count", pa.array([4.0, 3.0, 3.0])),
    "no raw column": lambda t: t.drop_columns(["raw"]),
    "columns reordered": lambda t: t.select(["id", "key", "raw", "count"]),
    "extra column": lambda t: t.append_column("x", pa.array([1, 2, 3])),
}


def test_fixture_vocabulary(art):
    t = pq.read_table(art / VOCAB)
    assert t.column("key").to_pylist() == [10, 11, 12] and t.column("count").to_pylist() == [4, 3, 3]
    assert t.column("id").to_pylist() == [5, 6, 7]


@pytest.mark.parametrize("case", sorted(VOCAB_EDITS))
def test_invalid_vocabulary_is_refused(art, tmp_path, case):
    d = tampered(art, tmp_path / "a", lambda m: None)
    pq.write_table(VOCAB_EDITS[case](pq.read_table(d / VOCAB)), d / VOCAB)
    with pytest.raises(ArtifactError, match="vocabulary of 'C1'") as ei:
        Pipeline.load(d)
    assert str(d / VOCAB) in str(ei.value)


def test_vocabulary_larger_than_max_size_is_refused(art, tmp_path):
    def smaller_max_size(m: dict[str, Any]) -> None:
        m["pipeline"]["ops"][3]["max_size"] = 2

    d = tampered(art, tmp_path / "a", smaller_max_size)
    with pytest.raises(ArtifactError, match=r"C1.parquet: .*made by another pipeline: max_size None \(this pipeline: 2\)"):
        Pipeline.load(d)
    table = pq.read_table(d / VOCAB)  # as an earlier version wrote it (no record): its contents are checked still
    pq.write_table(table.replace_schema_metadata({k: v for k, v in table.schema.metadata.items() if k != b"etl.made_by"}), d / VOCAB)
    with pytest.raises(ArtifactError, match="more than max_size 2"):
        Pipeline.load(d)


# ---------------------------------------------------------------- 4. Normalize state


NORMALIZE_TEXT = {  # (field, JSON text of the value)
    "std 0": ("std", "0"),
    "std negative": ("std", "-1.5"),
    "std Infinity": ("std", "Infinity"),
    "std 1e999 (inf)": ("std", "1e999"),
    "std NaN": ("std", "NaN"),
    "std a string": ("std", '"2.0"'),
    "std true": ("std", "true"),
    "std null": ("std", "null"),
    "mean -Infinity": ("mean", "-Infinity"),
    "mean NaN": ("mean", "NaN"),
    "mean a string": ("mean", '"inf"'),
    "mean a list": ("mean", "[0.5]"),
}


@pytest.mark.parametrize("case", sorted(NORMALIZE_TEXT))
def test_invalid_normalize_state_is_refused(art, tmp_path, case):
    field, text = NORMALIZE_TEXT[case]
    d = tampered(art, tmp_path / "a", _set(["ops", 1, "state", field, "I1"], "@VALUE@"))
    path = d / "pipeline.json"
    path.write_text(path.read_text().replace('"@VALUE@"', text))
    with pytest.raises(ArtifactError, match=f"pipeline.json: state of ops\\[1\\] \\(Normalize\\): Normalize: {field} of 'I1'"):
        Pipeline.load(d)


# ---------------------------------------------------------------- 5. at the CLI: tables swapped, JSON nested too deeply


def swapped_c3_c4(d: Path) -> Path:
    manifest = json.loads((d / "pipeline.json").read_text())
    tables = manifest["ops"][4]["tables"]
    tables["C3"], tables["C4"] = tables["C4"], tables["C3"]
    (d / "pipeline.json").write_text(json.dumps(manifest))
    return d / tables["C3"]


def nested_too_deeply(d: Path) -> Path:
    (d / "pipeline.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    return d / "pipeline.json"


@pytest.mark.parametrize(("tamper", "problem"), [(swapped_c3_c4, "made by another pipeline: column 'C4'"), (nested_too_deeply, "nested too deeply")])
def test_preprocess_refuses_tampered_artifacts_in_one_line(tmp_path, tamper, problem):
    """The issue's repros: fitted artifacts with C3's and C4's table paths swapped (``etl preprocess`` gave every C3
    row an id <= 2), and a ``pipeline.json`` nested too deeply for the JSON parser (a RecursionError traceback)."""
    raw = tmp_path / "raw"
    raw.mkdir()
    pq.write_table(criteo_table(400, seed=3), raw / "part-00000.parquet")
    pipeline = REPO / "pipelines" / "criteo.yaml"
    fitted = Pipeline.from_file(pipeline)
    fitted.fit([raw / "part-00000.parquet"])
    fitted.save(tmp_path / "art")
    at_fault = tamper(tmp_path / "art")
    command = [sys.executable, "-m", "etl", "preprocess", "--pipeline", str(pipeline), "--input", str(raw), "--artifacts", str(tmp_path / "art"),
               "--out", str(tmp_path / "out"), "--workers", "1"]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(at_fault) in lines[0] and problem in lines[0], result.stderr
