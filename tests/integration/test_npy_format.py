"""``etl preprocess --format``: parquet,npy writes the same Parquet bytes as parquet alone plus npy chunks; npy alone
is read by the default loader as the same batches; a rerun keeps what is complete (a bad --format: test_cli)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from etl.loader import Loader
from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import REPO, run_etl

PIPELINE = REPO / "pipelines/criteo.yaml"


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("npy")
    generate(load_schema(REPO / "schemas/criteo.yaml"), 6000, 2, root / "raw")
    return root / "raw"


def preprocess(raw: Path, out: Path, *options: str) -> str:
    return run_etl("preprocess", "--pipeline", PIPELINE, "--input", raw, "--out", out, *options).stdout


def test_parquet_and_npy_keep_the_parquet_bytes_and_the_batches(raw: Path, tmp_path: Path) -> None:
    preprocess(raw, tmp_path / "pq")
    preprocess(raw, tmp_path / "both", "--format", "parquet,npy", "--npy-chunk-rows", "1000")
    preprocess(raw, tmp_path / "npy", "--format", "npy", "--npy-chunk-rows", "1000")
    for part in ("part-00000.parquet", "part-00001.parquet"):
        assert (tmp_path / "both" / part).read_bytes() == (tmp_path / "pq" / part).read_bytes()
        assert not (tmp_path / "npy" / part).exists()
    manifest = json.loads((tmp_path / "npy/manifest.json").read_text())
    assert manifest["formats"] == ["npy"] and manifest["npy"]["chunk_rows"] == 1000
    assert "formats" not in json.loads((tmp_path / "pq/manifest.json").read_text())
    assert len(list((tmp_path / "npy/npy/part-00000").glob("label-*.npy"))) == 3
    expected = list(Loader(tmp_path / "pq", batch_size=700, copy=True))
    for source in ("both", "npy"):
        got = list(Loader(tmp_path / source, batch_size=700, copy=True))
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            assert torch.equal(a.label, b.label) and torch.equal(a.sparse, b.sparse)
            assert torch.equal(a.dense.nan_to_num(-1.0), b.dense.nan_to_num(-1.0))


def test_a_rerun_keeps_complete_shards_and_redoes_them_for_other_chunks(raw: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    preprocess(raw, out, "--format", "npy", "--npy-chunk-rows", "1000")
    assert "2 already complete" in preprocess(raw, out, "--format", "npy", "--npy-chunk-rows", "1000")
    assert "already complete" not in preprocess(raw, out, "--format", "npy", "--npy-chunk-rows", "2000")
    assert sorted(p.name for p in (out / "npy/part-00000").iterdir()) == [f"{f}-0000{i}.npy" for f in ("dense", "label", "sparse") for i in (0, 1)]
    preprocess(raw, out)  # Parquet only: the chunks and their directories go
    assert (out / "part-00000.parquet").exists() and not (out / "npy").exists()
