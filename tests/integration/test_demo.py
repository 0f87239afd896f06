"""``etl demo`` ends with the next step: a training loop over what it wrote, which runs as printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_etl


@pytest.mark.parametrize("rows", [3000, 500])  # 500: fewer rows than a full batch
def test_the_printed_training_loop_runs_on_the_demo_output(tmp_path: Path, rows: int) -> None:
    out = run_etl("demo", "--rows", rows, "--files", 2, "--workdir", "mine", cwd=tmp_path).stdout
    intro, code = out.split("next: train on them, e.g. with this loop (python):\n", 1)
    assert "processed shards, manifest and artifacts → mine/processed" in intro
    assert code.strip().startswith("import etl") and "etl.Loader('mine/processed'" in code
    (tmp_path / "train.py").write_text(code)
    trained = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stderr
    assert trained.stdout.startswith("loss on the last batch: ") and float(trained.stdout.split(": ")[1]) > 0
