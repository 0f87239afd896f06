"""etl.bench.freshness: traced shards, their names and codes, the producer's schedule, one small run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.bench import freshness
from etl.bench.freshness import FreshnessSettings, Producer, measure_freshness, shard_codes, template_shard, traced_shard, write_shard
from etl.errors import ConfigError
from etl.io.arrivals_manifest import read_arrivals
from etl.pipeline import Pipeline
from etl.schema import Schema, parse_schema
from tests.conftest import REPO

HASH = REPO / "pipelines/criteo_hash.yaml"


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    return Pipeline.from_file(HASH)


def test_traced_shard_holds_row_ids_and_shard_number(pipeline: Pipeline, tmp_path: Path) -> None:
    template = template_shard(pipeline.schema, 50, tmp_path)
    shard = traced_shard(template, pipeline.schema, 3)
    assert freshness.trace_columns(pipeline.schema) == ("I1", "I2")
    assert shard.column("I1").to_pylist() == list(range(150, 200)) and set(shard.column("I2").to_pylist()) == {3}
    assert shard.schema == template.schema and shard.column("C1") == template.column("C1")


def test_write_shard_renames_a_complete_file_in_name_order(pipeline: Pipeline, tmp_path: Path) -> None:
    table = template_shard(pipeline.schema, 10, tmp_path)
    seen: list[list[str]] = []
    path = write_shard(tmp_path, 12, table, lambda: seen.append(sorted(p.name for p in tmp_path.glob("*.parquet"))))
    assert path.name == "part-000012.parquet" and seen == [[]] and pq.read_table(path) == table
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["part-000012.parquet"]


def test_shard_codes_are_the_pipeline_values_of_shard_numbers(pipeline: Pipeline, tmp_path: Path) -> None:
    template = template_shard(pipeline.schema, 10, tmp_path)
    codes = shard_codes(pipeline, template, 5)
    assert sorted(codes.values()) == [0, 1, 2, 3, 4]
    assert all(np.isclose(value, np.log1p(k), rtol=1e-6) for value, k in codes.items())  # criteo_hash: Log1p of the number


def test_a_schema_without_two_integer_dense_columns_cannot_be_traced() -> None:
    schema = parse_schema({"name": "s", "columns": [{"name": "label", "role": "label", "dtype": "int64"},
                                                        {"name": "x", "role": "dense", "dtype": "int64"}]})  # fmt: skip
    with pytest.raises(ConfigError, match="two integer dense columns"):
        freshness.trace_columns(schema)


def test_producer_writes_every_shard_and_stops_early_when_asked(pipeline: Pipeline, tmp_path: Path) -> None:
    template = template_shard(pipeline.schema, 10, tmp_path)
    (tmp_path / "a").mkdir()
    done = Producer(tmp_path / "a", template, pipeline.schema, 3, rate=100.0)
    done.start()
    done.join()
    assert done.error is None and len(done.renamed) == 3 and done.renamed == sorted(done.renamed)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [f"part-00000{k}.parquet" for k in range(3)]
    listing = Producer(tmp_path / "a", template, pipeline.schema, 2, rate=100.0, manifest=True)
    listing.start()
    listing.join()
    assert listing.error is None and len(listing.renamed) == 2 and read_arrivals(tmp_path / "a") == ["part-000000.parquet", "part-000001.parquet"]
    (tmp_path / "b").mkdir()
    slow = Producer(tmp_path / "b", template, pipeline.schema, 100, rate=0.01)
    slow.start()
    slow.stop()
    slow.join(timeout=10)
    assert not slow.is_alive() and len(slow.renamed) <= 1


def test_settings_out_of_range_are_refused() -> None:
    assert FreshnessSettings(rate=2, duration=3).shards == 7
    with pytest.raises(ConfigError, match="rate"):
        FreshnessSettings(rate=0).check()


@pytest.mark.parametrize("arrivals", ["names", "manifest"])
def test_a_small_run_sees_every_shard_once(tmp_path: Path, arrivals: str) -> None:
    settings = FreshnessSettings(rate=20, shard_rows=1000, duration=0.2, poll_interval=0.05, batch_size=500, step_factor=0.5, arrivals=arrivals)
    report, mbytes = measure_freshness(HASH, settings, tmp_path)
    f = report.freshness
    assert f is not None and f.shards == 5 and len(f.lags) == 5 and all(lag >= 0 for lag in f.lags) and f.arrivals == arrivals
    assert [s.name for s in report.stages] == ["shard transform", "follow"] and report.stages[1].rows == 5000
    assert mbytes > 0 and 0 <= report.data_wait <= 1


def test_a_failing_producer_ends_the_run_with_its_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The consumer waits for shards that will never come: the producer's error closes the loader and is raised."""
    real = freshness.traced_shard

    def fails_at_two(template: pa.Table, schema: Schema, index: int) -> pa.Table:
        if index == 2:
            raise OSError("No space left on device")
        return real(template, schema, index)

    monkeypatch.setattr(freshness, "traced_shard", fails_at_two)
    settings = FreshnessSettings(rate=20, shard_rows=500, duration=0.5, poll_interval=0.05, batch_size=200)
    with pytest.raises(RuntimeError, match="producer of the freshness bench failed: No space left"):
        measure_freshness(HASH, settings, tmp_path)
