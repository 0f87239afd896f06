"""The real Criteo sample end to end through the CLI: convert the three TSV files, preprocess, and compare every
value with an independent plain-Python reading of the TSV."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from etl.backends import hashing
from tests.conftest import REPO, run_etl

FILES = ("train.csv", "dev.csv", "test.csv")
DENSE = [f"I{i}" for i in range(1, 14)]
CATS = [f"C{i}" for i in range(1, 27)]


def read_tsv(root: Path) -> list[list[str]]:
    rows = []
    for name in FILES:
        with open(root / name, newline="") as f:
            rows.extend(csv.reader(f, delimiter="\t"))
    assert all(len(r) == 40 for r in rows)
    return rows


def expected_dense(text: str) -> np.float32:
    x = float(int(text)) if text else 0.0
    return np.float32(math.log1p(max(x, 0.0)))


@pytest.fixture
def converted(criteo_8k_shards: Path) -> Path:
    """The three TSV files converted in ``FILES`` order, 3,000 rows a shard."""
    return criteo_8k_shards


def read_output(out: Path) -> dict[str, np.ndarray]:
    manifest = json.loads((out / "manifest.json").read_text())
    tables = [pq.read_table(out / f["output"]) for f in manifest["files"]]
    return {c: np.concatenate([t.column(c).to_numpy() for t in tables]) for c in tables[0].column_names}


def test_convert_writes_all_rows(converted: Path) -> None:
    files = sorted(converted.glob("*.parquet"))
    assert [pq.ParquetFile(f).metadata.num_rows for f in files] == [3000, 3000, 2000]


def test_categorify_pipeline_matches_reference(criteo_8k: Path, converted: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_etl("preprocess", "--pipeline", REPO / "pipelines/criteo.yaml", "--input", converted, "--out", out, "--workers", 2)
    assert "8,000 in = 8,000 out + 0 quarantined" in proc.stdout
    rows = read_tsv(criteo_8k)
    got = read_output(out)
    assert got["label"].dtype == np.float32 and got["I1"].dtype == np.float32 and got["C1"].dtype == np.int32
    np.testing.assert_array_equal(got["label"], np.array([float(r[0]) for r in rows], np.float32))
    for j, c in enumerate(DENSE, start=1):
        want = np.array([expected_dense(r[j]) for r in rows], np.float32)
        assert got[c].tobytes() == want.tobytes(), c

    threshold = 3
    cards = json.loads((out / "artifacts" / "pipeline.json").read_text())["cardinalities"]
    for j, c in enumerate(CATS, start=14):
        values = [r[j] for r in rows]
        counts = Counter(v for v in values if v)
        kept = sorted((k for k, n in counts.items() if n >= threshold), key=lambda k: (-counts[k], int(k, 16)))
        ids = {k: 3 + i for i, k in enumerate(kept)}  # 0 pad, 1 null, 2 the single OOV bucket
        want = np.array([1 if not v else ids.get(v, 2) for v in values], np.int32)
        np.testing.assert_array_equal(got[c], want, err_msg=c)
        assert cards[c] == 3 + len(kept)
        vocab = pq.read_table(out / "artifacts" / "04-Categorify" / f"{c}.parquet").to_pydict()
        assert vocab["raw"] == kept and vocab["count"] == [counts[k] for k in kept]
        assert vocab["id"] == list(range(3, 3 + len(kept)))


def test_hash_pipeline_matches_reference(criteo_8k: Path, converted: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    run_etl("preprocess", "--pipeline", REPO / "pipelines/criteo_hash.yaml", "--input", converted, "--out", out)
    rows = read_tsv(criteo_8k)
    got = read_output(out)
    n = 40_000_000
    for j, c in enumerate(CATS, start=14):
        want = [1 if not r[j] else 2 + hashing.reduce(hashing.hash64(int(r[j], 16), 0), n) for r in rows]
        np.testing.assert_array_equal(got[c], np.array(want, np.int32), err_msg=c)


def test_fit_then_preprocess_with_artifacts_is_identical(converted: Path, tmp_path: Path) -> None:
    art = tmp_path / "art"
    proc = run_etl("fit", "--pipeline", REPO / "pipelines/criteo.yaml", "--input", converted, "--artifacts", art, "--workers", 1)
    assert "rows/s" in proc.stdout
    a, b = tmp_path / "a", tmp_path / "b"
    run_etl("preprocess", "--pipeline", REPO / "pipelines/criteo.yaml", "--input", converted, "--out", a, "--artifacts", art)
    run_etl("preprocess", "--pipeline", REPO / "pipelines/criteo.yaml", "--input", converted, "--out", b, "--workers", 3)
    for f in sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file()):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    inspect = run_etl("inspect", art).stdout
    assert "C1=" in inspect and "vocabulary sizes" in inspect


def test_inspect_raw_and_processed(converted: Path, tmp_path: Path) -> None:
    raw = run_etl("inspect", converted).stdout
    assert "3 file(s), 8,000 rows" in raw and "C1: string" in raw and "I12: int64" in raw
    assert "nulls" in raw  # I12 is 77.7% missing in the sample
    out = tmp_path / "out"
    run_etl("preprocess", "--pipeline", REPO / "pipelines/criteo.yaml", "--input", converted, "--out", out)
    processed = run_etl("inspect", out).stdout
    assert "rows in: 8,000" in processed and "quarantined: 0" in processed
    assert "C1: int32" in processed and "I1: float" in processed and "vocabulary sizes" in processed


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    proc = run_etl("demo", "--rows", 20_000, "--files", 2, "--workdir", tmp_path / "demo")
    assert "20,000 in = 20,000 out + 0 quarantined" in proc.stdout
    assert (tmp_path / "demo" / "processed" / "manifest.json").is_file()
