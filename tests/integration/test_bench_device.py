"""`etl bench --device-placement`: the device part's stages, a loader epoch with transform_on="device" and its
stall are in the report (here on CPU tensors; with CUDA the same stages plus the host→device copy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from etl.pipeline import Pipeline
from tests.conftest import REPO, run_etl
from tests.unit.loader.test_cudf_columns import CUDF_MISSING


def test_bench_reports_device_placement_stages(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run_etl("bench", "--pipeline", REPO / "pipelines/criteo.yaml", "--rows", 10_000, "--files", 2, "--batch-size", 4096,
            "--workers", 2, "--device", "cpu", "--device-placement", "--no-baselines", "--json", out)  # fmt: skip
    rep = json.loads(out.read_text())["pipelines"][0]
    names = [s["name"] for s in rep["stages"]]
    _, device_ops = Pipeline.from_file(REPO / "pipelines/criteo.yaml").split()
    want = ["dp:host part", "dp:inputs", "dp:ring", "dp:columns"]
    want += [f"dp:{i}:{op.name}" for i, op in enumerate(device_ops)] + ["dp:output", "dp:loader"]
    assert [n for n in names if n.startswith("dp:")] == want
    assert "dp:h2d" not in names  # no CUDA here
    assert all(s["seconds"] > 0 and s["rows"] == 10_000 for s in rep["stages"] if s["name"].startswith("dp:"))
    assert 0 <= rep["device_data_wait"] <= 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_bench_on_cuda_without_cuda_is_a_clear_error() -> None:
    proc = run_etl("bench", "--rows", 1000, "--files", 1, "--device", "cuda", "--no-baselines", check=False)
    assert proc.returncode == 2 and "sees no CUDA device" in proc.stderr


def test_bench_reader_cudf_is_refused_in_one_line_where_it_cannot_run() -> None:
    proc = run_etl("bench", "--rows", 1000, "--files", 1, "--device", "cpu", "--reader", "cudf", "--no-baselines", check=False)
    assert proc.returncode == 2 and "--reader cudf: reader='cudf' decodes Parquet into GPU memory" in proc.stderr


@pytest.mark.cudf
@pytest.mark.skipif(CUDF_MISSING is not None, reason=str(CUDF_MISSING))
def test_bench_reader_cudf_row_beside_the_default_reader(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run_etl("bench", "--pipeline", REPO / "pipelines/criteo.yaml", "--rows", 20_000, "--files", 2, "--batch-size", 4096,
            "--device", "cuda", "--reader", "cudf", "--no-baselines", "--json", out)  # fmt: skip
    stages = {s["name"] for s in json.loads(out.read_text())["pipelines"][0]["stages"]}
    assert {"loader", "dp:loader", "cudf:loader"} <= stages
