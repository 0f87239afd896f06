"""Fitting on a Dask cluster (``local:1``, ``local:2``): artifacts byte-identical to the threaded fit's whatever the
partition count and shard order, string keys and Normalize, several stages, errors raised in a worker reaching
the caller as the same typed error, quarantine, progress, the work directory removed in every case, and spilled to
object storage (moto in server mode) when the work directory is a URL."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import dask
import pyarrow.parquet as pq
import pytest
import yaml

from etl.errors import ClusterError, ConfigError, RowError
from etl.io.fs import Url
from etl.pipeline import Pipeline, distributed
from etl.runtime.cluster import connect
from tests.unit.pipeline.conftest import DLRM, PIPELINES, ROOT, write_pipeline
from tests.unit.pipeline.test_fit import tree_bytes

pytest.importorskip("distributed")


@pytest.fixture
def local2(local_cluster):
    return local_cluster


@pytest.fixture(scope="module")
def local1():
    with connect("local:1") as client:
        yield client


def fit_to(path: Path, pipeline: Path, shards: list[Path], work: Path, **kw) -> dict[str, bytes]:
    p = Pipeline.from_file(pipeline)
    p.fit(shards, workdir=work, **kw)
    p.save(path)
    assert list(work.iterdir()) == [], "the work directory is removed"
    return tree_bytes(path)


@pytest.mark.parametrize(
    ("cluster", "partitions", "perm"),
    [
        ("local1", None, (0, 1, 2, 3)),
        ("local2", None, (3, 1, 0, 2)),
        ("local2", 1, (2, 3, 1, 0)),
        ("local2", 3, (1, 0, 3, 2)),
        ("local2", 8, (0, 1, 2, 3)),
    ],
)
def test_artifacts_are_the_threaded_fits_bytes(request, criteo, fitted, tmp_path, cluster, partitions, perm):
    client = request.getfixturevalue(cluster)
    paths = [criteo[0][i] for i in perm]
    (tmp_path / "work").mkdir()
    got = fit_to(tmp_path / "a", PIPELINES / "criteo.yaml", paths, tmp_path / "work", client=client, partitions=partitions)
    assert got == tree_bytes(fitted[1])


@pytest.mark.parametrize("threshold", [1, 10**6])  # 10**6: every vocabulary empty
def test_string_keys_lists_and_normalize_match_threads(local2, ml_shards, tmp_path, threshold):
    paths, _ = ml_shards
    ops = yaml.safe_load((PIPELINES / "movielens.yaml").read_text())["ops"]
    for op in ops:
        if op["op"] == "Categorify":
            op["freq_threshold"] = threshold
    spec = write_pipeline(tmp_path, ops, schema=str(ROOT / "schemas/movielens.yaml"))
    (tmp_path / "work").mkdir()
    ref = fit_to(tmp_path / "t", spec, paths, tmp_path / "work", workers=2)
    got = fit_to(tmp_path / "d", spec, paths[::-1], tmp_path / "work", client=local2, partitions=2)
    assert got == ref


def test_several_stages_and_progress(local2, criteo, tmp_path, monkeypatch):
    """Two stages (the second Normalize reads what the first writes) and tasks of one row group each."""
    monkeypatch.setattr(distributed, "TASK_ROWS", 1)
    paths, tables, _ = criteo
    ops = [DLRM[0], {"op": "Normalize", "columns": "@dense"}, {"op": "Normalize", "columns": "@dense"}, *DLRM[3:4]]
    ops.append({"op": "Categorify", "columns": "@categorical", "freq_threshold": 2, "max_size": 20})
    spec = write_pipeline(tmp_path, ops)
    pieces = distributed.plan_pieces(Pipeline.from_file(spec), paths)
    assert len(pieces) == sum(pq.ParquetFile(p).num_row_groups for p in paths)
    (tmp_path / "work").mkdir()
    seen: dict[str, int] = {}

    def progress(name: str, n: int) -> None:
        seen[name] = seen.get(name, 0) + n

    ref = fit_to(tmp_path / "t", spec, paths, tmp_path / "work", workers=2)
    got = fit_to(tmp_path / "d", spec, paths, tmp_path / "work", client=local2, progress=progress, partitions=3)
    assert got == ref
    rows = sum(t.num_rows for t in tables)
    assert seen == {"fit 1/2": rows, "fit 1/2 merge": rows, "fit 2/2": rows}  # the second stage has no count table


def test_a_worker_error_is_the_same_typed_error(local2, criteo, bad_shard, tmp_path):
    paths, _, _ = criteo
    path, _, _ = bad_shard
    with pytest.raises(RowError) as threaded:
        Pipeline.from_file(PIPELINES / "criteo.yaml").fit([path], workers=1)
    (tmp_path / "work").mkdir()
    with pytest.raises(RowError) as remote:
        Pipeline.from_file(PIPELINES / "criteo.yaml").fit(paths + [path], client=local2, workdir=tmp_path / "work")
    assert (remote.value.path, remote.value.row_group, remote.value.row, remote.value.column) == (
        threaded.value.path, threaded.value.row_group, threaded.value.row, threaded.value.column
    )  # fmt: skip
    assert str(remote.value) == str(threaded.value)
    assert list((tmp_path / "work").iterdir()) == []


def kill_own_worker(*args: object) -> None:
    """Stands for the counting task: it kills the worker process running it."""
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_piece_whose_workers_keep_dying_is_a_cluster_error_naming_it(criteo, tmp_path, monkeypatch):
    paths, _, _ = criteo
    monkeypatch.setattr(distributed, "_count_piece", kill_own_worker)  # workers import it from this module
    (tmp_path / "work").mkdir()
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), connect("local:1") as client:
        with pytest.raises(ClusterError) as info:
            Pipeline.from_file(PIPELINES / "criteo.yaml").fit(paths[:1], client=client, workdir=tmp_path / "work")
    assert str(info.value).startswith(f"{paths[0]}, row groups 0-3: stopped: the Dask worker processes holding this task died")
    assert list((tmp_path / "work").iterdir()) == []


def test_quarantine_counts_match(local2, criteo, bad_shard, tmp_path):
    paths, _, _ = criteo
    path, _, _ = bad_shard
    (tmp_path / "work").mkdir()
    ref = fit_to(tmp_path / "t", PIPELINES / "criteo.yaml", paths + [path], tmp_path / "work", on_error="quarantine")
    got = fit_to(tmp_path / "d", PIPELINES / "criteo.yaml", [path] + paths, tmp_path / "work", client=local2, on_error="quarantine")
    assert got == ref


def test_partitions_are_checked(local2, criteo, tmp_path):
    paths, _, _ = criteo
    p = Pipeline.from_file(PIPELINES / "criteo.yaml")
    with pytest.raises(ConfigError, match="--cluster"):
        p.fit(paths, partitions=2)
    for bad in (0, 2**31 + 1, 1.5):
        with pytest.raises(ConfigError, match="--partitions"):
            p.fit(paths, client=local2, partitions=bad, workdir=tmp_path)


def test_default_partitions_follow_the_estimate():
    k = distributed.KEYS_PER_PARTITION
    assert [distributed.default_partitions(n) for n in (0, 1, k, k + 1, 20 * k)] == [1, 1, 1, 2, 20]


def test_no_shards_give_the_threaded_state_of_no_rows(local1, tmp_path):
    (tmp_path / "work").mkdir()
    ref = fit_to(tmp_path / "t", PIPELINES / "criteo.yaml", [], tmp_path / "work")
    assert fit_to(tmp_path / "d", PIPELINES / "criteo.yaml", [], tmp_path / "work", client=local1) == ref


@pytest.mark.parametrize(("task_rows", "groups"), [(1, [1, 1, 1, 1]), (120, [2, 2]), (179, [2, 2]), (180, [3, 1]), (10**6, [4])])
def test_tasks_are_whole_row_groups_up_to_task_rows(criteo, monkeypatch, task_rows, groups):
    """The first criteo shard: 230 rows in row groups of 60, 60, 60, 50."""
    monkeypatch.setattr(distributed, "TASK_ROWS", task_rows)
    path = criteo[0][0]
    pieces = distributed.plan_pieces(Pipeline.from_file(PIPELINES / "criteo.yaml"), [path])
    assert [p.stop - p.first for p in pieces] == groups
    assert pieces[0].first == 0 and pieces[-1].stop == 4 and all(a.stop == b.first for a, b in zip(pieces, pieces[1:]))
    assert {p.path for p in pieces} == {path}


def test_spills_through_object_storage_when_the_work_directory_is_a_url(local2, criteo, fitted, s3, s3_server, tmp_path):
    """The work directory is a temporary prefix under the URL while the partitions merge, and gone at the end (the
    workers, started before the ``s3`` fixture set the environment, reach the store by the URL's options)."""
    paths, _, _ = criteo
    work = Url(f"{s3}/art", {"endpoint_url": s3_server, "key": "testing", "secret": "testing"})
    seen: list[str] = []

    def progress(name: str, n: int) -> None:
        if name == "fit merge" and not seen:
            seen.extend(key[len(work.key) + 1 :] for key in work.fs.find(work.key))

    p = Pipeline.from_file(PIPELINES / "criteo.yaml")
    p.fit(paths, client=local2, workdir=work, partitions=2, progress=progress)
    p.save(tmp_path / "a")
    assert tree_bytes(tmp_path / "a") == tree_bytes(fitted[1])
    assert seen and all(key.startswith(".fit.") and ("/counts/" in key or "/ranked/" in key) for key in seen), seen
    assert work.fs.find(work.key) == []
