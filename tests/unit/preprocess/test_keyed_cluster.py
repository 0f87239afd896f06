"""etl preprocess --cluster of a pipeline with History or Groupby (etl.preprocess.keyed_cluster): the exchange by key
through Dask's shuffle gives the bytes of the threaded run (output files, quarantine files, manifest entries) with
one partition and with several, and errors name the source shard and row as in threads."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pytest

from etl.errors import RowError
from etl.io.files import is_temporary
from etl.io.processed import QUARANTINE, read_manifest
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from tests.unit.preprocess import test_keyed as history
from tests.unit.preprocess import test_keyed_groupby as groupby


def tree(out: Path) -> dict[str, str]:
    """sha256 of every output and quarantine file of ``out``."""
    files = [*out.glob("part-*.parquet"), *(out / QUARANTINE).glob("*")]
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(files)}


def same_as_threads(make: Pipeline, shards: list[Path], tmp: Path, client: object, **kwargs: object) -> int:
    """Run ``make`` in threads and on ``client``'s cluster: the same files, bytes and manifest entries (the fit on
    the cluster gives the artifacts of the threaded fit, so their checksums agree too); the number of files."""
    threads, dask = tmp / "threads", tmp / "dask"
    a = preprocess(make, shards, threads, workers=2, **kwargs)  # type: ignore[arg-type]
    b = preprocess(make, shards, dask, client=client, **kwargs)  # type: ignore[arg-type]
    assert (a.files, a.rows_in, a.rows_out, a.rows_quarantined, a.stages) == (b.files, b.rows_in, b.rows_out, b.rows_quarantined, b.stages)
    assert tree(threads) == tree(dask) and tree(dask)
    assert read_manifest(threads).files == read_manifest(dask).files
    assert not [p for p in dask.rglob("*") if is_temporary(p.name)]
    return a.files


@pytest.mark.parametrize("budget", [None, 64 << 10], ids=["one-partition", "several"])
def test_history_on_a_cluster_gives_the_bytes_of_threads(tmp_path: Path, local_cluster: object, budget: int | None) -> None:
    table = history.events(4000, seed=9, users=400, nulls=True)
    shards = history.write_shards(table, tmp_path / "raw", [1500, 2600], 500)
    make = history.make_pipeline(tmp_path, max_len=3, ttl=6)
    files = same_as_threads(make, shards, tmp_path, local_cluster, on_error="quarantine", memory_budget=budget)
    assert files == 1 if budget is None else files > 3
    entries = read_manifest(tmp_path / "dask").files
    assert sum(e.rows_quarantined for e in entries) > 0  # missing labels and keys, named by shard and row
    assert sum(e.rows_in for e in entries) == 4000


@pytest.mark.parametrize("budget", [None, 64 << 10], ids=["one-partition", "several"])
def test_groupby_on_a_cluster_gives_the_bytes_of_threads(tmp_path: Path, local_cluster: object, budget: int | None) -> None:
    table = groupby.events(4000, seed=3, nulls=True, huge=True)
    shards = groupby.write_shards(table, tmp_path / "raw", [1000, 2500], 400)
    make = groupby.make_pipeline(tmp_path, {"min_len": 2})
    files = same_as_threads(make, shards, tmp_path, local_cluster, on_error="quarantine", memory_budget=budget)
    assert files == 1 if budget is None else files > 3
    stages = read_manifest(tmp_path / "dask").totals.stages
    assert stages is not None and stages[-1].groups_dropped


def test_a_row_error_names_the_source_shard_and_row_as_in_threads(tmp_path: Path, local_cluster: object) -> None:
    table = history.events(2000, seed=4, nulls=True)
    shards = history.write_shards(table, tmp_path / "raw", [900], 300)
    make = history.make_pipeline(tmp_path)
    make.fit(shards, on_error="quarantine")  # the error comes from the transform: the partition's first rejected row
    errors = []
    for kwargs in ({"workers": 1}, {"client": local_cluster}):
        with pytest.raises(RowError) as e:
            preprocess(make, shards, tmp_path / f"out{len(errors)}", **kwargs)  # type: ignore[arg-type]
        errors.append(str(e.value))
    assert errors[0] == errors[1] and str(tmp_path / "raw" / "s0") in errors[0]


def test_list_columns_go_through_the_task_shuffle(tmp_path: Path, local_cluster: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """A schema with a list column (Dask's P2P shuffle cannot carry pandas' Arrow list dtypes): the task shuffle,
    the same bytes."""
    tags_column = {"name": "tags", "role": "list", "dtype": "string", "encoding": "string", "separator": "|"}
    schema = {**history.SCHEMA, "columns": [*history.SCHEMA["columns"], tags_column]}
    monkeypatch.setattr(history, "SCHEMA", schema)
    table = history.events(3000, seed=7, users=300)
    tags = [None if i % 9 == 0 else [f"t{i % 5}", f"t{i % 3}"][: i % 3] for i in range(table.num_rows)]
    table = table.append_column("tags", pa.array(tags, pa.list_(pa.string())))
    shards = history.write_shards(table, tmp_path / "raw", [1200], 400)
    make = history.make_pipeline(tmp_path, ops_after=[{"op": "Decode", "columns": ["tags"]}, {"op": "Categorify", "columns": ["tags"]}])
    assert same_as_threads(make, shards, tmp_path, local_cluster, memory_budget=64 << 10) > 3
