"""etl preprocess of a pipeline with History (etl.preprocess.keyed) against a plain-Python reference over a sorted
copy of the rows: ties, empty histories, keys seen once, max_len 1, ttl, tiebreak columns with missing values,
rows rejected before History, min_len; the same bytes for 1, 2 and 4 workers, for shards cut differently and
row groups of other sizes; several partitions; row accounting, quarantine and errors naming the source row."""

from __future__ import annotations

import bisect
import hashlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from etl.errors import ConfigError, InputError, RowError
from etl.io.files import is_temporary
from etl.io.npy import ListColumnsError
from etl.io.processed import MANIFEST, StageRows, open_processed, read_manifest
from etl.pipeline import Pipeline
from etl.preprocess import keyed, preprocess

SCHEMA = {
    "name": "events",
    "columns": [
        {"name": "label", "role": "label", "dtype": "int64"},
        {"name": "user", "role": "categorical", "dtype": "int64"},
        {"name": "item", "role": "categorical", "dtype": "string"},
        {"name": "price", "role": "dense", "dtype": "float64"},
        {"name": "ts", "role": "passthrough", "dtype": "int64"},
        {"name": "tb", "role": "passthrough", "dtype": "int64"},
        {"name": "eid", "role": "passthrough", "dtype": "int64"},
    ],
}


def events(n: int, seed: int, users: int = 60, span: int = 40, nulls: bool = False) -> pa.Table:
    """Events: Zipf users (many seen once past ``users``), times in a small span (many ties), a tiebreak column
    with ties and missing values, ``eid`` the row's place; with ``nulls``, some labels and keys missing."""
    rng = np.random.default_rng(seed)
    user = np.where(rng.random(n) < 0.1, 10_000 + np.arange(n), np.minimum(rng.zipf(1.3, n), users))
    tb = rng.integers(0, 3, n)
    cols = {
        "label": pa.array(rng.integers(0, 2, n), pa.int64(), mask=(rng.random(n) < 0.05) if nulls else None),
        "user": pa.array(user, pa.int64(), mask=(rng.random(n) < 0.03) if nulls else None),
        "item": pa.array([f"i{v}" for v in rng.integers(0, 30, n)], pa.string()),
        "price": pa.array(rng.random(n) * 100),
        "ts": pa.array(rng.integers(0, span, n), pa.int64()),
        "tb": pa.array(tb, pa.int64(), mask=rng.random(n) < 0.2),
        "eid": pa.array(np.arange(n), pa.int64()),
    }
    return pa.table(cols)


def write_shards(table: pa.Table, directory: Path, cuts: list[int], row_group: int) -> list[Path]:
    """``table`` cut at ``cuts`` into shards of ``directory`` (name order = row order), row groups of ``row_group``."""
    directory.mkdir(parents=True)
    bounds = [0, *cuts, table.num_rows]
    paths = []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        paths.append(directory / f"s{i:02d}.parquet")
        pq.write_table(table.slice(a, b - a), paths[-1], row_group_size=row_group)
    return paths


def make_pipeline(tmp: Path, ops_after: list[dict[str, Any]] | None = None, stages: list | None = None, **history: Any) -> Pipeline:
    (tmp / "schema.yaml").write_text(yaml.safe_dump(SCHEMA))
    hist = {"op": "History", "key": "user", "time": "ts", "columns": ["item"], "tiebreak": ["tb"], "max_len": 3, **history}
    ops = [{"op": "Decode", "columns": ["user", "item"]}, {"op": "Categorify", "columns": ["item"]},
           {"op": "Hash", "columns": ["user"], "num_buckets": 1000}, hist, *(ops_after or [{"op": "Normalize", "columns": ["price"]}])]  # fmt: skip
    doc = {"name": "events", "schema": "schema.yaml", "ops": ops, **({"stages": stages} if stages else {})}
    (tmp / "pipeline.yaml").write_text(yaml.safe_dump(doc))
    return Pipeline.from_file(tmp / "pipeline.yaml")


def reference(table: pa.Table, max_len: int, ttl: int | None, kept: set[int] | None = None) -> dict[int, list[int]]:
    """Plain Python: per event id, the event ids of its history: the same user's events (rows in ``kept``: those
    reaching History) with a strictly earlier time (within ttl), in (time, tiebreak with missing first, input
    position) order, the latest max_len."""
    rows = table.to_pylist()
    by_user: dict[int, list[dict]] = defaultdict(list)
    for pos, r in enumerate(rows):
        if (kept is None or r["eid"] in kept) and r["user"] is not None:
            by_user[r["user"]].append({**r, "pos": pos})
    out = {}
    for evs in by_user.values():
        evs.sort(key=lambda r: (r["ts"], r["tb"] is not None, r["tb"] or 0, r["pos"]))
        for r in evs:
            out[r["eid"]] = [e["eid"] for e in evs if e["ts"] < r["ts"] and (ttl is None or r["ts"] - ttl <= e["ts"])][-max_len:]
    return out


def sorted_reference(table: pa.Table, max_len: int, ttl: int | None) -> dict[int, list[int]]:
    """``reference`` in one walk over each user's sorted events (for large inputs): a row's history ends where its
    time's events begin, and starts max_len events before, or at the first event within ttl."""
    users, times, tbs = (table.column(c).to_pylist() for c in ("user", "ts", "tb"))
    by_user: dict[int, list[tuple]] = defaultdict(list)
    for pos, (u, t, tb) in enumerate(zip(users, times, tbs)):
        by_user[u].append((t, tb is not None, tb or 0, pos))
    eids = table.column("eid").to_pylist()
    out = {}
    for evs in by_user.values():
        evs.sort()
        ts = [e[0] for e in evs]
        for e in evs:
            end = bisect.bisect_left(ts, e[0])
            start = max(end - max_len, 0 if ttl is None else bisect.bisect_left(ts, e[0] - ttl))
            out[eids[e[3]]] = [eids[x[3]] for x in evs[start:end]]
    return out


def outputs(out: Path) -> pa.Table:
    """Every output file's rows, in manifest order."""
    processed = open_processed(out)
    return pa.concat_tables([pq.read_table(p) for p in processed.parts])


def check(out: Path, table: pa.Table, max_len: int, ttl: int | None = None, kept: set[int] | None = None) -> pa.Table:
    """The output of ``table``'s rows holds each kept row once with the reference history (as the item ids of
    the events), in (user, time, tiebreak, position) order within each user."""
    got = outputs(out)
    rows = got.to_pylist()
    item_of = {r["eid"]: r["item"] for r in rows}
    want = reference(table, max_len, ttl, kept)
    assert sorted(item_of) == sorted(want if kept is None else [e for e in want if e in kept and e in item_of])
    for r in rows:
        assert r["hist_item"] == [item_of[e] for e in want[r["eid"]]], r
        assert r["hist_len"] == len(want[r["eid"]])
    users = [r["user"] for r in rows]
    assert len({u for u, v in zip(users, users[1:]) if u != v} | {users[-1]}) == len(set(users)), "a user's rows are not together"
    raw = {r["eid"]: r for r in table.to_pylist()}
    for a, b in zip(rows, rows[1:]):
        if raw[a["eid"]]["user"] == raw[b["eid"]]["user"]:
            ka = (a["ts"], a["tb"] is not None, a["tb"] or 0, a["eid"])
            kb = (b["ts"], b["tb"] is not None, b["tb"] or 0, b["eid"])
            assert ka < kb
    return got


def digests(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("part-*.parquet"))}


@pytest.mark.parametrize(("max_len", "ttl"), [(1, None), (3, 6), (50, None)])
def test_matches_the_reference_with_1_2_and_4_workers(tmp_path: Path, max_len: int, ttl: int | None) -> None:
    table = events(3000, seed=max_len)
    shards = write_shards(table, tmp_path / "raw", [1000, 1700], 400)
    runs = []
    for workers in (1, 2, 4):  # in several partitions, which 4 workers transform at once
        out = tmp_path / f"out{workers}"
        summary = preprocess(make_pipeline(tmp_path, max_len=max_len, ttl=ttl), shards, out, workers=workers, memory_budget=96 << 10)
        assert summary.files > 4
        assert (summary.rows_in, summary.rows_out, summary.rows_quarantined) == (3000, 3000, 0)
        check(out, table, max_len, ttl)
        runs.append(digests(out))
    assert runs[0] == runs[1] == runs[2]
    got = outputs(tmp_path / "out1")
    lengths = got.column("hist_len").to_pylist()
    assert 0 in lengths and max_len in lengths  # empty histories, full ones


def test_same_bytes_for_shards_cut_differently(tmp_path: Path) -> None:
    table = events(2500, seed=5)
    cuts = {"one": ([], 2500), "three": ([700, 701], 128), "four": ([1, 900, 2000], 333)}
    seen = []
    for name, (at, group) in cuts.items():
        out = tmp_path / f"out-{name}"
        preprocess(make_pipeline(tmp_path), write_shards(table, tmp_path / name, at, group), out, workers=2)
        seen.append((digests(out), read_manifest(out).totals))
    assert seen[0] == seen[1] == seen[2]


def test_partitions_are_cut_at_a_fixed_size_or_a_quarter_of_a_smaller_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Partitions hold at most ``PARTITION_BYTES`` of rows, whatever a budget above four times that (so that the
    workers share the transform of a few million rows); at most a quarter of a smaller budget."""
    assert keyed.partition_bytes(1 << 40) == keyed.PARTITION_BYTES and keyed.partition_bytes(4 << 20) == 1 << 20
    assert keyed.partition_bytes(0) == 1
    monkeypatch.setattr(keyed, "PARTITION_BYTES", 48 << 10)
    table = events(3000, seed=4)
    shards = write_shards(table, tmp_path / "raw", [1200], 500)
    runs = []
    for budget in ("1G", "64G", "96K"):
        out = tmp_path / f"out-{budget}"
        summary = preprocess(make_pipeline(tmp_path), shards, out, workers=2, memory_budget=budget)
        check(out, table, 3)
        runs.append((summary.files, digests(out)))
    assert runs[0] == runs[1] and runs[0][0] > 1
    assert runs[2][0] > runs[0][0]  # a quarter of 96K is less than 48K


def test_no_rows(tmp_path: Path) -> None:
    shards = write_shards(events(10, 1).slice(0, 0), tmp_path / "raw", [], 100)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / ".exchange.1-ab.tmp").mkdir()  # what a killed run left
    summary = preprocess(make_pipeline(tmp_path, ops_after=[{"op": "FillMissing", "columns": ["price"]}]), shards, tmp_path / "out")
    assert (summary.files, summary.rows_in, summary.rows_out) == (1, 0, 0)
    assert outputs(tmp_path / "out").num_rows == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["artifacts", "manifest.json", "part-00000.parquet"]


def test_several_partitions_hold_the_rows_of_one(tmp_path: Path) -> None:
    table = events(4000, seed=9, users=400)
    shards = write_shards(table, tmp_path / "raw", [1500], 500)
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    preprocess(make_pipeline(tmp_path), shards, whole, workers=2)
    summary = preprocess(make_pipeline(tmp_path), shards, parts, workers=2, memory_budget=64 << 10)
    assert summary.files > 3 and len(read_manifest(parts).files) == summary.files
    assert check(parts, table, 3).equals(outputs(whole))
    entries = read_manifest(parts).files
    assert [e.source for e in entries] == [f"<exchange by key 'user': partition {p} of {summary.files}>" for p in range(summary.files)]
    assert sum(e.rows_in for e in entries) == 4000
    # a rerun into the same directory with one partition removes the files it no longer makes
    preprocess(make_pipeline(tmp_path), shards, parts, workers=1)
    assert sorted(p.name for p in parts.glob("part-*")) == ["part-00000.parquet"] and digests(parts) == digests(whole)


def test_rows_rejected_before_history_are_no_events(tmp_path: Path) -> None:
    table = events(2000, seed=11, nulls=True)
    shards = write_shards(table, tmp_path / "raw", [800], 300)
    out = tmp_path / "out"
    summary = preprocess(make_pipeline(tmp_path), shards, out, on_error="quarantine", workers=2)
    rows = table.to_pylist()
    bad = {r["eid"] for r in rows if r["label"] is None or r["user"] is None}
    assert summary.rows_quarantined == len(bad) and summary.rows_out == 2000 - len(bad)
    check(out, table, 3, kept={r["eid"] for r in rows} - bad)
    q = pa.concat_tables([pq.read_table(out / e.quarantine) for e in read_manifest(out).files if e.quarantine])
    assert set(q.column("eid").to_pylist()) == bad
    reasons = {r["eid"]: (r["_column"], r["_reason"], r["_source"], r["_row"]) for r in q.to_pylist()}
    for r in rows:
        if r["eid"] in bad:
            column, reason, source, row = reasons[r["eid"]]
            assert (source, row) == (str(shards[0] if r["eid"] < 800 else shards[1]), r["eid"] % 800 if r["eid"] < 800 else r["eid"] - 800)
            assert (column, reason) == (("label", "label is missing") if r["label"] is None else ("user", "the key is missing"))
    with pytest.raises(RowError) as e:
        preprocess(make_pipeline(tmp_path), shards, tmp_path / "raise", workers=1)
    assert not [p for p in (tmp_path / "raise").rglob("*") if is_temporary(p.name)]
    first_bad = [r for r in rows if r["eid"] in bad]
    assert e.value.path in {str(s) for s in shards} and e.value.column in ("label", "user")
    assert any((str(shards[0] if r["eid"] < 800 else shards[1]), r["eid"] % 800 if r["eid"] < 800 else r["eid"] - 800) == (e.value.path, e.value.row)
               for r in first_bad)  # fmt: skip


def test_a_rerun_with_on_error_raise_that_fails_leaves_the_quarantine_mode_output_as_it_was(tmp_path: Path) -> None:
    shards = write_shards(events(2000, seed=11, nulls=True), tmp_path / "raw", [800], 300)
    out = tmp_path / "out"
    preprocess(make_pipeline(tmp_path), shards, out, on_error="quarantine", workers=2)
    fitted = tmp_path / "fitted"
    Pipeline.load(out / "artifacts").save(fitted)
    before = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != ".etl.lock"}
    with pytest.raises(RowError):  # found by the transform of a partition, the fit being given
        preprocess(make_pipeline(tmp_path), shards, out, artifacts=fitted, workers=2)
    after = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != ".etl.lock"}
    assert after == before


def test_a_filter_stage_runs_before_the_exchange(tmp_path: Path) -> None:
    table = events(1500, seed=12)
    shards = write_shards(table, tmp_path / "raw", [600], 250)
    out = tmp_path / "out"
    pipe = make_pipeline(tmp_path, stages=[{"stage": "Filter", "where": {"column": "price", "op": "<", "value": 70.0}}])
    summary = preprocess(pipe, shards, out, workers=2, memory_budget=48 << 10)
    kept = {r["eid"] for r in table.to_pylist() if r["price"] < 70.0}
    check(out, table, 3, kept=kept)
    assert summary.rows_out == len(kept) and summary.rows_in == 1500
    assert [(s.stage, s.rows_in, s.rows_out) for s in summary.stages or ()] == [("Filter", 1500, len(kept)), ("History", len(kept), len(kept))]
    for e in read_manifest(out).files:  # the accounting holds per partition
        assert e.stages is not None and e.stages[0].rows_in == e.rows_in and e.stages[-1].rows_out == e.rows_out


@pytest.mark.parametrize("on_short", ["drop", "quarantine"])
def test_min_len(tmp_path: Path, on_short: str) -> None:
    table = events(1200, seed=13)
    shards = write_shards(table, tmp_path / "raw", [500], 200)
    out = tmp_path / "out"
    summary = preprocess(make_pipeline(tmp_path, min_len=2, on_short=on_short), shards, out, workers=2)
    want = reference(table, 3, None)
    long = {e for e, h in want.items() if len(h) >= 2}
    got = outputs(out)
    assert set(got.column("eid").to_pylist()) == long
    assert min(got.column("hist_len").to_pylist()) >= 2
    short = 1200 - len(long)
    if on_short == "drop":
        assert (summary.rows_quarantined, summary.stages) == (0, (StageRows("History", 1200, len(long)),))
    else:
        assert summary.rows_quarantined == short
        q = pa.concat_tables([pq.read_table(out / e.quarantine) for e in read_manifest(out).files if e.quarantine])
        assert set(q.column("_reason").to_pylist()) == {"the history holds fewer than min_len 2 events"}
    item_of = dict(zip(outputs(tmp_path / "out").column("eid").to_pylist(), got.column("item").to_pylist()))
    for r in got.to_pylist():  # short rows are events still: a later row's history may hold them
        assert r["hist_len"] == len(want[r["eid"]])
    assert any(e not in item_of for h in want.values() for e in h)


def test_artifacts_of_etl_fit_give_the_same_bytes(tmp_path: Path) -> None:
    table = events(1000, seed=14)
    shards = write_shards(table, tmp_path / "raw", [400], 200)
    fitted = make_pipeline(tmp_path)
    fitted.fit(shards, workers=2)
    fitted.save(tmp_path / "artifacts")
    preprocess(make_pipeline(tmp_path), shards, tmp_path / "a", workers=2)
    preprocess(make_pipeline(tmp_path), shards, tmp_path / "b", workers=1, artifacts=tmp_path / "artifacts")
    assert digests(tmp_path / "a") == digests(tmp_path / "b")


def test_the_loader_reads_the_output(tmp_path: Path) -> None:
    from etl import Loader

    table = events(600, seed=15)
    out = tmp_path / "out"
    preprocess(make_pipeline(tmp_path), write_shards(table, tmp_path / "raw", [], 600), out)
    got = outputs(out)
    loader = Loader(out, batch_size=600, drop_last=False)
    batch = next(iter(loader))
    values, offsets = batch.lists["hist_item"]
    want = got.column("hist_item")
    assert offsets.tolist() == [0, *np.cumsum([len(v) for v in want.to_pylist()]).tolist()]
    assert values.tolist() == [x for v in want.to_pylist() for x in v]


def test_refusals(tmp_path: Path) -> None:
    table = events(100, seed=16)
    shards = write_shards(table, tmp_path / "raw", [], 100)
    with pytest.raises(ListColumnsError, match="History writes list columns"):
        preprocess(make_pipeline(tmp_path), shards, tmp_path / "npy", formats=("npy",))
    second = {"op": "History", "key": "item", "time": "ts", "columns": ["user"], "max_len": 2, "prefix": "by_item_"}
    with pytest.raises(ConfigError, match="at most one"):
        preprocess(make_pipeline(tmp_path, ops_after=[second]), shards, tmp_path / "two")
    assert not (tmp_path / "npy" / MANIFEST).exists()


@pytest.mark.slow
def test_300k_rows_in_several_partitions(tmp_path: Path) -> None:
    n = 300_000
    table = events(n, seed=21, users=20_000, span=5_000)
    small = table.slice(0, 3000)
    assert sorted_reference(small, 4, 300) == reference(small, 4, 300)
    shards = write_shards(table, tmp_path / "raw", [90_000, 195_000], 30_000)
    out = tmp_path / "out"
    summary = preprocess(make_pipeline(tmp_path, max_len=4, ttl=300), shards, out, workers=2, memory_budget="16M")
    assert summary.files >= 4 and (summary.rows_in, summary.rows_out) == (n, n)
    want = sorted_reference(table, 4, 300)
    got = outputs(out)
    item_of = dict(zip(got.column("eid").to_pylist(), got.column("item").to_pylist()))
    for eid, hist in zip(got.column("eid").to_pylist(), got.column("hist_item").to_pylist()):
        assert hist == [item_of[e] for e in want[eid]]


def test_the_fit_leaves_out_the_rows_that_are_no_events(tmp_path: Path) -> None:
    """Rows without a key or a time are no events: the fit of the ops before History does not count them either."""
    table = events(1500, seed=17)
    rng = np.random.default_rng(17)
    no_key, no_time = rng.random(1500) < 0.05, rng.random(1500) < 0.05
    items = [f"orphan{i}" if k or t else v for i, (v, k, t) in enumerate(zip(table.column("item").to_pylist(), no_key, no_time))]
    table = table.set_column(1, "user", pa.array(table.column("user").to_numpy(), pa.int64(), mask=no_key))
    table = table.set_column(2, "item", pa.array(items, pa.string()))
    table = table.set_column(4, "ts", pa.array(table.column("ts").to_numpy(), pa.int64(), mask=no_time))
    out, events_only = tmp_path / "out", tmp_path / "events-only"
    summary = preprocess(make_pipeline(tmp_path), write_shards(table, tmp_path / "raw", [600], 250), out, on_error="quarantine", workers=2)
    assert summary.rows_quarantined == int((no_key | no_time).sum())
    kept = table.filter(pa.array(~(no_key | no_time)))
    preprocess(make_pipeline(tmp_path), write_shards(kept, tmp_path / "kept", [600], 250), events_only, workers=2)
    assert Pipeline.load(out / "artifacts").cardinalities() == Pipeline.load(events_only / "artifacts").cardinalities()
    assert outputs(out).equals(outputs(events_only))


def test_lists_of_numbers_and_of_passthrough_values(tmp_path: Path) -> None:
    """History of a dense column (list<float32>: its values as the ops before History leave them) and of a
    passthrough int64 column (list<int64>: as read), beside the ids; rows whose listed number is missing or NaN
    are invalid at History (no events); the loader refuses such lists with one line."""
    from etl import Loader
    from etl.errors import ConfigError

    table = events(2000, seed=18)
    price = table.column("price").to_numpy().copy()
    price[::97] = np.nan
    table = table.set_column(3, "price", pa.array(price, mask=np.arange(2000) % 101 == 5))
    bad = {e for e in range(2000) if e % 97 == 0 or e % 101 == 5}
    shards = write_shards(table, tmp_path / "raw", [900], 300)
    make_pipeline(tmp_path, columns=["item", "price", "eid"])
    doc = yaml.safe_load((tmp_path / "pipeline.yaml").read_text())
    doc["ops"][3:] = [{"op": "Clamp", "columns": ["price"], "max": 50.0}, doc["ops"][3]]  # its lists hold the clamped prices
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(doc))
    pipe = Pipeline.from_file(tmp_path / "pipeline.yaml")
    out = tmp_path / "out"
    summary = preprocess(pipe, shards, out, on_error="quarantine", workers=2)
    assert summary.rows_quarantined == len(bad)
    got = check(out, table, 3, kept=set(range(2000)) - bad)
    schema = got.schema
    assert (schema.field("hist_price").type, schema.field("hist_eid").type) == (pa.list_(pa.float32()), pa.list_(pa.int64()))
    price_of = {e: np.float32(min(p, 50.0)) for e, p in enumerate(price)}
    want = reference(table, 3, None, set(range(2000)) - bad)
    for r in got.to_pylist():
        assert r["hist_eid"] == want[r["eid"]]
        assert r["hist_price"] == [float(price_of[e]) for e in r["hist_eid"]]
    q = pa.concat_tables([pq.read_table(out / e.quarantine) for e in read_manifest(out).files if e.quarantine])
    assert set(q.column("_column").to_pylist()) == {"price"}
    with pytest.raises(ConfigError, match=r"^column 'hist_price' \(History of 'price'\) holds lists of numbers, which the loader"):
        Loader(out, batch_size=100)


def test_a_listed_passthrough_column_must_be_int64(tmp_path: Path) -> None:
    from etl.errors import SpecError

    schema = {**SCHEMA, "columns": [*SCHEMA["columns"], {"name": "note", "role": "passthrough", "dtype": "string"}]}
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    doc = {"name": "e", "schema": "schema.yaml", "ops": [{"op": "History", "key": "user", "time": "ts", "columns": ["note"], "max_len": 2}]}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError, match="passthrough column 'note' is string; a history lists passthrough values of int64 columns only"):
        Pipeline.from_file(tmp_path / "p.yaml")


def test_a_timestamp_column_is_the_time_at_full_precision(tmp_path: Path) -> None:
    """The time as a Parquet timestamp[ns] column (schema: int64 with unit ns), its values some ns apart near 2023
    (beyond float64's precision), compared exactly; shards written with another unit (us) are read in ns; a
    schema unit that cannot hold the values exactly is an InputError."""
    base = 1_700_000_000_000_000_000
    table = events(2000, seed=19, span=40)
    jitter = np.where(np.arange(2000) < 1200, np.random.default_rng(19).integers(0, 3, 2000), 0)  # ns, in the ns shards only
    exact = table.set_column(4, "ts", pa.array(base + table.column("ts").to_numpy() * 1000 + jitter, pa.int64()))
    stamped = exact.set_column(4, "ts", exact.column("ts").cast(pa.timestamp("ns")))
    shards = write_shards(stamped.slice(0, 1200), tmp_path / "raw", [500], 200)
    coarse = stamped.slice(1200).set_column(4, "ts", stamped.slice(1200).column("ts").cast(pa.timestamp("us", tz="UTC")))
    shards += write_shards(coarse, tmp_path / "raw-us", [], 300)
    schema = {**SCHEMA, "columns": [{**c, "unit": "ns"} if c["name"] == "ts" else c for c in SCHEMA["columns"]]}
    make_pipeline(tmp_path, ttl=6000)  # ns: the events of the last 6 microseconds
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    out = tmp_path / "out"
    summary = preprocess(Pipeline.from_file(tmp_path / "pipeline.yaml"), shards, out, workers=2)
    assert summary.rows_out == 2000
    check(out, exact, 3, ttl=6000)
    assert outputs(out).schema.field("ts").type == pa.int64()
    schema["columns"] = [{**c, "unit": "ms"} if c["name"] == "ts" else c for c in SCHEMA["columns"]]
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    with pytest.raises(InputError, match="no whole number of ms"):
        preprocess(Pipeline.from_file(tmp_path / "pipeline.yaml"), shards, tmp_path / "ms", workers=2)


def test_changing_only_future_events_moves_no_earlier_history(tmp_path: Path) -> None:
    """Rows at or before a time t keep their histories when only the events after t change (their prices and
    items); and no history holds the row itself, an event of its own time or a later one."""
    table = events(2000, seed=21)
    ts = table.column("ts").to_numpy()
    t = int(np.median(ts))
    future = ts > t
    rng = np.random.default_rng(5)
    price = np.where(future, rng.random(len(ts)) * 1e3, table.column("price").to_numpy())
    item = [f"z{i}" if f else v for i, (f, v) in enumerate(zip(future, table.column("item").to_pylist()))]
    changed = table.set_column(table.schema.get_field_index("price"), "price", pa.array(price))
    changed = changed.set_column(changed.schema.get_field_index("item"), "item", pa.array(item))
    hist = {}
    for name, t_ in (("a", table), ("b", changed)):
        (tmp_path / name).mkdir()
        shards = write_shards(t_, tmp_path / name / "raw", [900], 300)
        preprocess(make_pipeline(tmp_path / name, columns=["eid", "price"]), shards, tmp_path / name / "out", workers=2)
        got = outputs(tmp_path / name / "out").to_pylist()
        hist[name] = {r["eid"]: (r["hist_eid"], r["hist_price"]) for r in got}
    assert len(hist["a"]) == len(hist["b"]) == 2000 and 0 < future.sum() < 2000
    assert sum(len(h) for h, _ in hist["a"].values()) > 2000  # histories hold events: the checks below bite
    for eid in np.flatnonzero(~future).tolist():
        assert hist["a"][eid] == hist["b"][eid], eid
    for eid, (earlier, _) in hist["a"].items():
        assert eid not in earlier and all(ts[e] < ts[eid] for e in earlier)
