"""scripts/train_dlrm.py trains a few steps on CPU from the loader, as a user would run it, with this checkout's etl
(PYTHONPATH: a script's own folder, not the working directory, leads sys.path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import REPO, run_etl


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """20,000 synthetic raw rows in 2 shards and the artifacts `etl fit` writes for pipelines/criteo.yaml on them."""
    root = tmp_path_factory.mktemp("train")
    raw, art = root / "raw", root / "art"
    generate(load_schema(REPO / "schemas/criteo.yaml"), 20_000, 2, raw)
    run_etl("fit", "--pipeline", REPO / "pipelines/criteo.yaml", "--input", raw, "--artifacts", art)
    return raw, art


@pytest.mark.parametrize("transform_on", ["host", "device"])
def test_train_dlrm_runs_and_logs(fitted: tuple[Path, Path], transform_on: str) -> None:
    raw, art = fitted
    cmd = [sys.executable, str(REPO / "scripts/train_dlrm.py"), "--data", str(raw), "--pipeline", str(REPO / "pipelines/criteo.yaml"),
           "--artifacts", str(art), "--batch-size", "1024", "--steps", "12", "--log-every", "4",
           "--device", "cpu", "--transform-on", transform_on]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    logs = [line for line in proc.stdout.splitlines() if line.startswith("step")]
    assert len(logs) == 3 and all("samples/s" in line and "data wait" in line for line in logs)
    assert "done: 12 steps, 12,288 rows" in proc.stdout
