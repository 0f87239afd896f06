"""Shipped schemas and pipelines named by name, from a directory outside the checkout: ``etl list`` shows them,
``--schema criteo`` / ``--pipeline criteo_hash`` and ``etl.Loader(..., pipeline=...)`` find them, and a misspelt
name is one line that lists the shipped names and the closest one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from etl.resources import names
from tests.conftest import run_etl


def test_etl_list_shows_every_shipped_file_with_a_summary(tmp_path: Path) -> None:
    out = run_etl("list", cwd=tmp_path).stdout
    lines = out.splitlines()
    for kind in ("schemas", "pipelines"):
        for name in names(kind):
            assert any(line.startswith(f"{name} ") for line in lines), (name, out)
    assert any(line.startswith("criteo_hash ") and "MLPerf-style Criteo preprocessing" in line for line in lines), out
    assert lines[0].startswith("schemas (--schema NAME") and any(line.startswith("pipelines (--pipeline NAME") for line in lines)


def test_names_work_outside_the_checkout(tmp_path: Path) -> None:
    run_etl("generate", "--schema", "criteo", "--rows", "300", "--out", "raw", cwd=tmp_path)
    run_etl("fit", "--pipeline", "criteo", "--input", "raw", "--artifacts", "art", cwd=tmp_path)
    done = run_etl("preprocess", "--pipeline", "criteo", "--input", "raw", "--artifacts", "art", "--out", "out", cwd=tmp_path)
    assert "rows: 300 in = 300 out" in done.stdout
    code = "import etl; print(sum(len(b) for b in etl.Loader('raw', pipeline='criteo_hash', batch_size=64)))"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "300"


def test_a_misspelt_name_lists_the_shipped_ones(tmp_path: Path) -> None:
    proc = run_etl("generate", "--schema", "critoe", "--rows", "10", "--out", "raw", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "critoe: no such file, nor a schema that ships with etl (shipped: avazu, criteo" in proc.stderr
    assert proc.stderr.strip().endswith("did you mean 'criteo'?")
    proc = run_etl("preprocess", "--pipeline", "movielens_hash", "--input", "raw", "--out", "out", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "nor a pipeline that ships with etl" in proc.stderr and "did you mean" in proc.stderr
