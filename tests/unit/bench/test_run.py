"""etl.bench.run: the whole-process figure (``preprocess:process``) and its output checks."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from etl.bench import run
from etl.io.parquet import list_shards
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.schema import load_schema
from etl.tools.synth import generate

REPO = Path(__file__).resolve().parents[3]
CATEGORIFY = REPO / "pipelines/criteo.yaml"


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """Raw synthetic Criteo shards and the in-process output of the categorify pipeline on them."""
    d = tmp_path_factory.mktemp("bench_run")
    generate(load_schema(REPO / "schemas/criteo.yaml"), 3_000, 2, d / "raw", seed=0)
    preprocess(Pipeline.from_file(CATEGORIFY), list_shards(d / "raw"), d / "ours", workers=1)
    return d


def test_measure_process_reports_a_failing_command(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"exit status 3.*boom"):
        run.measure_process([sys.executable, "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"], tmp_path / "out")


def test_process_figures_and_equal_outputs(work: Path, tmp_path: Path) -> None:
    shards = list_shards(work / "raw")
    ours, scripts = run.measure_processes(CATEGORIFY, "criteo", "Categorify", work / "raw", shards, tmp_path, 1, work / "ours")
    assert ours > 0 and set(scripts) == set(run.PROCESS_SCRIPTS) and "polars" in scripts
    assert all(seconds > 0 and equal is True for seconds, equal in scripts.values())
    assert list(tmp_path.iterdir()) == []  # both outputs removed once compared


def test_our_process_writing_other_files_is_an_error(work: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    preprocess(Pipeline.from_file(REPO / "pipelines/criteo_hash.yaml"), list_shards(work / "raw"), other, workers=1)
    with pytest.raises(RuntimeError, match="other files than the in-process run"):
        run.measure_processes(CATEGORIFY, "criteo", "Categorify", work / "raw", None, tmp_path, 1, other)


def test_polars_script_output_differing_from_ours_is_an_error(work: Path, tmp_path: Path) -> None:
    # ours: the real output with one part file swapped for another (the manifest, which our process must
    # reproduce, is left as it was): the polars script's output no longer equals it
    ours = tmp_path / "ours"
    shutil.copytree(work / "ours", ours)
    first, second = sorted(ours.glob("part-*.parquet"))
    shutil.copyfile(second, first)
    with pytest.raises(RuntimeError, match="(polars|duckdb) script's output differs from ours"):
        run.measure_processes(CATEGORIFY, "criteo", "Categorify", work / "raw", list_shards(work / "raw"), tmp_path, 1, ours)


@pytest.mark.skipif(importlib.util.find_spec("nvidia") is None or importlib.util.find_spec("nvidia.dali") is None,
                    reason="NVIDIA DALI is not installed (pip install 'etl[dali]')")  # fmt: skip
def test_processed_loaders_time_both_engines_on_one_output(work: Path, tmp_path: Path) -> None:
    p = Pipeline.from_file(CATEGORIFY)
    p.fit(list_shards(work / "raw"))
    p.save(tmp_path / "art-criteo")
    stages = run.measure_processed_loaders(p, list_shards(work / "raw"), tmp_path, 1, 500, "cpu", 0.0, lambda msg: None)
    assert [s.name for s in stages] == ["loader:processed", "loader:dali"]
    assert all(s.rows == 3_000 and s.seconds > 0 for s in stages)
