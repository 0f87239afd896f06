"""scripts/gpu_check.sh, run as on a GPU machine but on CPU (GPU_CHECK_ALLOW_CPU=1), at a tiny size, with polars
hidden (the GPU machine has none): it must run every step and write gpu_report.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_gpu_check_runs_on_cpu_without_polars(tmp_path: Path) -> None:
    shim = tmp_path / "shim" / "polars"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("polars is hidden for this test")\n')
    env = dict(os.environ, GPU_CHECK_ALLOW_CPU="1", GPU_CHECK_ROWS="20000", GPU_CHECK_WORKERS="2", GPU_CHECK_BATCHES="4096",
               PYTHON=sys.executable, PYTHONPATH=str(shim.parent))  # fmt: skip
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(REPO / "scripts/gpu_check.sh"), str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "gpu_report.json").read_text())
    assert report["parity"]["tests"] > 50 and report["parity"]["failures"] == 0 and report["parity"]["errors"] == 0
    runs = report["placement"]["runs"]
    assert {(r["pipeline"], r["placement"]) for r in runs} == {(p, q) for p in ("categorify", "hash") for q in ("host", "device")}
    assert all(r["rows_per_second"] > 0 and 0 <= r["wait_4m"] <= 1 and 0 <= r["wait_dlrm"] <= 1 for r in runs)
    last = proc.stdout.rstrip().splitlines()[-1]
    assert "parity:" in proc.stdout and last.startswith("device stages hash/4096") and ":Hash=" in last
    assert all(0 <= r["wait_4m_first_epoch"] <= 1 for r in runs)
