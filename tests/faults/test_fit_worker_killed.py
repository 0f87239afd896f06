"""A Dask worker killed with SIGKILL while a fit runs: Dask reruns its tasks on a fresh worker, and the artifacts
are the bytes of an undisturbed threaded fit (a rerun counting task rewrites its spilled file whole)."""

from __future__ import annotations

import os
import signal

import pyarrow.parquet as pq
import pytest

from etl.pipeline import Pipeline, distributed
from etl.runtime.cluster import connect
from tests.conftest import criteo_table
from tests.unit.pipeline.conftest import PIPELINES
from tests.unit.pipeline.test_fit import tree_bytes

pytest.importorskip("distributed")


def test_a_worker_killed_mid_fit_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(distributed, "TASK_ROWS", 1)  # one task per row group: many tasks, some after the kill
    paths = []
    for i in range(3):
        paths.append(tmp_path / f"part-{i}.parquet")
        pq.write_table(criteo_table(400, seed=i), paths[-1], row_group_size=50)
    ref = Pipeline.from_file(PIPELINES / "criteo.yaml")
    ref.fit(paths, workers=2)
    ref.save(tmp_path / "ref")
    (tmp_path / "work").mkdir()
    killed: list[int] = []
    rows: dict[str, int] = {}
    with connect("local:2") as client:
        pids = client.run(os.getpid)

        def progress(name: str, n: int) -> None:
            rows[name] = rows.get(name, 0) + n
            if not killed:
                pid = sorted(pids.values())[0]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

        p = Pipeline.from_file(PIPELINES / "criteo.yaml")
        p.fit(paths, client=client, workdir=tmp_path / "work", progress=progress)
        assert set(client.run(os.getpid).values()).isdisjoint(killed)  # the nanny started a fresh worker
    p.save(tmp_path / "a")
    assert killed and rows == {"fit": 1200, "fit merge": 1200}  # every row once per pass, killed attempts included
    assert tree_bytes(tmp_path / "a") == tree_bytes(tmp_path / "ref")
    assert list((tmp_path / "work").iterdir()) == []
