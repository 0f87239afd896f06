"""History as a streaming state of the loader on raw shards (etl.ops.history, etl.loader.stream_state): the lists
equal those of etl preprocess on time-ordered input, row for row; each epoch starts empty; a resumed loader gives
the rows and histories of an uninterrupted one; late rows (allowed_lateness); max_keys evictions; refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etl import Loader
from etl.errors import ConfigError, RowError
from etl.pipeline import Pipeline, saved_streams
from etl.preprocess import preprocess
from tests.unit.preprocess.test_keyed import events, make_pipeline, outputs, write_shards


def time_ordered(n: int, seed: int) -> pa.Table:
    """``events`` sorted by time (ties kept in input order), ``eid`` renumbered to the new position."""
    table = events(n, seed=seed).filter(pc.is_valid(pc.field("user")))
    table = table.take(pc.sort_indices(table, [("ts", "ascending")]))  # a stable sort
    return table.set_column(table.schema.get_field_index("eid"), "eid", pa.array(np.arange(table.num_rows), pa.int64()))


def streamed(tmp: Path, shards: list[Path], batch_size: int = 97, **kw: Any) -> list[tuple[list[int], int]]:
    """Each row's (hist_item, hist_len) as the loader on raw shards gives them, in row order."""
    loader = Loader(shards, pipeline=tmp / "pipeline.yaml", artifacts=tmp / "artifacts", batch_size=batch_size, shuffle=False,
                    drop_last=False, **kw)  # fmt: skip
    return rows_of(loader)


def rows_of(batches: Any) -> list[tuple[list[int], int]]:
    out = []
    for b in batches:
        values, offsets = b.lists["hist_item"]
        for i in range(len(b)):
            out.append((values[offsets[i] : offsets[i + 1]].tolist(), int(b.lengths["hist_len"][i])))
    return out


def fitted(tmp: Path, shards: list[Path], **history: Any) -> Pipeline:
    p = make_pipeline(tmp, tiebreak=[], **history)
    p.fit(shards)
    p.save(tmp / "artifacts")
    return p


@pytest.mark.parametrize(("max_len", "ttl"), [(1, None), (3, 6), (50, None)])
def test_streaming_lists_equal_the_offline_ones_on_time_ordered_input(tmp_path: Path, max_len: int, ttl: int | None) -> None:
    table = time_ordered(3000, seed=max_len)
    shards = write_shards(table, tmp_path / "raw", [1000, 1700], 400)
    fitted(tmp_path, shards, max_len=max_len, ttl=ttl)
    preprocess(make_pipeline(tmp_path, tiebreak=[], max_len=max_len, ttl=ttl), shards, tmp_path / "out", artifacts=tmp_path / "artifacts")
    offline = {r["eid"]: (r["hist_item"], r["hist_len"]) for r in outputs(tmp_path / "out").to_pylist()}
    got = streamed(tmp_path, shards)
    assert len(got) == table.num_rows
    assert got == [offline[e] for e in range(table.num_rows)]
    assert any(n == max_len for _, n in got) and any(n == 0 for _, n in got)
    # every epoch starts from an empty state: the second gives the same lists
    loader = Loader(shards, pipeline=tmp_path / "pipeline.yaml", artifacts=tmp_path / "artifacts", batch_size=97, shuffle=False, drop_last=False)
    first = rows_of(loader)
    loader.set_epoch(1)
    assert rows_of(loader) == first == got


def test_a_resumed_loader_gives_the_histories_of_an_uninterrupted_one(tmp_path: Path) -> None:
    table = time_ordered(2000, seed=7)
    shards = write_shards(table, tmp_path / "raw", [900], 300)
    fitted(tmp_path, shards, max_len=4)
    want = streamed(tmp_path, shards, batch_size=64)
    for workers in (0, 2):
        kw = dict(pipeline=tmp_path / "pipeline.yaml", artifacts=tmp_path / "artifacts", batch_size=64, shuffle=False, drop_last=False,
                  num_workers=workers)  # fmt: skip
        loader = Loader(shards, **kw)
        it = iter(loader)
        head = rows_of(next(it) for _ in range(11))
        state = loader.state_dict()
        rows_of(next(it) for _ in range(3))  # batches past the saved state: the resumed loader gives them again
        loader.close()
        resumed = Loader(shards, **kw)
        resumed.load_state_dict(state)
        assert head + rows_of(resumed) == want


def late_table(times: list[int], users: list[int]) -> pa.Table:
    n = len(times)
    base = events(n, seed=1)
    table = base.set_column(base.schema.get_field_index("ts"), "ts", pa.array(times, pa.int64()))
    table = table.set_column(table.schema.get_field_index("user"), "user", pa.array(users, pa.int64()))
    items = pa.array([f"i{k}" for k in range(n)])  # one item per row: its history names the rows
    return table.set_column(table.schema.get_field_index("item"), "item", items)


def test_late_rows(tmp_path: Path) -> None:
    # user 1: times 10, 20, 30, then 25 (5 late), then 40; user 2: 50, then 10 (40 late)
    table = late_table([10, 20, 30, 25, 40, 50, 10], [1, 1, 1, 1, 1, 2, 2])
    shards = write_shards(table, tmp_path / "raw", [], 7)
    fitted(tmp_path, shards, max_len=3, allowed_lateness=5)
    with pytest.raises(RowError) as e:
        streamed(tmp_path, shards, batch_size=7)
    assert (e.value.path, e.value.row_group, e.value.row, e.value.column) == (str(shards[0]), 0, 6, "ts")
    assert "allowed_lateness 5" in str(e.value)
    ok = write_shards(table.slice(0, 6), tmp_path / "ok", [], 6)
    got = streamed(tmp_path, ok, batch_size=4)
    item = [row[0] for row in got]  # histories as item ids
    loader = Loader(ok, pipeline=tmp_path / "pipeline.yaml", artifacts=tmp_path / "artifacts", batch_size=6, shuffle=False, drop_last=False)
    b = next(iter(loader))
    own = b.sparse[:, b.sparse_names.index("item")].tolist()  # each row's own item id
    assert item[0] == [] and item[1] == own[:1] and item[2] == own[:2]
    assert item[3] == own[:2]  # late (25 < 30): only events strictly before 25, never the later 30
    assert item[4] == [own[1], own[3], own[2]]  # 40: the latest 3 of 10, 20, 25, 30 in time order, the late 25 among them
    assert item[5] == []
    # beyond the allowed lateness with the default 0: the first out-of-order row stops the loader
    fitted(tmp_path, shards, max_len=3)
    with pytest.raises(RowError, match="allowed_lateness 0") as e:
        streamed(tmp_path, ok, batch_size=4)
    assert e.value.row == 3


def test_max_keys_evicts_the_least_recently_seen(tmp_path: Path) -> None:
    table = late_table([1, 2, 3, 4, 5], [1, 2, 3, 1, 3])
    shards = write_shards(table, tmp_path / "raw", [], 5)
    fitted(tmp_path, shards, max_len=3, max_keys=2)
    loader = Loader(shards, pipeline=tmp_path / "pipeline.yaml", artifacts=tmp_path / "artifacts", batch_size=5, shuffle=False, drop_last=False)
    got = rows_of(loader)
    # user 3 evicts user 1 (seen before user 2), then user 1 evicts user 2: user 1 starts empty, user 3 keeps its event
    assert [n for _, n in got] == [0, 0, 0, 0, 1]
    assert loader.state_dict()[saved_streams.STATE_KEY]["hist_*"]["evictions"] == 2
    assert loader.stats.history_evictions == 2 and loader.stats.as_dict()["history_evictions"] == 2
    rows_of(loader)  # the next epoch starts empty and evicts the same keys again
    assert loader.stats.history_evictions == 4


def test_refusals(tmp_path: Path) -> None:
    table = time_ordered(200, seed=3)
    shards = write_shards(table, tmp_path / "raw", [], 200)
    p = make_pipeline(tmp_path, max_len=2)
    p.fit(shards)
    p.save(tmp_path / "artifacts")
    with pytest.raises(ConfigError, match="tiebreak"):
        Loader(shards, pipeline=tmp_path / "pipeline.yaml", artifacts=tmp_path / "artifacts", batch_size=10, shuffle=False)
    fitted(tmp_path, shards, max_len=2)
    with pytest.raises(ConfigError, match="shuffle=False"):
        Loader(shards, pipeline=tmp_path / "pipeline.yaml", artifacts=tmp_path / "artifacts", batch_size=10, shuffle=True)
    fitted(tmp_path, shards, max_len=2, min_len=1)
    with pytest.raises(ConfigError, match="min_len"):
        Loader(shards, pipeline=tmp_path / "pipeline.yaml", artifacts=tmp_path / "artifacts", batch_size=10, shuffle=False)


def test_a_following_loader_gives_the_same_histories(tmp_path: Path) -> None:
    table = time_ordered(600, seed=11)
    shards = write_shards(table, tmp_path / "raw", [250], 100)
    fitted(tmp_path, shards, max_len=3)
    want = streamed(tmp_path, shards, batch_size=50)
    loader = Loader(tmp_path / "raw", pipeline=tmp_path / "pipeline.yaml", artifacts=tmp_path / "artifacts", follow=True, batch_size=50,
                    shuffle=False, poll_interval=0.05, idle_flush=0.2)  # fmt: skip
    it = iter(loader)
    head = rows_of(next(it) for _ in range(5))
    state = loader.state_dict()
    loader.close()
    resumed = Loader(tmp_path / "raw", pipeline=tmp_path / "pipeline.yaml", artifacts=tmp_path / "artifacts", follow=True, batch_size=50,
                     shuffle=False, poll_interval=0.05, idle_flush=0.2)  # fmt: skip
    resumed.load_state_dict(state)
    it = iter(resumed)
    assert head + rows_of(next(it) for _ in range(7)) == want
    resumed.close()


def test_two_history_ops_on_raw_shards_are_refused(tmp_path: Path) -> None:
    """Each History's state reads its key's hash and time from the same carried columns: one per loader."""
    shards = write_shards(time_ordered(200, seed=4), tmp_path / "raw", [], 200)
    by_item = {"op": "History", "key": "item", "time": "ts", "columns": ["user"], "max_len": 2, "prefix": "by_item_"}
    p = make_pipeline(tmp_path, tiebreak=[], ops_after=[by_item])
    p.fit(shards)
    p.save(tmp_path / "artifacts")
    with pytest.raises(ConfigError, match="2 History ops.*at most one"):
        Loader(shards, pipeline=tmp_path / "pipeline.yaml", artifacts=tmp_path / "artifacts", batch_size=10, shuffle=False)
