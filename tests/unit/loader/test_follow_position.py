"""Follow mode's positions and the shards they stand on (``etl.loader.follow_position``): a restart refuses a saved
position whose shards are not the ones it counted (order, contents, row counts), and a following pass refuses a
shard that changes after its poll. Each refusal is one ``InputError`` naming the directory or the shard."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from etl.errors import ConfigError, InputError
from etl.io.arrivals_manifest import write_arrivals
from etl.loader import Loader
from etl.loader.follow import FollowAssembler
from etl.loader.follow_position import FollowPosition
from tests.unit.loader.test_follow import add_shard, list_shard, loader, rows, shard_table
from tests.unit.loader.test_follow import stream as stream  # the fixture: a schema, a pipeline and an empty raw/

HEX = "ab" * 32


def take(ld, n: int, it: Iterator | None = None, timeout: float = 10.0) -> list[int]:
    """The row ids of the next batches of ``it`` (a new iteration of ``ld`` by default) holding ``n`` rows; the loader
    is closed after ``timeout`` seconds (so a pass that waits for rows that never come ends the iteration instead of
    hanging the test)."""
    timer = threading.Timer(timeout, ld.close)
    timer.start()
    try:
        return rows(iter(ld) if it is None else it, n)
    finally:
        timer.cancel()


def three_shards(stream: Path, first: int = 0) -> None:
    for i in range(3):
        add_shard(stream, i, first + 100 * i, 100)


def follower(stream: Path, state: dict | None = None, source: str = "raw", **kw) -> Loader:
    """A following loader of ``source`` with batches of 40 rows and shuffle buffers of 80, started from ``state``
    (if given)."""
    ld = loader(stream, source=source, **{"batch_size": 40, "shuffle_buffer": 80, "idle_flush": 30} | kw)
    if state is not None:
        ld.load_state_dict(state)
    return ld


def state_in_third_shard(stream: Path, **kw) -> tuple[list[int], dict]:
    """Batches of 40 rows from shuffle buffers of 80 up to 240 rows, and the state after them: in part-00002, the
    buffer of its last 60 rows not closed (so no digest of the shards of a closed buffer is saved)."""
    ld = follower(stream, **kw)
    got = take(ld, 240)
    state = ld.state_dict()
    ld.close()
    assert (state["follow"]["before"], state["follow"]["row"], state["follow"]["buffer_rows"]) == (2, 40, None), state
    return got, state


def test_a_shard_replaced_between_its_poll_and_its_read_is_an_error(stream: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """part-00001 is replaced (renamed over: same name, same row count, other rows) right after the poll that cut
    its pieces by its footer: its rows are refused, never delivered."""
    add_shard(stream, 0, 0, 300)
    add_shard(stream, 1, 300, 300)
    polled = FollowAssembler._shard_pieces

    def poll_then_replace(self: FollowAssembler, index: int, path: Path) -> list:
        pieces = polled(self, index, path)
        if path.name == "part-00001.parquet":
            pq.write_table(shard_table(10_000, 300), path.with_name(".swap.tmp"), row_group_size=128)
            os.replace(path.with_name(".swap.tmp"), path)
        return pieces

    monkeypatch.setattr(FollowAssembler, "_shard_pieces", poll_then_replace)
    ld = loader(stream, shuffle=False, idle_flush=30)
    got: list[int] = []
    timer = threading.Timer(10, ld.close)  # without the check, the loop would wait for more shards
    timer.start()
    with pytest.raises(InputError, match=r"part-00001\.parquet: replaced since it was polled"):
        for b in ld:
            got += b.dense[:, 0].long().tolist()
    timer.cancel()
    ld.close()
    assert not [r for r in got if r >= 10_000]


def test_a_shard_touched_after_its_poll_is_read_on(stream: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard whose modification time changes after its poll, its bytes unchanged: its footer is the one polled,
    so its rows are delivered as usual."""
    add_shard(stream, 0, 0, 300)
    add_shard(stream, 1, 300, 300)
    polled = FollowAssembler._shard_pieces

    def poll_then_touch(self: FollowAssembler, index: int, path: Path) -> list:
        pieces = polled(self, index, path)
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
        return pieces

    monkeypatch.setattr(FollowAssembler, "_shard_pieces", poll_then_touch)
    ld = loader(stream)
    assert sorted(take(ld, 600)) == list(range(600))
    ld.close()


@pytest.mark.parametrize("shards", [1, 4])
def test_a_followed_directory_recreated_under_the_loader_is_an_error(stream: Path, shards: int) -> None:
    """The followed directory is removed and made again, and its producer starts again at part-00000 with other
    rows: behind the loader (part-00002, the last shard it polled, is gone) or past it (part-00002 is another
    file). Either way the next poll refuses it, rather than wait for part-00003 or deliver it without the rest."""
    three_shards(stream)
    ld = loader(stream)
    it = iter(ld)
    assert sorted(take(ld, 300, it)) == list(range(300))
    shutil.rmtree(stream / "raw")
    (stream / "raw").mkdir()
    for i in range(shards):
        add_shard(stream, i, 10_000 + 100 * i, 100)
    with pytest.raises(InputError, match=r"part-00002\.parquet: (gone|replaced) since it was polled"):
        take(ld, 1, it)
    ld.close()


def test_an_arrival_order_rewritten_while_stopped_is_an_error(stream: Path) -> None:
    """Producer manifest [a, b, c], the consumer stopped in c; the manifest rewritten to [a, d, c, b]: c is still
    shard 2, but a restart would deliver b's rows again and never d's. The restart refuses it."""
    for i, name in enumerate("abc"):
        list_shard(stream, f"{name}.parquet", 100 * i, 100)
    got, state = state_in_third_shard(stream, arrivals="manifest")
    assert state["follow"]["shard"] == "c.parquet"
    pq.write_table(shard_table(300, 100), stream / "raw" / "d.parquet")
    write_arrivals(stream / "raw", ["a.parquet", "d.parquet", "c.parquet", "b.parquet"])
    again = follower(stream, state, arrivals="manifest")
    with pytest.raises(InputError, match=r"raw: the 3 shard\(s\) up to c\.parquet are not the ones the saved position counted"):
        take(again, 1)
    again.close()


def test_a_directory_recreated_while_stopped_is_an_error(stream: Path) -> None:
    """The consumer stopped in part-00002; the directory made again, its producer at part-00003 with other rows:
    the same names, other shards. The restart refuses it."""
    three_shards(stream)
    got, state = state_in_third_shard(stream)
    shutil.rmtree(stream / "raw")
    (stream / "raw").mkdir()
    for i in range(4):
        add_shard(stream, i, 10_000 + 100 * i, 100)
    again = follower(stream, state)
    with pytest.raises(InputError, match=r"raw: the 3 shard\(s\) up to part-00002\.parquet have the names .* not their contents"):
        take(again, 1)
    again.close()


def test_a_state_from_another_directory_is_an_error_and_from_a_copy_continues(stream: Path) -> None:
    three_shards(stream)
    got, state = state_in_third_shard(stream)
    shutil.copytree(stream / "raw", stream / "copy")
    (stream / "raw").rename(stream / "first")
    (stream / "raw").mkdir()
    three_shards(stream, first=10_000)  # another directory with the same shard names
    (stream / "raw").rename(stream / "other")
    other = follower(stream, state, source="other")
    with pytest.raises(InputError, match=r"other: the 3 shard\(s\) up to part-00002\.parquet have the names .* not their contents"):
        take(other, 1)
    other.close()
    copy = follower(stream, state, source="copy", idle_flush=0.1)  # the same shards at another path: the same stream
    assert sorted(got + take(copy, 300 - len(got))) == list(range(300))
    copy.close()


def test_a_position_the_shards_do_not_hold_is_an_error(stream: Path) -> None:
    three_shards(stream)
    _, state = state_in_third_shard(stream)
    beyond = state | {"follow": state["follow"] | {"row": 10_000}}
    again = follower(stream, beyond)
    with pytest.raises(InputError, match=r"part-00002\.parquet: a saved position starts at row 10000 of this rank's 100 rows"):
        take(again, 1)
    again.close()
    first = loader(stream, idle_flush=30)  # shuffle buffers of 200 rows over part-00000 and part-00001
    take(first, 64)
    state = first.state_dict()
    first.close()
    assert (state["follow"]["buffer_rows"], state["follow"]["end_shard"]) == (200, "part-00001.parquet")
    for rows_, error, match in ((100, InputError, r"raw: a saved position's buffer of 100 rows .* does not end in part-00001\.parquet"),
                                (500, ConfigError, r"buffer of 500 rows, more than shuffle_buffer=200")):  # fmt: skip
        again = loader(stream, idle_flush=30)
        again.load_state_dict(state | {"follow": state["follow"] | {"buffer_rows": rows_}})
        with pytest.raises(error, match=match):
            take(again, 1)
        again.close()


def test_a_position_at_the_end_of_a_ranks_slice_continues(stream: Path) -> None:
    """Rank 1 of 2 takes rows 50..100 of a 101-row shard (51 rows): a position after all of them is within it."""
    add_shard(stream, 0, 0, 101)
    settings = {"rank": 1, "world_size": 2, "batch_size": 17, "shuffle_buffer": 51, "drop_last": True}
    first = loader(stream, **settings)
    got = take(first, 51)
    state = first.state_dict()
    first.close()
    assert (state["follow"]["row"], state["follow"]["buffer_rows"]) == (51, None)
    add_shard(stream, 1, 101, 34)
    again = loader(stream, **settings)
    again.load_state_dict(state)
    assert sorted(got + take(again, 17)) == list(range(50, 101)) + list(range(118, 135))
    again.close()


def test_a_position_saved_before_its_digests_still_loads_and_positions_after_carry_them(stream: Path) -> None:
    """A position saved without the digests of the shards up to it (by an earlier version) is checked as then (its
    shard and its buffer's end are where they were, its buffer's shards have their footers) and against the shards'
    row counts; the rows after it come exactly once, and the positions saved after it carry the digests."""
    three_shards(stream)
    got, state = state_in_third_shard(stream)
    assert len(state["follow"]["listing_sha256"]) == len(state["follow"]["footers_sha256"]) == 64
    older = state | {"follow": {k: v for k, v in state["follow"].items() if k not in ("listing_sha256", "footers_sha256")}}
    add_shard(stream, 3, 300, 100)
    after = []
    for saved in (state, older):  # the positions after the next batch (in the buffer from part-00002, row 40)
        again = follower(stream, saved)
        take(again, 40)
        after.append(again.state_dict())
        again.close()
    assert after[1] == after[0] and after[1]["follow"]["footers_sha256"] == state["follow"]["footers_sha256"]
    again = follower(stream, older, idle_flush=0.1)
    assert sorted(got + take(again, 160)) == list(range(400))
    again.close()


def test_position_from_dict_checks_every_field() -> None:
    pos = FollowPosition("b.parquet", 1, 5, 2, 100, 40, "d.parquet", 3, HEX, HEX, HEX)
    assert FollowPosition.from_dict(pos.to_dict()) == pos
    assert FollowPosition.from_dict(FollowPosition().to_dict()) == FollowPosition()
    good = pos.to_dict()
    for change in ({"listing_sha256": "ab"}, {"footers_sha256": 3}, {"span_sha256": "AB" * 32}, {"listing_sha256": None},
                   {"delivered": 100}, {"buffer_rows": 0, "delivered": 0}, {"row": True}, {"shard": None}):  # fmt: skip
        with pytest.raises(ConfigError, match="not a follow-mode loader position"):
            FollowPosition.from_dict(good | change)
    with pytest.raises(ConfigError, match="not a follow-mode loader position"):
        FollowPosition.from_dict({"buffer_no": 3})  # no shard yet: nothing else
