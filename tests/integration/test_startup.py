"""Start-up of the command line: what a command imports. ``etl preprocess`` on local files, and the command line's
help, never load the heavy optional libraries (torch, Dask, pandas, fsspec), whose import alone costs a short run
a large share of its time; each test runs the command in a process of its own, as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import REPO, run_etl

#: libraries a local ``etl preprocess`` has no use for
HEAVY = ("torch", "dask", "distributed", "pandas", "fsspec", "s3fs")



def probe(modules: tuple[str, ...]) -> str:
    """Code that runs ``etl ARGS...`` like ``python -m etl``, then prints which of ``modules`` the process had
    imported."""
    return f"""
import atexit, json, runpy, sys
atexit.register(lambda: print("loaded:", json.dumps(sorted(m for m in {modules!r} if m in sys.modules))))
sys.argv = ["etl", *sys.argv[1:]]
runpy.run_module("etl", run_name="__main__", alter_sys=True)
"""


PROBE = probe(HEAVY)


def loaded_by(*args: str | Path, modules: tuple[str, ...] = HEAVY) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", probe(modules), *map(str, args)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("loaded: "), proc.stdout
    return json.loads(last.removeprefix("loaded: "))


def test_probe_sees_a_loaded_library() -> None:
    # the probe itself works: a command that needs pandas (to read a pandas DataFrame) shows it
    code = PROBE.replace("runpy.run_module", "import pandas; runpy.run_module")
    proc = subprocess.run([sys.executable, "-c", code, "--help"], cwd=REPO, capture_output=True, text=True, check=True)
    assert proc.stdout.strip().splitlines()[-1] == 'loaded: ["pandas"]'


def test_help_imports_no_heavy_library() -> None:
    assert loaded_by("preprocess", "--help") == []


def raw_shard(schema: str, directory: Path) -> Path:
    """500 synthetic rows of ``schemas/<schema>.yaml`` in ``directory`` (made in this process: only the commands
    the tests probe run in a process of their own)."""
    generate(load_schema(REPO / f"schemas/{schema}.yaml"), 500, 1, directory)
    return directory


@pytest.mark.parametrize(
    ("schema", "pipeline", "budget"),
    [("movielens", "movielens", None), ("criteo", "criteo", "1")],  # "1": the stash spills to disk
)
def test_local_preprocess_imports_no_heavy_library(tmp_path: Path, schema: str, pipeline: str, budget: str | None) -> None:
    raw = raw_shard(schema, tmp_path / "raw")
    out = tmp_path / "out"
    more = () if budget is None else ("--memory-budget", budget)
    assert loaded_by("preprocess", "--pipeline", REPO / f"pipelines/{pipeline}.yaml", "--input", raw, "--out", out, *more) == []
    assert (out / "manifest.json").is_file()


def test_local_criteo_preprocess_imports_no_heavy_library_nor_pyarrow_compute(tmp_path: Path) -> None:
    """No heavy library, and not pyarrow's compute functions (≈ 40 ms of imports) either: they are loaded where a
    step needs one (text conversion, list columns with missing values, dictionary-encoded columns); a Criteo run
    needs none."""
    raw = raw_shard("criteo", tmp_path / "raw")
    out = tmp_path / "out"
    args = ("preprocess", "--pipeline", REPO / "pipelines/criteo.yaml", "--input", raw, "--out", out)
    assert loaded_by(*args, modules=(*HEAVY, "pyarrow.compute")) == []
    assert (out / "manifest.json").is_file()


def test_preprocess_with_artifacts_imports_no_heavy_library(tmp_path: Path) -> None:
    # loading fitted artifacts (their vocabulary tables) reads Parquet without pyarrow.dataset, which imports pandas
    raw_shard("criteo", tmp_path / "raw")
    pipeline = REPO / "pipelines/criteo.yaml"
    run_etl("fit", "--pipeline", pipeline, "--input", tmp_path / "raw", "--artifacts", tmp_path / "artifacts")
    out = tmp_path / "out"
    args = ("preprocess", "--pipeline", pipeline, "--input", tmp_path / "raw", "--out", out, "--artifacts", tmp_path / "artifacts")
    assert loaded_by(*args) == []
    assert (out / "manifest.json").is_file()
