"""etl.loader.stream_state: any streaming state driven through its contract; the Loader with online vocabularies: ids given per batch in
its row order whatever the worker count, each batch with exactly its own events, state in state_dict and as artifacts, exact
resume; the same under follow mode."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from etl.errors import ArtifactError, ConfigError, LoaderError
from etl.io.fs import locations
from etl.io.parquet import list_shards
from etl.loader import Loader
from etl.loader.stream_state import StreamStates
from etl.ops import Categorify
from etl.ops.base import InvalidState
from etl.ops.online_vocab import OnlineVocab, canonical_state
from etl.ops.stream import Carried, StreamInput, StreamSpec, StreamState, StreamStep
from etl.pipeline import Pipeline
from etl.schema import load_schema
from etl.tools.synth import generate

REPO = Path(__file__).resolve().parents[3]
ONLINE = ["C1", "C2", "C3"]


def pipeline_yaml(evict: str) -> str:
    extra = "evict: ttl, ttl_rows: 100" if evict == "ttl" else "evict: lfu"
    return f"""name: criteo_online
schema: {REPO / "schemas/criteo.yaml"}
ops:
  - {{op: FillMissing, columns: "@dense", value: 0}}
  - {{op: Decode, columns: "@categorical"}}
  - {{op: Categorify, columns: {{role: categorical, exclude: {ONLINE}}}, freq_threshold: 3}}
  - {{op: Categorify, columns: {ONLINE}, online: true, capacity: 8, admit_after: 2, max_size: 5, {extra}}}
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("online")
    generate(load_schema(REPO / "schemas/criteo.yaml"), 3000, 2, d / "raw", seed=1, cardinalities={"C1": 400, "C2": 100, "C3": 30})
    for evict in ("lfu", "ttl"):
        (d / f"{evict}.yaml").write_text(pipeline_yaml(evict))
        p = Pipeline.from_file(d / f"{evict}.yaml")
        p.fit(list_shards(locations([d / "raw"])))
        p.save(d / f"art-{evict}")
    return d


def loader(data: Path, evict: str = "lfu", **kw) -> Loader:
    settings = {"batch_size": 256, "shuffle": True, "shuffle_buffer": 700, "num_workers": 2, "copy": True} | kw
    return Loader(data / "raw", pipeline=data / f"{evict}.yaml", artifacts=data / f"art-{evict}", **settings)


def batches(ld: Loader, epochs: range) -> Iterator[tuple[torch.Tensor, dict]]:
    """(sparse, events as lists) of every batch of ``epochs`` (the first from the loader's position)."""
    for e in epochs:
        ld.set_epoch(e)
        for b in ld:
            events = {c: (ev.admitted_ids.tolist(), ev.admitted_keys.tolist(), ev.evicted_ids.tolist(), ev.evicted_keys.tolist())
                      for c, ev in b.vocab_events.items()}  # fmt: skip
            yield b.sparse.clone(), events


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(a, b))


@pytest.mark.parametrize("evict", ["lfu", "ttl"])
def test_ids_and_events_are_the_same_for_any_worker_count(data: Path, evict: str) -> None:
    runs = [list(batches(loader(data, evict, num_workers=w), range(2))) for w in (0, 1, 2)]
    assert same(runs[0], runs[1]) and same(runs[0], runs[2])
    events = [e for _, ev in runs[0] for e in ev.values()]
    assert sum(len(e[0]) for e in events) > 3 and sum(len(e[2]) for e in events) > 0  # ids given and taken back


def test_online_columns_hold_ids_in_range_and_the_others_are_untouched(data: Path) -> None:
    ld = loader(data)
    first = 2 + 1  # one OOV bucket
    cols = [ld.layout.sparse.index(c) for c in ONLINE]
    assert ld.layout.streamed == tuple(ONLINE) and ld.pipeline.cardinalities()["C1"] == first + 8
    got = list(batches(ld, range(1)))
    sparse = torch.cat([s for s, _ in got])
    assert sparse[:, cols].min() >= 1 and sparse[:, cols].max() < first + 8
    # every id a batch uses is admitted by it or before (seeded ids: 3 .. 7); an id evicted in a batch is admitted
    # again only in a later batch, and not used in between
    live = {c: set(range(first, first + 5)) for c in ONLINE}
    for s, events in got:
        for c, j in zip(ONLINE, cols):
            admitted, _, evicted, _ = events[c]
            assert not set(admitted) & live[c] and len(set(admitted)) == len(admitted), c
            named = live[c] | set(admitted)
            assert set(evicted) <= named and len(set(evicted)) == len(evicted), c
            assert {int(i) for i in s[:, j] if i >= first} <= named, c
            live[c] = named - set(evicted)
    art = _offline_artifacts(data)
    offline = Loader(data / "raw", pipeline=data / "offline.yaml", artifacts=art, batch_size=256, shuffle=True, shuffle_buffer=700)
    rest = [j for j in range(26) if j not in cols]
    for (s, _), b in zip(got, offline):
        assert torch.equal(s[:, rest].long(), b.sparse[:, rest].long())


def _offline_artifacts(data: Path) -> Path:
    """Artifacts of the pipeline without online columns (the same fit of the other columns)."""
    out = data / "art-offline"
    if not out.exists():
        text = pipeline_yaml("lfu").replace(f"{{role: categorical, exclude: {ONLINE}}}", '"@categorical"').splitlines()
        (data / "offline.yaml").write_text("\n".join(text[:-1]) + "\n")
        p = Pipeline.from_file(data / "offline.yaml")
        p.fit(list_shards(locations([data / "raw"])))
        p.save(out)
    return out


@pytest.mark.parametrize("evict", ["lfu", "ttl"])
@pytest.mark.parametrize("stop", [1, 2, 5, 11, 12, 13, 17])
def test_resume_gives_the_same_batches_and_events_as_an_uninterrupted_run(data: Path, stop: int, evict: str) -> None:
    whole = list(batches(loader(data, evict), range(2)))
    first = loader(data, evict)
    it = batches(first, range(2))
    got = [next(it) for _ in range(stop)]
    state = first.state_dict()
    assert isinstance(state["streams"]["C1"]["key"], bytes)
    first.close()
    resumed = loader(data, evict, num_workers=1)
    resumed.load_state_dict(state)
    got += list(batches(resumed, range(state["epoch"], 2)))
    assert same(got, whole)


def test_an_epoch_holds_the_state_of_each_batch_in_flight(data: Path) -> None:
    """The state after each batch can be produced until the consumer is past it: at most the ring's slots
    (prefetch + 2) and the one at the consumer's position."""
    ld = loader(data, prefetch=1)
    held = []
    for _ in ld:
        held.append(ld.streams.held()[0])
    assert max(held) <= 1 + 3 and min(held) >= 1 and len(held) == len(ld)


def test_the_consumer_never_waits_for_the_update_of_a_later_batch(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the assembler updates the vocabularies for a batch ahead, the consumer takes the batches already
    assembled: forgetting the states it is past does not wait for that update (state_dict does, and gets the
    state at the consumer's position)."""
    ld = loader(data, prefetch=2, num_workers=1)
    it = iter(ld)
    next(it)
    time.sleep(0.5)  # the ring fills: the batches after the first are assembled
    entered, release = threading.Event(), threading.Event()
    update = OnlineVocab.update_with_undo

    def blocked(self, *args):
        entered.set()
        release.wait(30)
        return update(self, *args)

    monkeypatch.setattr(OnlineVocab, "update_with_undo", blocked)
    try:
        next(it)  # frees a slot: the assembler starts the next update and blocks in it
        assert entered.wait(10)
        taken = threading.Event()
        threading.Thread(target=lambda: (next(it), taken.set()), daemon=True).start()
        assert taken.wait(10), "the consumer waited for the assembler's update of a later batch"
    finally:
        release.set()
    assert ld.state_dict()["streams"] == ld.streams.to_dict(ld.streams.at(ld._vocab_here()))
    ld.close()


def test_a_pass_closed_early_leaves_the_vocabulary_at_the_position(data: Path) -> None:
    """Rows read ahead but never delivered do not count: breaking off and iterating again is a resume."""
    whole = list(batches(loader(data, "ttl"), range(1)))
    ld = loader(data, "ttl")
    it = iter(ld)
    got = []
    for _ in range(4):
        b = next(it)
        got.append((b.sparse.clone(), {c: (e.admitted_ids.tolist(), e.admitted_keys.tolist(), e.evicted_ids.tolist(), e.evicted_keys.tolist())
                                       for c, e in b.vocab_events.items()}))  # fmt: skip
    ld.close()
    got += list(batches(ld, range(1)))
    assert same(got, whole)


def test_save_and_load_vocabulary_round_trip_as_json_and_parquet(data: Path, tmp_path: Path) -> None:
    ld = loader(data)
    it = iter(ld)
    for _ in range(5):
        next(it)
    ld.save_vocabulary(tmp_path / "vocab")
    doc = json.loads((tmp_path / "vocab/stream_state.json").read_text())
    assert sorted(doc["states"]) == ONLINE
    other = loader(data)
    other.load_vocabulary(tmp_path / "vocab")
    assert other.state_dict()["streams"] == ld.state_dict()["streams"]


def test_load_vocabulary_refuses_a_broken_table_naming_the_file(data: Path, tmp_path: Path) -> None:
    ld = loader(data)
    ld.save_vocabulary(tmp_path / "vocab")
    path = tmp_path / "vocab" / json.loads((tmp_path / "vocab/stream_state.json").read_text())["states"]["C2"]["table"]
    t = pq.read_table(path)
    ids = t.column("id").to_numpy().copy()
    ids[:2] = 0  # one id, two keys
    pq.write_table(t.set_column(3, "id", pa.array(ids)), path)
    with pytest.raises(ArtifactError, match=str(path)):
        loader(data).load_vocabulary(tmp_path / "vocab")
    with pytest.raises(ArtifactError, match="stream_state.json"):
        loader(data).load_vocabulary(tmp_path)


def test_load_state_dict_checks_the_online_state(data: Path) -> None:
    state = loader(data).state_dict()
    bad = state | {"streams": {c: v | {"id": np.zeros(len(v["id"]) // 8, "<i8").tobytes()} for c, v in state["streams"].items()}}
    with pytest.raises(ConfigError, match="online vocabulary of 'C1'"):
        loader(data).load_state_dict(bad)
    with pytest.raises(ConfigError, match="no online_vocab"):
        loader(data).load_state_dict({k: v for k, v in state.items() if k != "streams"})


def test_a_refused_state_leaves_the_loader_where_it_was(data: Path) -> None:
    """A state whose C2 is broken, after C1's was taken: the loader still starts from its own state."""
    whole = list(batches(loader(data), range(1)))
    ahead = loader(data)
    it = iter(ahead)
    for _ in range(5):
        next(it)
    state = ahead.state_dict()
    ahead.close()
    state["streams"]["C2"]["id"] = state["streams"]["C2"]["id"][:8]
    ld = loader(data)
    with pytest.raises(ConfigError, match="online vocabulary of 'C2'"):
        ld.load_state_dict(state)
    assert same(list(batches(ld, range(1))), whole)


def test_a_state_refused_in_the_middle_of_a_pass_leaves_the_loader_at_its_position(data: Path, tmp_path: Path) -> None:
    """A refused state_dict or vocabulary after a few batches: the loader's state and the batches it gives next are
    those it had before (its vocabularies' state at the position is kept, not only the pass's starting one)."""
    whole = list(batches(loader(data), range(1)))
    ld = loader(data)
    it = batches(ld, range(1))
    got = [next(it) for _ in range(5)]
    state = ld.state_dict()
    bad = state | {"streams": state["streams"] | {"C2": state["streams"]["C2"] | {"id": state["streams"]["C2"]["id"][:8]}}}
    with pytest.raises(ConfigError, match="online vocabulary of 'C2'"):
        ld.load_state_dict(bad)
    assert ld.state_dict() == state
    ld.save_vocabulary(tmp_path / "vocab")
    table = tmp_path / "vocab" / json.loads((tmp_path / "vocab/stream_state.json").read_text())["states"]["C2"]["table"]
    t = pq.read_table(table)
    pq.write_table(t.set_column(3, "id", pa.array(np.zeros(len(t), np.int64))), table)  # one id, many keys
    with pytest.raises(ArtifactError, match=str(table)):
        ld.load_vocabulary(tmp_path / "vocab")
    assert ld.state_dict() == state
    got += list(batches(ld, range(1)))
    assert same(got, whole)


def test_a_state_dict_without_a_valid_position_changes_nothing(data: Path) -> None:
    ld = loader(data)
    it = iter(ld)
    for _ in range(2):
        next(it)
    other = ld.state_dict()
    next(it)
    state = ld.state_dict()
    for broken in ({k: v for k, v in other.items() if k != "position"}, other | {"epoch": "first"}):
        with pytest.raises(ConfigError, match="epoch|position"):
            ld.load_state_dict(broken)
        assert ld.state_dict() == state


def test_after_a_failed_update_the_state_is_refused_until_one_is_loaded(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An update that fails midway leaves no state of its pass that could be trusted: state_dict and the next pass
    raise instead of giving a wrong one, and loading a saved state continues exactly."""
    whole = list(batches(loader(data), range(1)))
    ld = loader(data)
    it = iter(ld)
    got = [next(it) for _ in range(2)]
    state = ld.state_dict()
    calls = iter(range(1000))
    update = OnlineVocab.update_with_undo

    def failing(self, *args):
        if next(calls) == 5:
            raise MemoryError("no memory")
        return update(self, *args)

    monkeypatch.setattr(OnlineVocab, "update_with_undo", failing)
    with pytest.raises(Exception, match="no memory"):
        for _ in it:
            pass
    with pytest.raises(LoaderError, match="unknown after an update failed"):
        ld.state_dict()
    with pytest.raises(LoaderError, match="unknown after an update failed"):
        iter(ld)
    bad = state | {"streams": state["streams"] | {"C3": state["streams"]["C3"] | {"rows": -1}}}
    with pytest.raises(ConfigError, match="online vocabulary of 'C3'"):
        ld.load_state_dict(bad)
    with pytest.raises(LoaderError, match="unknown after an update failed"):  # a refused state is no way out
        ld.state_dict()
    monkeypatch.setattr(OnlineVocab, "update_with_undo", update)
    ld.load_state_dict(state)
    rest = list(batches(ld, range(1)))
    assert len(got) == 2 and same(rest, whole[2:])


def test_settings_an_online_vocabulary_cannot_follow_are_refused(data: Path) -> None:
    with pytest.raises(ConfigError, match="world_size"):
        loader(data, rank=0, world_size=2)
    with pytest.raises(ConfigError, match="transform_on"):
        loader(data, transform_on="device")
    with pytest.raises(ConfigError, match="world_size"):
        loader(data, rank=0, world_size=2, follow=True)


def following(data: Path, evict: str = "ttl", **kw) -> Loader:
    """A following loader over the shards of ``data`` (all present at start; the idle flush delivers the tail)."""
    return loader(data, evict, follow=True, poll_interval=0.02, idle_flush=0.3, **kw)


def take(ld: Loader, n: int) -> list[tuple[torch.Tensor, dict]]:
    it = batches(ld, range(1))
    got = [next(it) for _ in range(n)]
    ld.close()
    return got


@pytest.mark.parametrize("workers", [1, 2])
def test_following_gives_the_ids_and_events_of_the_epoch_over_the_same_rows(data: Path, workers: int) -> None:
    """The shards present at start make the stream of epoch 0 (same buffers, same permutations), and the ids are a
    function of the batches: the following loader's batches and events are the epoch's, seeded by the fit."""
    whole = list(batches(loader(data, "ttl"), range(1)))
    assert same(take(following(data, num_workers=workers), len(whole)), whole)


@pytest.mark.parametrize("stop", [1, 2, 3, 8])
def test_following_resumes_with_the_same_ids_and_events(data: Path, stop: int, tmp_path: Path) -> None:
    """A restart from ``state_dict`` (inside a buffer, at its end, at a batch holding two buffers' rows) continues from
    the state after the last batch handed out: the rest has the uninterrupted run's ids and events."""
    whole = list(batches(loader(data, "ttl"), range(1)))
    first = following(data)
    it = batches(first, range(1))
    got = [next(it) for _ in range(stop)]
    state = first.state_dict()
    first.save_vocabulary(tmp_path / "vocab")
    first.close()
    assert state["streams"] == first.state_dict()["streams"]  # closing does not move the state
    resumed = following(data, num_workers=1)
    resumed.load_state_dict(state)
    got += take(resumed, len(whole) - stop)
    assert same(got, whole)
    saved = following(data)
    saved.load_vocabulary(tmp_path / "vocab")
    assert saved.state_dict()["streams"] == state["streams"]


def test_following_holds_a_bounded_number_of_states_while_small_shards_trickle_in(data: Path, tmp_path: Path) -> None:
    """Shards of a few rows, each followed by an idle flush: with drop_last the rows wait in the open buffer for a
    batch's worth (no short buffers pile up, each with its state), and the states held stay a few."""
    table = pq.read_table(next((data / "raw").glob("*.parquet")))
    raw = tmp_path / "raw"
    raw.mkdir()

    def add(i: int) -> None:
        pq.write_table(table.slice(5 * i, 5), raw / f".part-{i:05d}.tmp")
        (raw / f".part-{i:05d}.tmp").rename(raw / f"part-{i:05d}.parquet")

    add(0)
    ld = Loader(raw, pipeline=data / "ttl.yaml", artifacts=data / "art-ttl", batch_size=32, shuffle=True, shuffle_buffer=64,
                drop_last=True, follow=True, poll_interval=0.005, idle_flush=0.01, prefetch=1)  # fmt: skip
    it, held = iter(ld), []
    for i in range(1, 60):
        add(i)
        if i % 7 == 0:
            next(it)
            held.append(ld.streams.held()[0])
        time.sleep(0.03)
    ld.close()
    assert len(held) == 8 and max(held) <= 4, held


STEPS = st.one_of(st.lists(st.integers(0, 6), max_size=6), st.sampled_from(["empty", "take", "take", "at", "restart", "load"]))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(steps=st.lists(STEPS, max_size=40), evict=st.sampled_from(["lfu", "ttl"]))
def test_the_state_at_every_position_in_flight_is_the_state_after_its_batches(steps: list, evict: str) -> None:
    """The assembler's side (apply_step, name_step, start_pass) and the consumer's (prune, at, commit, load_dict) in
    any order a pass allows, including batches that change nothing, passes restarted at the consumer's position and
    states loaded in the middle of one: the state at the consumer's position is always the state after its batches,
    kept by a twin vocabulary fed the same batches."""
    op = Categorify(["c"], online=True, capacity=2, admit_after=2, evict=evict, ttl_rows=4 if evict == "ttl" else None)
    op.vocab["c"] = pa.table({"key": pa.array([3, 9], pa.uint64()), "count": pa.array([5, 2], pa.int64())})
    vocabs = StreamStates.of([op], {"c": ("sparse", 0)})
    assert vocabs is not None
    twin = op.online_vocab("c")
    states = [twin.export()]  # the state after each batch of the current pass (and those before it)
    assembled = consumer = 0
    vocabs.start_pass(0)
    for step in steps:
        if isinstance(step, list) or step == "empty":
            keys = np.array(step if isinstance(step, list) else [], np.uint64)
            if len(keys):
                vocabs.apply_step(lambda keys=keys: {"c": vocabs.states["c"].advance({"c": Carried(keys, np.ones(len(keys), np.bool_))}).undo})
                twin.update(keys)
            assembled += 1
            vocabs.name_step(assembled)
            states.append(twin.export())
        elif step == "take" and consumer < assembled:
            consumer += 1
            vocabs.prune(consumer)
        elif step == "at":
            got = canonical_state(vocabs.at(consumer)["c"])
            assert all(np.array_equal(got[k], states[consumer][k]) for k in states[consumer])
            assert vocabs.held()[0] == 1 + assembled - consumer
        elif step in ("restart", "load"):
            if step == "restart":  # a pass closed early, and the next one
                vocabs.commit(consumer)
            else:
                states[consumer] = states[(consumer * 7) % (assembled + 1)]
                vocabs.load_dict({"streams": vocabs.to_dict({"c": states[consumer]})})
            twin.restore(states[consumer])
            del states[consumer + 1 :]
            assembled = consumer
            vocabs.start_pass(consumer)
    got = canonical_state(vocabs.at(consumer)["c"])
    assert all(np.array_equal(got[k], states[consumer][k]) for k in states[consumer])


def test_a_state_made_by_another_pipeline_is_refused(data: Path, tmp_path: Path) -> None:
    """A state made with other parameters (here: lfu eviction, given to a ttl loader), or under another column's name,
    gives other ids than the run it claims to continue: refused, naming the state and what differs."""
    lfu = loader(data, "lfu")
    it = iter(lfu)
    for _ in range(3):
        next(it)
    state = lfu.state_dict()
    lfu.save_vocabulary(tmp_path / "vocab")
    lfu.close()
    ttl = loader(data, "ttl")
    before = ttl.state_dict()
    with pytest.raises(ConfigError, match=r"online vocabulary of 'C1'.*evict 'lfu' \(this pipeline: 'ttl'\)"):
        ttl.load_state_dict(state)
    with pytest.raises(ArtifactError, match=r"stream_state.json.*online vocabulary of 'C1'.*evict"):
        ttl.load_vocabulary(tmp_path / "vocab")
    swapped = state | {"streams": state["streams"] | {"C1": state["streams"]["C2"], "C2": state["streams"]["C1"]}}
    with pytest.raises(ConfigError, match=r"online vocabulary of 'C1'.*column 'C2' \(this pipeline: 'C1'\)"):
        loader(data, "lfu").load_state_dict(swapped)
    doc = json.loads((tmp_path / "vocab/stream_state.json").read_text())
    doc["states"]["C1"]["table"] = doc["states"]["C2"]["table"]  # C1's entry points at C2's table
    (tmp_path / "vocab/stream_state.json").write_text(json.dumps(doc))
    table = tmp_path / "vocab" / doc["states"]["C2"]["table"]
    with pytest.raises(ArtifactError, match=rf"{table}: table of online vocabulary of 'C1'.*column 'C2' \(this pipeline: 'C1'\)"):
        loader(data, "lfu").load_vocabulary(tmp_path / "vocab")
    assert ttl.state_dict() == before


def test_a_streaming_state_given_to_a_loader_without_one_is_refused(data: Path) -> None:
    ld = loader(data)
    with pytest.warns(DeprecationWarning, match="Loader.streams"):
        assert ld.vocabularies is ld.streams  # the older name
    state = ld.state_dict()
    offline = Loader(data / "raw", pipeline=data / "offline.yaml", artifacts=_offline_artifacts(data), batch_size=256, shuffle=True,
                     shuffle_buffer=700)  # fmt: skip
    with pytest.raises(ConfigError, match="streaming states"):
        offline.load_state_dict(state)


def test_a_state_dict_and_a_saved_vocabulary_in_the_older_form_still_load(data: Path, tmp_path: Path) -> None:
    """States saved before they carried the record of what made them: a state_dict with ``online_vocab`` (per column
    ``rows`` and the little-endian bytes of ``key``, ``count``, ``last``, ``id``) and a directory with
    ``online_vocabulary.json`` (format etl-online-vocabulary version 1, per column ``rows`` and its table); both
    continue as the loader that saved them."""
    whole = list(batches(loader(data, "ttl"), range(1)))
    first = loader(data, "ttl")
    it = batches(first, range(1))
    got = [next(it) for _ in range(4)]
    state = first.state_dict()
    first.close()
    arrays = {c: {k: np.frombuffer(v[k], "<u8" if k == "key" else "<i8") for k in ("key", "count", "last", "id")}
              for c, v in state["streams"].items()}  # fmt: skip
    rows = {c: v["rows"] for c, v in state["streams"].items()}
    old = {k: v for k, v in state.items() if k != "streams"}
    old["online_vocab"] = {c: {"rows": rows[c], **{k: a.tobytes() for k, a in arrays[c].items()}} for c in ONLINE}
    resumed = loader(data, "ttl")
    resumed.load_state_dict(old)
    assert resumed.state_dict() == state
    assert same(got + list(batches(resumed, range(1))), whole)
    saved = tmp_path / "old-vocab"
    saved.mkdir()
    schema = pa.schema([("key", pa.uint64()), ("count", pa.int64()), ("last", pa.int64()), ("id", pa.int64())])
    for i, c in enumerate(ONLINE):
        pq.write_table(pa.Table.from_arrays([pa.array(arrays[c][k]) for k in schema.names], schema=schema), saved / f"online-{i:02d}.parquet")
    columns = {c: {"rows": rows[c], "table": f"online-{i:02d}.parquet"} for i, c in enumerate(ONLINE)}
    (saved / "online_vocabulary.json").write_text(json.dumps({"format": "etl-online-vocabulary", "version": 1, "columns": columns}))
    from_dir = loader(data, "ttl")
    from_dir.load_vocabulary(saved)
    assert from_dir.state_dict()["streams"] == state["streams"]
    # the older form has no record to check, but its contents are checked as ever
    columns["C2"]["rows"] = "many"
    (saved / "online_vocabulary.json").write_text(json.dumps({"format": "etl-online-vocabulary", "version": 1, "columns": columns}))
    with pytest.raises(ArtifactError, match=r"online_vocabulary.json.*online vocabulary of 'C2'.*rows"):
        loader(data, "ttl").load_vocabulary(saved)


class _Undo(NamedTuple):
    rows: int
    before: dict[int, int | None]

    @property
    def nbytes(self) -> int:
        return 16 * len(self.before)


class RunningCount(StreamState):
    """A streaming state that is no vocabulary: per key, the rows of that key before each row, written as a dense
    float column (the shape of a running per-key statistic); it reports no events."""

    spec = StreamSpec("n", "RunningCount", "k", {"start": 0}, "running count", (StreamInput("k", np.dtype(np.uint64)),), ("n",), ("rows",),
                      {"key": np.dtype(np.uint64), "count": np.dtype(np.int64)})  # fmt: skip

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.rows = 0

    def advance(self, inputs: Mapping[str, Carried]) -> StreamStep:
        keys, valid = inputs["k"]
        out, before = np.full(len(keys), np.nan, np.float32), {}
        for i, k in enumerate(keys[valid].tolist()):
            before.setdefault(k, self.counts.get(k))
            out[np.flatnonzero(valid)[i]] = self.counts.get(k, 0)
            self.counts[k] = self.counts.get(k, 0) + 1
        undo = _Undo(self.rows, before)
        self.rows += len(keys)
        return StreamStep({"n": out}, None, undo)

    def export(self, canonical: bool = True, undo=()) -> dict:
        counts, rows = dict(self.counts), self.rows
        for u in undo:
            for k, v in u.before.items():
                counts.pop(k) if v is None else counts.__setitem__(k, v)
            rows = u.rows
        keys = sorted(counts)
        return {"rows": rows, "key": np.array(keys, np.uint64), "count": np.array([counts[k] for k in keys], np.int64)}

    def canonical(self, state: dict) -> dict:
        return state

    def check(self, state: dict) -> None:
        if state["rows"] < 0 or (state["count"] < 1).any():
            raise InvalidState("running count: negative rows or a count below 1")

    def restore(self, state: dict) -> None:
        self.counts, self.rows = dict(zip(state["key"].tolist(), state["count"].tolist())), state["rows"]


def test_the_loader_side_drives_any_streaming_state_through_the_contract(tmp_path: Path) -> None:
    """The holder knows no op: a state that is no vocabulary gets its carried inputs, writes its dense column, keeps
    the state of every position in flight, and saves and loads it with its record."""
    holder = StreamStates({"n": RunningCount()}, {"n": ("dense", 1)})
    one = holder.start_pass(0)
    written = []
    for b, keys in enumerate([[5, 7, 5], [7, 7, 9, 5]]):
        inputs = one.new_inputs(len(keys))
        inputs["k"].values[:] = keys
        inputs["k"].valid[:] = [True] * (len(keys) - 1) + [b == 0]
        views = {"dense": np.zeros((len(keys), 2), np.float32), "sparse": np.zeros((len(keys), 1), np.int32)}
        assert one.apply(inputs, views) == {}  # no events reported
        one.name_step(b + 1)
        written.append(views["dense"][:, 1].tolist())
    assert written[0] == [0, 0, 1] and written[1][:3] == [1, 2, 0] and np.isnan(written[1][3])
    after_one = holder.at(1)
    assert after_one["n"]["rows"] == 3 and after_one["n"]["key"].tolist() == [5, 7] and after_one["n"]["count"].tolist() == [2, 1]
    saved = {"streams": holder.to_dict(holder.at(2))}
    assert saved["streams"]["n"]["made_by"] == {"op": "RunningCount", "column": "k", "params": {"start": 0}}
    holder.save(holder.at(1), tmp_path / "state")
    other = StreamStates({"n": RunningCount()}, {"n": ("dense", 1)})
    other.load_dict(saved)
    assert other.to_dict(other.at(0)) == saved["streams"]
    other.load(tmp_path / "state")
    assert other.at(0)["n"]["count"].tolist() == [2, 1]
    broken = saved["streams"]["n"] | {"count": np.zeros(3, "<i8").tobytes()}
    with pytest.raises(ConfigError, match="running count of 'n': running count: negative rows or a count below 1"):
        other.load_dict({"streams": {"n": broken}})
