"""scripts/profile_preprocess.py profiles a whole `etl preprocess` run, as a user would run it, with this checkout's
etl (PYTHONPATH: a script's own folder, not the working directory, leads sys.path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import REPO

STAGES = ["Parquet read", "hex decode", "counting", "count table growth", "stash put", "stash pop", "lookup table build",
          "lookup", "Parquet write + sha256", "artifact save"]  # fmt: skip


def test_profile_preprocess_reports_threads_stages_and_timeline(tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    generate(load_schema(REPO / "schemas/criteo.yaml"), 20_000, 2, raw)
    out = tmp_path / "out"
    cmd = [sys.executable, str(REPO / "scripts/profile_preprocess.py"), "--pipeline", str(REPO / "pipelines/criteo.yaml"),
           "--input", str(raw), "--out", str(out)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("process: wall") and "minor faults" in lines[0]
    assert any(line.strip().startswith("etl-worker-") for line in lines)
    for stage in STAGES:
        assert any(line.strip().startswith(stage) and " calls " in line for line in lines), stage
    assert any(line.startswith("timeline") for line in lines)
    assert sorted(p.name for p in out.glob("part-*.parquet")) == ["part-00000.parquet", "part-00001.parquet"]
