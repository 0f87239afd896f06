"""``etl fit --cluster`` as a user runs it, on the real Criteo sample: the same artifact bytes as the threaded fit,
an invalid value found by a worker reported in one line naming file, row and column (exit status 2), and
``--partitions`` refused without a cluster. Nothing is left in the artifacts directory but the artifacts (a work
directory an interrupted fit left there is removed)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, run_etl, tree_bytes

pytest.importorskip("distributed")

CRITEO = REPO / "pipelines/criteo.yaml"


@pytest.fixture
def raw(criteo_8k_glob_shards: Path) -> Path:
    return criteo_8k_glob_shards


def test_cluster_fit_writes_the_threaded_fits_bytes_and_a_worker_error_is_one_line(raw: Path, tmp_path: Path) -> None:
    run_etl("fit", "--pipeline", CRITEO, "--input", raw, "--artifacts", tmp_path / "threads", "--workers", 1)
    stale = tmp_path / "dask" / ".fit.123-abcd1234.tmp" / "counts"  # left by a fit killed with SIGKILL
    stale.mkdir(parents=True)
    (stale / "000000.parquet").write_bytes(b"spilled")
    run_etl("fit", "--pipeline", CRITEO, "--input", raw, "--artifacts", tmp_path / "dask", "--cluster", "local:2", "--partitions", 3)
    assert tree_bytes(tmp_path / "dask") == tree_bytes(tmp_path / "threads")
    assert sorted(p.name for p in (tmp_path / "dask").iterdir()) == sorted(p.name for p in (tmp_path / "threads").iterdir())

    table = pq.read_table(raw / "part-00001.parquet")
    values = table.column("C7").to_pylist()
    values[1234] = "zz12345g"
    bad = tmp_path / "bad"
    bad.mkdir()
    pq.write_table(table.set_column(table.schema.get_field_index("C7"), "C7", pa.array(values, pa.string())), bad / "part-00001.parquet")
    proc = run_etl("fit", "--pipeline", CRITEO, "--input", bad, "--artifacts", tmp_path / "bad-art", "--cluster", "local:1", check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"{bad / 'part-00001.parquet'}" in lines[0] and "row 1234, column 'C7'" in lines[0] and "zz12345g" in lines[0]
    assert list((tmp_path / "bad-art").iterdir()) == []  # no work directory left behind


def test_partitions_need_a_cluster(raw: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    proc = run_etl("fit", "--pipeline", CRITEO, "--input", raw, "--artifacts", tmp_path / "a", "--partitions", 2, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--partitions" in lines[0] and "--cluster" in lines[0], proc.stderr
    assert not (tmp_path / "a").exists()
