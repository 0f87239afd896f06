"""Follow mode (``Loader(follow=True)``, ``etl.loader.follow``): arrival order, the shuffle window, idle flushes,
positions and resuming, ranks, and shutdown. Row ids ride in a dense column, numbered in arrival order."""

from __future__ import annotations

import gc
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.errors import ConfigError, InputError
from etl.io.arrivals_manifest import read_arrivals, write_arrivals
from etl.loader import Loader
from etl.loader.follow_position import FollowPosition
from tests.conftest import etl_threads, new_threads, stacks

SCHEMA = "name: stream\ncolumns:\n  - {name: label, role: label, dtype: int64}\n  - {name: rid, role: dense, dtype: int64}\n"
PIPELINE = "name: stream\nschema: schema.yaml\nops:\n  - {op: FillMissing, columns: [rid], value: 0}\n"


@pytest.fixture()
def stream(tmp_path: Path) -> Path:
    (tmp_path / "schema.yaml").write_text(SCHEMA)
    (tmp_path / "pipeline.yaml").write_text(PIPELINE)
    (tmp_path / "raw").mkdir()
    return tmp_path


def shard_table(first: int, rows: int) -> pa.Table:
    return pa.table({"label": pa.array(np.zeros(rows, np.int64)), "rid": pa.array(np.arange(first, first + rows, dtype=np.int64))})


def add_shard(stream: Path, index: int, first: int, rows: int, row_group: int = 128) -> None:
    """Shard ``index`` with row ids ``first ..``, written under a temporary name and renamed."""
    tmp = stream / "raw" / f".part-{index:05d}.parquet.0-0.tmp"
    pq.write_table(shard_table(first, rows), tmp, row_group_size=row_group)
    tmp.rename(stream / "raw" / f"part-{index:05d}.parquet")


def list_shard(stream: Path, name: str, first: int, rows: int) -> None:
    """A shard with row ids ``first ..`` written in place as ``name``, then appended to the producer manifest."""
    pq.write_table(shard_table(first, rows), stream / "raw" / name, row_group_size=128)
    write_arrivals(stream / "raw", (read_arrivals(stream / "raw") or []) + [name])


def loader(stream: Path, source: str = "raw", **kw) -> Loader:
    settings = {"batch_size": 64, "shuffle": True, "shuffle_buffer": 200, "seed": 3, "poll_interval": 0.02, "idle_flush": 0.2, "prefetch": 2} | kw
    return Loader(stream / source, pipeline=stream / "pipeline.yaml", follow=True, **settings)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def rows(batches: Iterator, n: int) -> list[int]:
    """The row ids of the first batches that hold ``n`` rows together."""
    out: list[int] = []
    for b in batches:
        out += b.dense[:, 0].long().tolist()
        if len(out) >= n:
            return out
    raise AssertionError("the iteration ended")


def test_shards_present_then_arriving_each_row_once_within_the_shuffle_window(stream: Path) -> None:
    add_shard(stream, 0, 0, 500)
    add_shard(stream, 1, 500, 300)
    ld = loader(stream)
    it = iter(ld)
    got = rows(it, 400)
    add_shard(stream, 2, 800, 450)
    got += rows(it, 1250 - len(got))
    ld.close()
    assert sorted(got) == list(range(1250))
    assert max(abs(i - r) for i, r in enumerate(got)) < 200  # rows leave at most shuffle_buffer rows from arrival order
    assert got != sorted(got)


def test_idle_flush_delivers_the_buffer_short_batch_only_without_drop_last(stream: Path) -> None:
    add_shard(stream, 0, 0, 150)  # less than a shuffle buffer, and than three batches
    for drop_last, sizes in ((False, [64, 64, 22]), (True, [64, 64])):
        ld = loader(stream, drop_last=drop_last)
        it = iter(ld)
        assert [len(next(it)) for _ in sizes] == sizes
        if drop_last:  # the 22 rows left wait for the next shard
            add_shard(stream, 1, 150, 42)
            assert len(next(it)) == 64
        ld.close()


def test_resume_from_state_dict_continues_with_the_same_batches(stream: Path) -> None:
    for i in range(3):
        add_shard(stream, i, 400 * i, 400, row_group=97)
    whole = loader(stream, idle_flush=30)
    expected = [b.dense[:, 0].long().tolist() for _, b in zip(range(18), whole)]
    whole.close()
    for k in (1, 4, 7, 15):  # inside a buffer, at a buffer's end, across shards
        first = loader(stream, idle_flush=30)
        it = iter(first)
        for _ in range(k):
            next(it)
        state = first.state_dict()
        first.close()
        again = loader(stream, idle_flush=30)
        again.load_state_dict(state)
        got = [b.dense[:, 0].long().tolist() for _, b in zip(range(18 - k), again)]
        again.close()
        assert got == expected[k:], k


def test_resume_after_an_idle_flush_delivers_the_rest_exactly_once(stream: Path) -> None:
    add_shard(stream, 0, 0, 170)
    first = loader(stream)
    it = iter(first)
    got = rows(it, 64) + rows(it, 64)  # the second batch is cut from a buffer the idle flush closed at 170 rows
    state = first.state_dict()
    assert state["follow"]["buffer_rows"] == 170 and state["follow"]["delivered"] == 128
    first.close()
    add_shard(stream, 1, 170, 300)
    again = loader(stream)
    again.load_state_dict(state)
    got += rows(iter(again), 470 - len(got))
    again.close()
    assert sorted(got) == list(range(470))


@pytest.mark.parametrize("arrivals", ["names", "manifest"])
def test_ranks_split_each_shard_and_together_deliver_every_row(stream: Path, arrivals: str) -> None:
    add_shard(stream, 0, 0, 301)
    add_shard(stream, 1, 301, 5)
    if arrivals == "manifest":
        write_arrivals(stream / "raw", ["part-00000.parquet", "part-00001.parquet"])
    got = []
    for rank in (0, 1):
        ld = loader(stream, rank=rank, world_size=2, arrivals=arrivals)
        got.append(rows(iter(ld), 152 if rank == 0 else 154))  # 150 + 2 rows, 151 + 3 rows
        ld.close()
    assert sorted(got[0] + got[1]) == list(range(306))
    assert sorted(got[0]) == [*range(150), 301, 302]


def test_a_shard_out_of_name_order_stops_the_iteration_with_an_error_naming_it(stream: Path) -> None:
    add_shard(stream, 5, 0, 100)
    ld = loader(stream)
    it = iter(ld)
    rows(it, 100)
    add_shard(stream, 4, 100, 100)
    with pytest.raises(InputError, match="part-00004.parquet"):
        rows(it, 100)
    ld.close()


def test_state_names_a_removed_shard(stream: Path) -> None:
    add_shard(stream, 0, 0, 100)
    add_shard(stream, 1, 100, 100)
    ld = loader(stream, shuffle_buffer=50, batch_size=50)
    rows(iter(ld), 150)
    state = ld.state_dict()
    ld.close()
    (stream / "raw" / "part-00000.parquet").unlink()
    again = loader(stream, shuffle_buffer=50, batch_size=50)
    again.load_state_dict(state)
    with pytest.raises(InputError, match="was removed"):
        next(iter(again))
    again.close()


@pytest.mark.parametrize("arrivals", ["names", "manifest"])
def test_a_shard_added_inside_a_partly_delivered_buffer_while_stopped_is_an_error(stream: Path, arrivals: str) -> None:
    """The saved buffer spans part-00000 and part-00002 and some of its rows were delivered: a shard that lands
    between them while the consumer is stopped would change the rebuilt buffer's rows, so some rows would come
    twice and others never. The restart refuses it."""
    add_shard(stream, 0, 0, 100)
    add_shard(stream, 2, 100, 100)
    if arrivals == "manifest":
        write_arrivals(stream / "raw", ["part-00000.parquet", "part-00002.parquet"])
    first = loader(stream, arrivals=arrivals, idle_flush=30)
    rows(iter(first), 64)  # one batch of the 200-row buffer over both shards
    state = first.state_dict()
    first.close()
    assert state["follow"]["buffer_rows"] == 200 and state["follow"]["delivered"] == 64
    add_shard(stream, 1, 200, 100)
    if arrivals == "manifest":
        write_arrivals(stream / "raw", ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"])
    again = loader(stream, arrivals=arrivals, idle_flush=30)
    again.load_state_dict(state)
    with pytest.raises(InputError, match="part-00002.parquet: a saved position names it as shard 1"):
        next(iter(again))
    again.close()


def test_a_shard_of_a_partly_delivered_buffer_replaced_while_stopped_is_an_error(stream: Path) -> None:
    """The saved buffer's rows come from three shards, some of them delivered: the middle shard replaced (same
    name, same size, other rows) while the consumer is stopped would make the rebuilt buffer deliver rows that
    were never in the stream it counted. The restart refuses it; unchanged shards restart as usual."""
    for i, n in enumerate((80, 80, 40)):
        list_shard(stream, f"s{i}.parquet", 80 * i, n)
    settings = {"arrivals": "manifest", "idle_flush": 30, "batch_size": 50}
    first = loader(stream, **settings)
    got = rows(iter(first), 50)
    state = first.state_dict()
    first.close()
    assert (state["follow"]["shard"], state["follow"]["end_shard"], state["follow"]["delivered"]) == ("s0.parquet", "s2.parquet", 50)
    again = loader(stream, **settings)
    again.load_state_dict(state)
    assert sorted(got + rows(iter(again), 150)) == list(range(200))  # the buffer's 200 rows, each once
    again.close()
    pq.write_table(shard_table(1000, 80), stream / "raw" / "s1.parquet", row_group_size=128)
    again = loader(stream, **settings)
    again.load_state_dict(state)
    with pytest.raises(InputError, match="s0.parquet to s2.parquet.*not as they were"):
        next(iter(again))
    again.close()


def test_close_break_and_drop_stop_every_thread(stream: Path) -> None:
    before = etl_threads()
    add_shard(stream, 0, 0, 100)
    ld = loader(stream)
    it = iter(ld)
    next(it)  # the pass now waits for shards
    ld.close()
    for _ in ld:
        break
    del ld, it
    gc.collect()
    # a thread ends once what it is doing ends (a first numba compile on a busy machine takes seconds): no speed
    # is asserted here, only that every thread stops
    assert not (left := new_threads(before)), stacks(left)


def test_settings_that_cannot_follow_are_config_errors(stream: Path) -> None:
    add_shard(stream, 0, 0, 10)
    with pytest.raises(ConfigError, match="num_workers"):
        loader(stream, num_workers=0)
    with pytest.raises(ConfigError, match="poll_interval"):
        loader(stream, poll_interval=0)
    with pytest.raises(ConfigError, match="not one"):
        Loader(stream / "raw" / "part-00000.parquet", pipeline=stream / "pipeline.yaml", follow=True)
    with pytest.raises(TypeError, match="no length"):
        len(loader(stream))
    fixed = Loader(stream / "raw", pipeline=stream / "pipeline.yaml", batch_size=4)
    with pytest.raises(ConfigError, match="following loader's state"):
        fixed.load_state_dict(loader(stream).state_dict())
    with pytest.raises(ConfigError, match="state_dict mismatch on batch_size"):
        loader(stream, batch_size=8).load_state_dict(loader(stream).state_dict())
    with pytest.raises(ConfigError, match="arrivals must be one of"):
        loader(stream, arrivals="mtime")
    with pytest.raises(ConfigError, match="goes with follow=True"):
        Loader(stream / "raw", pipeline=stream / "pipeline.yaml", arrivals="manifest")
    older = loader(stream).state_dict()
    del older["arrivals"]  # saved before arrival orders existed: name order
    loader(stream).load_state_dict(older)


def test_position_from_dict_refuses_what_to_dict_cannot_make() -> None:
    pos = FollowPosition("part-00001.parquet", 1, 5, 2, 100, 40, "part-00003.parquet", 3, "ab" * 32)
    assert FollowPosition.from_dict(pos.to_dict()) == pos
    saved_before_end_shards = {k: v for k, v in pos.to_dict().items() if k not in ("end_shard", "end_before", "span_sha256")}
    assert FollowPosition.from_dict(saved_before_end_shards) == FollowPosition("part-00001.parquet", 1, 5, 2, 100, 40)
    for bad in ({"shard": 3}, {"row": -1}, {"delivered": 5}, {"buffer_rows": 4, "delivered": 5}, {"other": 1}, {"end_shard": "a.parquet"},
                {"end_shard": 3, "end_before": 0}, {"before": 2, "end_shard": "a.parquet", "end_before": 1}, {"span_sha256": "ab"}):  # fmt: skip
        with pytest.raises(ConfigError):
            FollowPosition.from_dict(bad)


def test_manifest_order_delivers_the_listed_shards_in_the_listed_order(stream: Path) -> None:
    list_shard(stream, "zz.parquet", 0, 150)
    pq.write_table(shard_table(10_000, 50), stream / "raw" / "aa.parquet")  # not listed: not complete, never read
    ld = loader(stream, arrivals="manifest", shuffle=False)
    it = iter(ld)
    got = rows(it, 150)
    list_shard(stream, "mm.parquet", 150, 100)
    list_shard(stream, "bb.parquet", 250, 70)
    got += rows(it, 170)
    ld.close()
    assert got == list(range(320))  # zz, mm, bb: the manifest's order, not name order


def test_a_manifest_listing_the_shards_in_name_order_gives_the_batches_of_name_order(stream: Path) -> None:
    for i in range(3):
        add_shard(stream, i, 300 * i, 300, row_group=70)
    batches = {}
    for order in ("names", "manifest"):
        if order == "manifest":
            write_arrivals(stream / "raw", [f"part-{i:05d}.parquet" for i in range(3)])
        ld = loader(stream, arrivals=order, idle_flush=30)
        batches[order] = [(b.dense.clone(), b.label.clone()) for _, b in zip(range(12), ld)]  # 768 rows: from full shuffle buffers only
        ld.close()
    assert all(a[0].equal(b[0]) and a[1].equal(b[1]) for a, b in zip(batches["names"], batches["manifest"], strict=True))


def test_manifest_order_resumes_from_state_dict_exactly_once(stream: Path) -> None:
    list_shard(stream, "s9.parquet", 0, 230)
    list_shard(stream, "s1.parquet", 230, 170)
    first = loader(stream, arrivals="manifest")
    it = iter(first)
    got = rows(it, 64) + rows(it, 64) + rows(it, 64)
    state = first.state_dict()
    first.close()
    assert state["arrivals"] == "manifest" and state["follow"]["shard"] == "s9.parquet"
    with pytest.raises(ConfigError, match="state_dict mismatch on arrivals: saved 'manifest', this loader 'names'"):
        loader(stream).load_state_dict(state)
    list_shard(stream, "s5.parquet", 400, 250)
    again = loader(stream, arrivals="manifest")
    again.load_state_dict(state)
    got += rows(iter(again), 650 - len(got))
    again.close()
    assert sorted(got) == list(range(650))


def test_manifest_order_waits_for_the_manifest_and_is_stopped_by_a_broken_one(stream: Path) -> None:
    pq.write_table(shard_table(0, 100), stream / "raw" / "b.parquet")
    ld = loader(stream, arrivals="manifest")
    it = iter(ld)
    time.sleep(0.1)  # a few polls without a manifest
    list_shard(stream, "a.parquet", 100, 100)
    assert sorted(rows(it, 100)) == list(range(100, 200))
    write_arrivals(stream / "raw", ["b.parquet"])  # a.parquet removed from the listing
    with pytest.raises(InputError, match=r"_arrivals\.json: shards\[0\] is now 'b.parquet', and was 'a.parquet'"):
        rows(it, 1)
    ld.close()


def test_follows_a_prefix_in_object_storage(stream: Path, s3: str) -> None:
    from etl.io.fs import location

    prefix = location(f"{s3}/raw")
    for i, first in enumerate((0, 300)):
        add_shard(stream, i, first, 300)
    fs = prefix.fs
    fs.put_file(str(stream / "raw/part-00000.parquet"), f"{prefix.key}/part-00000.parquet")
    fs.put_file(str(stream / "raw/part-00001.parquet"), f"{prefix.key}/.part-00001.parquet.0-0.tmp")  # not complete yet
    ld = Loader(str(prefix), pipeline=stream / "pipeline.yaml", follow=True, batch_size=64, shuffle_buffer=100, poll_interval=0.05, idle_flush=0.2)
    it = iter(ld)
    got = rows(it, 300)
    fs.copy(f"{prefix.key}/.part-00001.parquet.0-0.tmp", f"{prefix.key}/part-00001.parquet")  # the store's "rename"
    got += rows(it, 300)
    ld.close()
    assert sorted(got) == list(range(600))


def test_follows_a_producer_manifest_in_object_storage(stream: Path, s3: str) -> None:
    from etl.io.fs import location

    prefix = location(f"{s3}/raw")
    list_shard(stream, "b.parquet", 0, 200)
    list_shard(stream, "a.parquet", 200, 100)
    fs = prefix.fs
    fs.put_file(str(stream / "raw/b.parquet"), f"{prefix.key}/b.parquet")
    fs.put_file(str(stream / "raw/a.parquet"), f"{prefix.key}/a.parquet")  # in place, not listed yet
    write_arrivals(prefix, ["b.parquet"])
    ld = Loader(str(prefix), pipeline=stream / "pipeline.yaml", follow=True, arrivals="manifest", batch_size=50, poll_interval=0.05, idle_flush=0.2)
    it = iter(ld)
    got = rows(it, 200)
    write_arrivals(prefix, ["b.parquet", "a.parquet"])  # one upload replaces the manifest
    got += rows(it, 100)
    ld.close()
    assert got == list(range(300))


def test_follows_the_output_of_preprocess_follow_in_output_order(stream: Path) -> None:
    """The output of ``etl preprocess --follow`` followed as it grows: the batches of its input followed the same
    way, then the rows of a shard committed later, and a restart from ``state_dict`` delivers the rest exactly once."""
    from etl.pipeline import Pipeline
    from etl.preprocess.follow import preprocess_follow

    for i in range(3):
        add_shard(stream, i, 300 * i, 300, row_group=70)
    out, stop = stream / "out", threading.Event()
    producer = threading.Thread(target=preprocess_follow, args=(Pipeline.from_file(stream / "pipeline.yaml"), stream / "raw", out),
                                kwargs={"stop": stop, "poll_interval": 0.02})  # fmt: skip
    producer.start()
    try:
        deadline = time.monotonic() + 30
        while len((read_json(out / "manifest.json") or {}).get("files", [])) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        batches = {}
        for source in ("raw", "out"):
            ld = loader(stream, source=source, idle_flush=30)
            batches[source] = [b.dense[:, 0].long().tolist() for _, b in zip(range(12), ld)]  # from full shuffle buffers only
            ld.close()
        assert batches["out"] == batches["raw"]
        with pytest.raises(ConfigError, match="followed in its own order; arrivals='manifest' is for raw shards"):
            loader(stream, source="out", arrivals="manifest")
        first = loader(stream, source="out")
        it = iter(first)
        got = rows(it, 64) + rows(it, 64)
        state = first.state_dict()
        first.close()
        assert state["arrivals"] == "processed" and state["follow"]["shard"] == "part-00000.parquet"
        add_shard(stream, 3, 900, 150)
        again = loader(stream, source="out")
        again.load_state_dict(state)
        got += rows(iter(again), 1050 - len(got))
        again.close()
        assert sorted(got) == list(range(1050))
    finally:
        stop.set()
        producer.join()


def test_a_followed_output_rewritten_with_other_artifacts_is_an_error_on_the_next_iteration(stream: Path) -> None:
    """``etl preprocess`` rerun with other artifacts over an output a loader follows, while the loader is stopped
    between two iterations: its files now hold rows transformed otherwise than the pipeline the loader opened (and
    whose ids the training uses). The next iteration refuses them rather than mix the two."""
    from etl.pipeline import Pipeline
    from etl.preprocess import preprocess

    for i in range(3):
        add_shard(stream, i, 300 * i, 300, row_group=70)
    shards = sorted((stream / "raw").glob("*.parquet"))
    preprocess(Pipeline.from_file(stream / "pipeline.yaml"), shards, stream / "out")
    ld = loader(stream, source="out", idle_flush=30)
    it = iter(ld)
    rows(it, 128)
    ld.close()
    (stream / "other.yaml").write_text(PIPELINE.replace("value: 0", "value: 7"))
    preprocess(Pipeline.from_file(stream / "other.yaml"), shards, stream / "out")
    with pytest.raises(InputError, match="manifest.json: part-00000.parquet: transformed with other artifacts"):
        rows(iter(ld), 1)
    ld.close()


def test_a_followed_file_rewritten_between_its_count_and_its_read_is_an_error(stream: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``etl preprocess`` rerun over a followed output (another input shard, the same pipeline: the artifacts check
    passes) right after a poll counted a file committed since the loader opened the output, before its first rows
    are read: file and manifest entry are rewritten consistently, yet the reader checks the file against the entry
    the poll counted, so it refuses the new file (sha256 mismatch naming it) and delivers none of its rows."""
    from etl.io.arrivals import Arrivals
    from etl.pipeline import Pipeline
    from etl.preprocess import preprocess

    for i in range(2):
        add_shard(stream, i, 300 * i, 300, row_group=70)
    first, second = sorted((stream / "raw").glob("*.parquet"))
    other = stream / "other.parquet"
    pq.write_table(shard_table(10_000, 300), other, row_group_size=70)
    pipeline = Pipeline.from_file(stream / "pipeline.yaml")
    preprocess(pipeline, [first], stream / "out")
    ld = loader(stream, source="out", poll_interval=10.0, idle_flush=0.05)  # no poll to see the rewrite before the read
    preprocess(pipeline, [first, second], stream / "out")  # part-00001.parquet committed after the loader opened the output
    counted = Arrivals.poll
    rewritten = threading.Event()

    def poll_then_rewrite(self: Arrivals) -> list:
        new = counted(self)
        if any(p.name == "part-00001.parquet" for p in new) and not rewritten.is_set():
            preprocess(pipeline, [first, other], stream / "out")
            rewritten.set()
        return new

    monkeypatch.setattr(Arrivals, "poll", poll_then_rewrite)
    got: list[int] = []
    with pytest.raises(InputError, match=r"manifest.json: file part-00001.parquet: sha256 \w+ differs from the manifest's"):
        for b in ld:
            got += b.dense[:, 0].long().tolist()
    ld.close()
    assert rewritten.is_set() and not [r for r in got if r >= 10_000]
