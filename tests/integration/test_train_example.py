"""scripts/train_dlrm.py trains a few steps on CPU from the loader, as a user would run it, with this checkout's etl
(PYTHONPATH: a script's own folder, not the working directory, leads sys.path)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import REPO, run_etl
from tests.docs import section_blocks, section_commands


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


@pytest.mark.slow
def test_the_readme_trains_on_a_time_split_and_evaluates_on_its_valid_rows(movielens: Path, tmp_path: Path) -> None:
    """The README's commands: MovieLens converted, split in time with target encodings, a DLRM trained on train and
    evaluated on valid; it learns (the valid AUC is well above chance) and prints both figures."""
    convert = section_commands("MovieLens")[0]
    block = section_blocks("Training and evaluating on a split", "bash")[0]
    lines = [shlex.split(ln) for ln in block.replace("\\\n", " ").splitlines() if ln and not ln.startswith("#")]
    assert [ln[:2] for ln in lines] == [["etl", "preprocess"], ["python", "scripts/train_dlrm.py"]]
    here = lambda a: a.replace("ml-latest-small/", f"{movielens}/").replace("data/ml/", f"{tmp_path}/ml/")  # noqa: E731
    run_etl(*map(here, convert[1:]))
    run_etl(*map(here, lines[0][1:]))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(REPO / lines[1][1]), *map(here, lines[1][2:])], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr
    found = re.search(r"^valid \(.*, 10,084 rows\): AUC (0\.\d+)  log loss (0\.\d+)$", proc.stdout, re.M)
    assert found, proc.stdout
    assert float(found[1]) > 0.64 and float(found[2]) < 0.69  # chance: AUC 0.5, log loss 0.693
