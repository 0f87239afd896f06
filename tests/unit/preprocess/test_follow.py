"""preprocess_follow in process: shards added while it runs, the stop event, the idle stop, a pipeline to fit."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import yaml

from etl.errors import ConfigError
from etl.io.processed import read_manifest
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.preprocess.follow import preprocess_follow
from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import REPO, criteo_shards, tree_bytes

HASH = REPO / "pipelines/criteo_hash.yaml"


def test_shards_added_while_running_are_appended_then_the_stop_event_ends_it(tmp_path: Path) -> None:
    staged, raw = tmp_path / "staged", tmp_path / "raw"
    generate(load_schema(REPO / "schemas/criteo.yaml"), 1500, 3, staged, seed=2)
    raw.mkdir()
    stop = threading.Event()

    def produce() -> None:
        for p in sorted(staged.glob("*.parquet")):
            os.rename(p, raw / p.name)
            time.sleep(0.1)
        while not (tmp_path / "out/manifest.json").exists() or len(read_manifest(tmp_path / "out").files) < 3:
            time.sleep(0.02)
        stop.set()

    producer = threading.Thread(target=produce)
    producer.start()
    summary = preprocess_follow(Pipeline.from_file(HASH), raw, tmp_path / "out", stop=stop, poll_interval=0.02, workers=2,
                                stop_after_idle=60)  # fmt: skip
    producer.join()
    assert (summary.files, summary.files_kept, summary.files_committed, summary.totals.rows_in) == (3, 0, 3, 1500)
    preprocess(Pipeline.from_file(HASH), sorted(raw.glob("*.parquet")), tmp_path / "ref")
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "ref")
    again = preprocess_follow(Pipeline.from_file(HASH), raw, tmp_path / "out", stop=threading.Event(), poll_interval=0.02, stop_after_idle=0.1)
    assert (again.files_kept, again.files_committed) == (3, 0)
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "ref")


def test_a_pipeline_with_ops_to_fit_is_refused(tmp_path: Path) -> None:
    (tmp_path / "raw").mkdir()
    with pytest.raises(ConfigError, match="fitted pipeline"):
        preprocess_follow(Pipeline.from_file(REPO / "pipelines/criteo.yaml"), tmp_path / "raw", tmp_path / "out", stop=threading.Event())


def test_a_rerun_with_on_error_raise_that_fails_leaves_the_quarantine_mode_output_as_it_was(tmp_path: Path) -> None:
    """The shard that quarantined rows is redone and raises at its first bad row: nothing of the earlier output is
    removed before this run commits a file of its own."""
    from etl.errors import RowError

    raw = tmp_path / "raw"
    criteo_shards(raw)
    out = tmp_path / "out"
    first = preprocess_follow(Pipeline.from_file(HASH), raw, out, stop=threading.Event(), stop_after_idle=0, on_error="quarantine")
    assert (first.files_committed, first.totals.rows_quarantined) == (2, 1)
    before = tree_bytes(out)
    with pytest.raises(RowError, match="part-00001.parquet.*C1"):
        preprocess_follow(Pipeline.from_file(HASH), raw, out, stop=threading.Event(), stop_after_idle=0, on_error="raise")
    assert tree_bytes(out) == before


@pytest.mark.parametrize("keyed", ["History", "Groupby"])
def test_a_pipeline_with_history_or_groupby_is_refused_before_any_shard(tmp_path: Path, keyed: str) -> None:
    schema = REPO / "schemas/events.yaml"
    op = ({"op": "History", "columns": ["item_id"], "key": "user_id", "time": "timestamp", "max_len": 5} if keyed == "History"
          else {"op": "Groupby", "by": ["session_id"], "aggs": {"item_id": ["count"]}})  # fmt: skip
    columns = ["user_id", "item_id", "category"]
    ids = [{"op": "Decode", "columns": columns}, {"op": "Hash", "columns": columns, "num_buckets": 100}]
    doc = {"name": "keyed", "schema": str(schema), "ops": [*ids, op]}
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(doc))
    raw = tmp_path / "raw"
    generate(load_schema(schema), 200, 1, raw, seed=3)  # a shard is there at the start: the refusal comes before it is read
    with pytest.raises(ConfigError, match=f"^keyed: {keyed} needs every row of a key.*without --follow"):
        preprocess_follow(Pipeline.from_file(tmp_path / "pipeline.yaml"), raw, tmp_path / "out", stop=threading.Event(), stop_after_idle=0)
    assert not (tmp_path / "out").exists()
