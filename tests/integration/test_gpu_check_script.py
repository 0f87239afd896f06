"""scripts/gpu_check.sh, run as on a GPU machine but on CPU (GPU_CHECK_ALLOW_CPU=1), at a tiny size: a python3 that
does not process the editable install's .pth files (this venv's interpreter with -S, its packages reached through
PYTHONPATH), the repository on PYTHONPATH only, polars hidden (the GPU machine has none). It must run every step,
in its phase order, and write its report; the script's former first step (``import importlib`` alone) fails there."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO


def gpu_machine_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of the GPU machine, imitated: ``PYTHON`` a wrapper running this interpreter with -S (no
    site: no .pth file is processed, so the editable install is not there), the packages through PYTHONPATH,
    polars hidden."""
    shim = tmp_path / "shim" / "polars"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("polars is hidden for this test")\n')
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return env | {"PYTHON": str(python), "PYTHONPATH": f"{shim.parent}:{sysconfig.get_paths()['purelib']}"} | extra


def test_the_isolated_python_has_no_editable_install(tmp_path: Path) -> None:
    env = gpu_machine_env(tmp_path)
    code = "import sys, importlib; print(hasattr(importlib, 'util'), any('__editable__' in str(m) for m in sys.meta_path))"
    out = subprocess.run([env["PYTHON"], "-c", code], env=env, capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.split() == ["False", "False"]
    out = subprocess.run([env["PYTHON"], "-c", "import etl"], env=env, capture_output=True, text=True, cwd="/")
    assert out.returncode != 0  # only the repository on PYTHONPATH makes etl importable there


def test_the_former_first_step_fails_on_the_gpu_machine(tmp_path: Path) -> None:
    """With ``import importlib`` alone, step 1 exits 2 (what the GPU machine did), whereas here it would pass."""
    old = (REPO / "scripts/gpu_check.sh").read_text().replace("import importlib.util, os, sys", "import importlib, os, sys")
    assert "import importlib, os, sys" in old
    script = tmp_path / "repo" / "scripts" / "gpu_check.sh"
    script.parent.mkdir(parents=True)
    script.write_text(old)
    proc = subprocess.run(["bash", str(script), str(tmp_path / "out")], env=gpu_machine_env(tmp_path, GPU_CHECK_ALLOW_CPU="1"),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "has no attribute 'util'" in proc.stderr


def test_gpu_check_runs_on_cpu_as_on_the_gpu_machine(tmp_path: Path) -> None:
    parity = "tests/unit/backends/test_tensor.py tests/unit/loader/test_device_stage.py"  # the others run in this suite already
    env = gpu_machine_env(tmp_path, GPU_CHECK_ALLOW_CPU="1", GPU_CHECK_ROWS="8192", GPU_CHECK_WORKERS="2", GPU_CHECK_BATCHES="4096",
                          GPU_CHECK_PARITY_TESTS=parity)
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(REPO / "scripts/gpu_check.sh"), str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(list(out.iterdir())) <= 8
    report = json.loads((out / "gpu_report.json").read_text())
    assert report["parity"]["tests"] > 50 and report["parity"]["failures"] == 0 and report["parity"]["errors"] == 0
    assert report["sync_check"]["exit_code"] == 0 and "skipped on device 'cpu'" in report["sync_check"]["log"]
    runs = report["placement"]["runs"]
    assert {(r["pipeline"], r["placement"]) for r in runs} == {(p, q) for p in ("categorify", "hash") for q in ("host", "device")}
    assert [(r["pipeline"], r["placement"]) for r in runs[:2]] == [("categorify", "host"), ("categorify", "device")]  # the headline first
    assert all(r["reader"] == "cpu" for r in runs) and report["placement"]["cudf"].startswith("reader='cudf'")
    assert all(r["rows_per_second"] > 0 and 0 <= r["wait_4m"] <= 1 and 0 <= r["wait_dlrm"] <= 1 for r in runs)
    assert all(0 <= r["wait_4m_first_epoch"] <= 1 for r in runs)
    steps = [line.split("] ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("[gpu_check")]
    assert [s[:3] for s in steps if s[1] == "/"] == [f"{i}/7" for i in range(1, 8)]
    assert steps.index(next(s for s in steps if s.startswith("phase 1 done"))) < steps.index(next(s for s in steps if s.startswith("6/7")))
    last = proc.stdout.rstrip().splitlines()[-1]
    assert "parity:" in proc.stdout and "sync check: skipped" in proc.stdout
    assert last.startswith("device stages hash/4096") and ":Hash=" in last


def test_the_sync_check_names_the_line_that_synchronised() -> None:
    spec = importlib.util.spec_from_file_location("gpu_sync_check", REPO / "scripts/gpu_sync_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from etl.backends import tensor

    with pytest.raises(ValueError) as info:
        tensor._lsr(None, 0)  # type: ignore[arg-type]
    assert module.culprit(info.value).startswith("etl/backends/tensor.py:") and " in _lsr: " in module.culprit(info.value)
