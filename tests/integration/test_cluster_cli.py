"""`etl preprocess --cluster` and `etl bench --cluster` as a user runs them: the same bytes as threads with one or
two worker processes (quarantine files included), a bad value on a worker is the one-line error of exit status 2,
and so is a shard whose worker processes keep dying."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.pipeline import Pipeline
from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import REPO, criteo_table, run_etl, tree_bytes

CRITEO = REPO / "pipelines/criteo.yaml"


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """Four shards of several row groups; the third has two malformed C3 values (rows 5 and 210)."""
    d = tmp_path_factory.mktemp("raw")
    for i, n in enumerate([300, 250, 400, 120]):
        t = criteo_table(n, seed=i)
        if i == 2:
            c3 = t.column("C3").to_pylist()
            c3[5] = c3[210] = "zz123456"
            t = t.set_column(t.column_names.index("C3"), "C3", pa.array(c3, pa.string()))
        pq.write_table(t, d / f"{i}.parquet", row_group_size=100)
    return d


def test_threads_and_clusters_of_one_and_two_workers_write_the_same_bytes(raw: Path, tmp_path: Path) -> None:
    trees = []
    for how in (["--workers", "2"], ["--cluster", "local:1"], ["--cluster", "local:2"]):
        out = tmp_path / how[1].replace(":", "")
        proc = run_etl("preprocess", "--pipeline", CRITEO, "--input", raw, "--out", out, "--on-error", "quarantine", *how)
        assert "rows: 1,070 in = 1,068 out + 2 quarantined" in proc.stdout
        trees.append(tree_bytes(out))
    assert trees[0] == trees[1] == trees[2]
    assert "quarantine/part-00002.parquet" in trees[0] and "manifest.json" in trees[0]


def test_a_bad_value_on_a_worker_is_one_line_and_exit_2(raw: Path, tmp_path: Path) -> None:
    fitted = Pipeline.from_file(CRITEO)
    fitted.fit([raw / "0.parquet"])  # so that the bad value is met by a worker, not by the fit
    fitted.save(tmp_path / "artifacts")
    proc = run_etl("preprocess", "--pipeline", CRITEO, "--input", raw, "--out", tmp_path / "out", "--artifacts", tmp_path / "artifacts",
                   "--cluster", "local:2", check=False)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {raw / '2.parquet'}, row group 0, row 5, column 'C3': "
                                                "malformed value (expected 8 hex digits): 'zz123456'"]  # fmt: skip


def kill_own_worker(*args: object) -> None:
    """Stands for ``etl.preprocess.tasks.shard_task`` in the test below: it kills the worker process running it."""
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_shard_whose_workers_keep_dying_is_one_line_and_exit_2(raw: Path, tmp_path: Path) -> None:
    """The etl command line, in a process where the shard task is one that kills its worker (workers import it
    from this module); Dask gives up on a task at its first worker death."""
    fitted = Pipeline.from_file(CRITEO)
    fitted.fit([raw / "0.parquet"])
    fitted.save(tmp_path / "artifacts")
    main = ("import etl.preprocess.tasks, tests.integration.test_cluster_cli as t; "
            "etl.preprocess.tasks.shard_task = t.kill_own_worker; from etl.cli import app; app()")  # fmt: skip
    args = ["preprocess", "--pipeline", CRITEO, "--input", raw / "2.parquet", "--out", tmp_path / "out", "--artifacts", tmp_path / "artifacts",
            "--cluster", "local:1"]  # fmt: skip
    env = os.environ | {"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"}
    proc = subprocess.run([sys.executable, "-c", main, *map(str, args)], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {raw / '2.parquet'}: stopped: the Dask worker processes holding this task died more "
                                                "often than distributed.scheduler.allowed-failures allows (killed, or out of memory?)"]  # fmt: skip


def test_bench_measures_preprocess_on_the_cluster_beside_threads(tmp_path: Path) -> None:
    raw, js = tmp_path / "raw", tmp_path / "b.json"
    generate(load_schema(REPO / "schemas/criteo.yaml"), 1_070, 2, raw)
    run_etl("bench", "--input", raw, "--pipeline", REPO / "pipelines/criteo_hash.yaml", "--no-baselines", "--batch-size", 512,
            "--device", "cpu", "--cluster", "local:1", "--json", js)  # fmt: skip
    (rep,) = json.loads(js.read_text())["pipelines"]
    stages = {s["name"]: s for s in rep["stages"]}
    assert list(stages).index("preprocess:cluster") == list(stages).index("preprocess") + 1
    cluster = stages["preprocess:cluster"]
    assert cluster["rows"] == 1_070 and cluster["seconds"] > 0
    assert cluster["note"].startswith("Dask, 1 worker process(es)") and "x the threaded time" in cluster["note"]
