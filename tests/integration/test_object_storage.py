"""Every data path on s3:// (a real S3 API: moto in server mode, see the ``s3`` fixture): convert → fit →
preprocess → inspect through the CLI and the Loader in Python give the same bytes and batches as the same run on
local paths; a missing bucket or key is one line naming the URL, exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from etl.io.fs import Url, location
from etl.io.parquet import list_shards
from etl.io.text import convert
from etl.loader import Loader
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import REPO, run_etl

pytest.importorskip("s3fs")

TEXT = ("dev.csv", "test.csv")  # 800 real Criteo rows
SCHEMA = REPO / "schemas/criteo.yaml"
PIPELINE = REPO / "pipelines/criteo.yaml"
#: manifest fields that name or fingerprint the source file, which differ between a local and an S3 run
SOURCE_FIELDS = ("source", "source_mtime_ns")


def _files(root: Path | Url) -> dict[str, bytes]:
    """Every file under ``root`` (recursively) by its relative name, with its bytes."""
    if isinstance(root, Path):
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".etl.lock"}
    keys = root.fs.find(root.key)
    return {k[len(root.key) + 1 :]: bytes(root.fs.cat_file(k)) for k in sorted(keys)}


def _without_sources(manifest: bytes) -> dict:
    doc = json.loads(manifest)
    for f in doc["files"]:
        for k in SOURCE_FIELDS:
            f.pop(k)
    return doc


def _batches(loader: Loader) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    try:
        return [(b.label.numpy().copy(), b.dense.numpy().copy(), b.sparse.numpy().copy()) for b in loader]
    finally:
        loader.close()


@pytest.fixture(scope="module")
def local_run(criteo_8k: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: the same steps on local paths, through the Python API."""
    root = tmp_path_factory.mktemp("local")
    convert([criteo_8k / f for f in TEXT], load_schema(SCHEMA), root / "raw", rows_per_file=300)
    p = Pipeline.from_file(PIPELINE)
    p.fit(list_shards(root / "raw"))
    p.save(root / "artifacts")
    preprocess(Pipeline.from_file(PIPELINE), list_shards(root / "raw"), root / "out", artifacts=root / "artifacts")
    return root


def test_s3_run_matches_local_run(criteo_8k: Path, local_run: Path, s3: str) -> None:
    text = location(f"{s3}/text")
    assert isinstance(text, Url)
    for name in TEXT:
        text.fs.put_file(str(criteo_8k / name), f"{text.key}/{name}")

    run_etl("convert", f"{s3}/text/*.csv", "--schema", SCHEMA, "--out", f"{s3}/raw", "--rows-per-file", 300)
    run_etl("fit", "--pipeline", PIPELINE, "--input", f"{s3}/raw", "--artifacts", f"{s3}/artifacts")
    run_etl("preprocess", "--pipeline", PIPELINE, "--input", f"{s3}/raw/*.parquet", "--out", f"{s3}/out", "--artifacts", f"{s3}/artifacts")

    raw, artifacts, out = (location(f"{s3}/{d}") for d in ("raw", "artifacts", "out"))
    assert isinstance(raw, Url) and isinstance(artifacts, Url) and isinstance(out, Url)
    assert _files(raw) == _files(local_run / "raw")
    assert len(_files(raw)) == 3
    assert _files(artifacts) == _files(local_run / "artifacts")
    ours, theirs = _files(out), _files(local_run / "out")
    assert sorted(ours) == sorted(theirs)  # outputs, artifacts, manifest; no temporary left behind
    for name in ours:
        if name == "manifest.json":
            assert _without_sources(ours[name]) == _without_sources(theirs[name])
        else:
            assert ours[name] == theirs[name], name
    manifest = json.loads(ours["manifest.json"])
    assert [f["source"] for f in manifest["files"]] == [f"{s3}/raw/part-0000{i}.parquet" for i in range(3)]

    # fit (count tables spilled under the s3:// output) and transform on Dask workers, every path on s3://: the
    # same files, the artifacts fitted on the workers among them
    run_etl("preprocess", "--pipeline", PIPELINE, "--input", f"{s3}/raw", "--out", f"{s3}/out_dask", "--cluster", "local:1")
    dask = _files(location(f"{s3}/out_dask"))
    assert sorted(dask) == sorted(theirs) and "artifacts/pipeline.json" in dask
    assert all(dask[n] == theirs[n] for n in theirs if n != "manifest.json")
    assert _without_sources(dask["manifest.json"]) == _without_sources(theirs["manifest.json"])

    rerun = run_etl("preprocess", "--pipeline", PIPELINE, "--input", f"{s3}/raw", "--out", f"{s3}/out", "--artifacts", f"{s3}/artifacts")
    assert "3 already complete, skipped" in rerun.stdout  # fingerprints from the objects' metadata match

    shown = run_etl("inspect", f"{s3}/out").stdout
    assert f"processed output: {s3}/out" in shown and "rows in: 800" in shown

    s3_batches = _batches(Loader(f"{s3}/out", batch_size=128, shuffle=True, seed=3, num_workers=2))
    local_batches = _batches(Loader(local_run / "out", batch_size=128, shuffle=True, seed=3, num_workers=2))
    assert len(s3_batches) == len(local_batches) == 7
    for a, b in zip(s3_batches, local_batches):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))

    raw_batches = _batches(Loader(f"{s3}/raw", PIPELINE, f"{s3}/artifacts", batch_size=128, num_workers=1))
    assert sum(len(label) for label, _, _ in raw_batches) == 800


def _one_line_error(*args: object) -> str:
    proc = run_etl(*args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    return " ".join(proc.stderr.split())


def test_missing_bucket_and_key_name_the_url(s3: str, criteo_8k: Path) -> None:
    missing = "s3://etl-no-such-bucket/raw"
    assert missing in _one_line_error("fit", "--pipeline", PIPELINE, "--input", missing, "--artifacts", f"{s3}/a")
    assert f"{s3}/nothing" in _one_line_error("inspect", f"{s3}/nothing")
    line = _one_line_error("convert", criteo_8k / "dev.csv", "--schema", SCHEMA, "--out", missing)
    assert "s3://etl-no-such-bucket/raw/" in line and "cannot write" in line


def test_storage_that_cannot_be_reached_is_one_line_naming_the_url(s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = f"{s3}/raw"
    generate(load_schema(SCHEMA), 100, 1, raw)
    fit = ("fit", "--pipeline", PIPELINE, "--input", raw, "--artifacts", tmp_path / "a")
    with monkeypatch.context() as env:  # no credentials anywhere
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            env.delenv(name)
        env.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        env.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        env.setenv("AWS_EC2_METADATA_DISABLED", "true")
        line = _one_line_error(*fit)
        assert line.startswith(f"error: {raw}: cannot access object storage: Unable to locate credentials") and "AWS_ACCESS_KEY_ID" in line
    with monkeypatch.context() as env:  # an endpoint where nothing listens
        env.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
        env.setenv("AWS_MAX_ATTEMPTS", "1")
        line = _one_line_error(*fit)
        assert line.startswith(f"error: {raw}: cannot access object storage: Could not connect to the endpoint URL")
    line = _one_line_error("preprocess", "--pipeline", PIPELINE, "--input", raw, "--out", "s3://etl-no-such-bucket/out")
    assert line.startswith("error: s3://etl-no-such-bucket/out/") and "cannot write" in line


def test_npy_chunks_written_to_and_read_from_a_bucket(local_run: Path, s3: str, tmp_path: Path) -> None:
    """``--format parquet,npy`` into s3:// gives the local run's chunk bytes, and the default loader reads an
    npy-only output there as the local Parquet output's batches."""
    shards, artifacts = list_shards(local_run / "raw"), local_run / "artifacts"
    pipeline = Pipeline.from_file(PIPELINE)
    preprocess(pipeline, shards, tmp_path / "both", artifacts=artifacts, formats=("parquet", "npy"), npy_chunk_rows=128)
    both = location(f"{s3}/both")
    preprocess(pipeline, shards, both, artifacts=artifacts, formats=("parquet", "npy"), npy_chunk_rows=128)
    local = {k: v for k, v in _files(tmp_path / "both").items() if k.startswith("npy/")}
    assert len(local) == 3 * (3 + 3 + 2) and {k: v for k, v in _files(both).items() if k.startswith("npy/")} == local
    only = location(f"{s3}/npy")
    preprocess(pipeline, shards, only, artifacts=artifacts, formats=("npy",), npy_chunk_rows=128)
    expected, got = _batches(Loader(local_run / "out", batch_size=100)), _batches(Loader(only, batch_size=100))
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
        np.testing.assert_array_equal(a[2], b[2])
