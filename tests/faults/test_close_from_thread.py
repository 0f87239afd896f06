"""``Loader.close`` called by another thread while the consumer waits for a batch (how a following loader is
stopped): the consumer's loop ends as after a last batch, no thread of the loader is left, the position stays after
the last batch handed out, and a later pass continues from there."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.loader import Loader
from tests.conftest import etl_threads, new_threads, stacks

PIPELINE = "name: stream\nschema: schema.yaml\nops:\n  - {op: FillMissing, columns: [rid], value: 0}\n"
SCHEMA = "name: stream\ncolumns:\n  - {name: label, role: label, dtype: int64}\n  - {name: rid, role: dense, dtype: int64}\n"
ROWS = 4000


@pytest.fixture()
def raw(tmp_path: Path) -> Path:
    (tmp_path / "schema.yaml").write_text(SCHEMA)
    (tmp_path / "pipeline.yaml").write_text(PIPELINE)
    (tmp_path / "raw").mkdir()
    for i in range(2):
        rid = np.arange(i * ROWS // 2, (i + 1) * ROWS // 2, dtype=np.int64)
        pq.write_table(pa.table({"label": np.zeros(len(rid), np.int64), "rid": rid}), tmp_path / f"raw/part-0000{i}.parquet", row_group_size=500)
    return tmp_path / "raw"


class Consumer:
    """Iterates ``loader`` in a thread of its own, sleeping ``step`` per batch; records the rows and how it ended."""

    def __init__(self, loader: Loader, step: float):
        self.loader, self.step = loader, step
        self.rows: list[int] = []
        self.ended_with: BaseException | None = None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        try:
            for batch in self.loader:
                self.rows.extend(batch.dense[:, 0].long().tolist())
                time.sleep(self.step)
        except BaseException as e:  # recorded for the test to see
            self.ended_with = e


def close_while_consuming(loader: Loader, consumer: Consumer, after: float) -> None:
    time.sleep(after)
    loader.close()
    consumer.thread.join(10)
    assert not consumer.thread.is_alive(), "the consumer still waits after close()"
    assert consumer.ended_with is None, f"the loop ended with {consumer.ended_with!r}, not as after a last batch"


def test_a_following_loader_closed_from_another_thread_ends_its_consumers_loop(raw: Path) -> None:
    before = etl_threads()
    loader = Loader(raw, pipeline=raw.parent / "pipeline.yaml", batch_size=100, follow=True, poll_interval=0.05, idle_flush=0.1)
    consumer = Consumer(loader, step=0.0)
    close_while_consuming(loader, consumer, after=1.0)  # every row delivered long before: it waits for a shard
    assert sorted(consumer.rows) == list(range(ROWS))
    assert loader.state_dict()["follow"]["shard"] == "part-00001.parquet"
    assert not (left := new_threads(before)), stacks(left)


def test_an_epoch_closed_from_another_thread_stops_and_a_later_pass_delivers_the_rest(raw: Path) -> None:
    before = etl_threads()
    loader = Loader(raw, pipeline=raw.parent / "pipeline.yaml", batch_size=50, shuffle=True, seed=3, num_workers=2)
    consumer = Consumer(loader, step=0.01)
    close_while_consuming(loader, consumer, after=0.3)
    delivered = len(consumer.rows) // 50
    assert 0 < delivered < len(loader) and len(consumer.rows) == 50 * delivered
    assert loader.state_dict()["position"] == delivered
    rest = [r for batch in loader for r in batch.dense[:, 0].long().tolist()]
    assert sorted(consumer.rows + rest) == list(range(ROWS))  # every row once across the two passes
    loader.close()
    assert not (left := new_threads(before)), stacks(left)
