"""etl preprocess of a pipeline ending with Groupby (etl.preprocess.keyed_groupby) against a plain-Python reference
over a sorted copy of the events: groups of several key columns, ties in the order column (input order decides),
groups of one event, max_len 1, min_len dropping groups, events rejected before Groupby, missing keys, aggregates
float32 cannot hold; the same bytes for 1, 2 and 4 workers and for shards cut differently; several partitions; row
accounting, quarantine and errors naming the source row; the loader reads the output and refuses raw shards."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from etl.errors import ConfigError, RowError
from etl.io.files import is_temporary
from etl.io.npy import ListColumnsError
from etl.io.processed import StageRows, read_manifest
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from tests.unit.preprocess.test_keyed import digests, outputs, write_shards

SCHEMA = {
    "name": "events",
    "columns": [
        {"name": "label", "role": "label", "dtype": "int64"},
        {"name": "session", "role": "passthrough", "dtype": "string"},
        {"name": "shop", "role": "passthrough", "dtype": "int64"},
        {"name": "item", "role": "categorical", "dtype": "string"},
        {"name": "price", "role": "dense", "dtype": "float64"},
        {"name": "ts", "role": "passthrough", "dtype": "int64"},
        {"name": "tag", "role": "passthrough", "dtype": "string"},
        {"name": "w", "role": "passthrough", "dtype": "float64"},
        {"name": "eid", "role": "passthrough", "dtype": "int64"},
    ],
}
AGGS = {"item": ["list", "count", "first", "last"], "price": ["sum", "mean", "min", "max", "list"], "tag": ["list"], "w": ["sum"],
        "eid": ["list", "first", "last"]}  # fmt: skip


def events(n: int, seed: int, sessions: int = 150, span: int = 12, nulls: bool = False, huge: bool = False) -> pa.Table:
    """Events: Zipf sessions in two shops (a tenth of the events in sessions of their own), times in a small span
    (many ties), ``eid`` the event's place; with ``nulls``, some labels and sessions missing; with ``huge``, some
    ``w`` values float32 cannot hold."""
    rng = np.random.default_rng(seed)
    session = np.where(rng.random(n) < 0.1, 100_000 + np.arange(n), np.minimum(rng.zipf(1.4, n), sessions))
    w = rng.random(n)
    if huge:
        w[rng.random(n) < 0.01] = 1e39
    cols = {
        "label": pa.array(rng.integers(0, 2, n), pa.int64(), mask=(rng.random(n) < 0.04) if nulls else None),
        "session": pa.array([f"s{v}" for v in session], pa.string(), mask=(rng.random(n) < 0.03) if nulls else None),
        "shop": pa.array(rng.integers(0, 2, n), pa.int64()),
        "item": pa.array([f"i{v}" for v in rng.integers(0, 40, n)], pa.string()),
        "price": pa.array(np.round(rng.random(n) * 100, 2)),
        "ts": pa.array(rng.integers(0, span, n), pa.int64()),
        "tag": pa.array([f"t{v}" for v in rng.integers(0, 5, n)], pa.string(), mask=rng.random(n) < 0.1),
        "w": pa.array(w),
        "eid": pa.array(np.arange(n), pa.int64()),
    }
    return pa.table(cols)


OPS = [{"op": "Decode", "columns": ["item"]}, {"op": "Categorify", "columns": ["item"]}]


def make_pipeline(tmp: Path, groupby: dict[str, Any] | None = None, stages: list | None = None, **params: Any) -> Pipeline:
    """The events pipeline, ending with Groupby (``groupby`` None: without it, the events' own output)."""
    (tmp / "schema.yaml").write_text(yaml.safe_dump(SCHEMA))
    ops = list(OPS)
    if groupby is not None:
        ops.append({"op": "Groupby", "by": ["session", "shop"], "sort_by": ["ts"], "aggs": AGGS, "max_len": 3, **groupby, **params})
    doc = {"name": "events", "schema": "schema.yaml", "ops": ops, **({"stages": stages} if stages else {})}
    name = "groupby.yaml" if groupby is not None else "events.yaml"
    (tmp / name).write_text(yaml.safe_dump(doc, sort_keys=False))
    return Pipeline.from_file(tmp / name)


def reference(table: pa.Table, kept: set[int] | None = None) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Plain Python: per (session, shop), its events (those in ``kept``, with a session) sorted by time, then input
    position."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for pos, r in enumerate(table.to_pylist()):
        if (kept is None or r["eid"] in kept) and r["session"] is not None:
            groups[(r["session"], r["shop"])].append({**r, "pos": pos})
    for evs in groups.values():
        evs.sort(key=lambda r: (r["ts"], r["pos"]))
    return groups


def item_ids(tmp: Path, shards: list[Path]) -> dict[int, int]:
    """Each event's item id, from the pipeline without Groupby (the same vocabulary: both are fitted on the events)."""
    out = tmp / "events-out"
    preprocess(make_pipeline(tmp), shards, out, workers=2)
    t = outputs(out)
    return dict(zip(t.column("eid").to_pylist(), t.column("item").to_pylist()))


def check(out: Path, table: pa.Table, ids: dict[int, int], max_len: int = 3, min_len: int = 1, label: str = "last",
          kept: set[int] | None = None) -> pa.Table:  # fmt: skip
    """The output holds one row per reference group of at least ``min_len`` events, with its aggregates."""
    got = outputs(out)
    want = {k: evs for k, evs in reference(table, kept).items() if len(evs) >= min_len}
    rows = got.to_pylist()
    assert sorted((r["session"], r["shop"]) for r in rows) == sorted(want)
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    for r in rows:
        evs = want[(r["session"], r["shop"])]
        tail = evs[-max_len:]
        labels = [e["label"] for e in evs]
        assert r["label"] == f32({"last": labels[-1], "first": labels[0], "max": max(labels), "sum": sum(labels)}[label]), r
        assert r["item_list"] == [ids[e["eid"]] for e in tail]
        assert r["item_count"] == len(evs)
        assert (r["item_first"], r["item_last"]) == (ids[evs[0]["eid"]], ids[evs[-1]["eid"]])
        prices = [e["price"] for e in evs]
        assert math.isclose(r["price_sum"], f32(sum(prices)), rel_tol=1e-6)
        assert math.isclose(r["price_mean"], f32(sum(prices) / len(prices)), rel_tol=1e-6)
        assert (r["price_min"], r["price_max"]) == (f32(min(prices)), f32(max(prices)))
        assert r["price_list"] == [f32(e["price"]) for e in tail]
        assert r["tag_list"] == [e["tag"] for e in tail]
        assert math.isclose(r["w_sum"], f32(sum(e["w"] for e in evs)), rel_tol=1e-6)
        assert r["eid_list"] == [e["eid"] for e in tail]
        assert (r["eid_first"], r["eid_last"]) == (evs[0]["eid"], evs[-1]["eid"])
    return got


@pytest.mark.parametrize(("max_len", "min_len"), [(1, 1), (3, 2)])
def test_matches_the_reference_with_1_2_and_4_workers(tmp_path: Path, max_len: int, min_len: int) -> None:
    table = events(3000, seed=max_len)
    shards = write_shards(table, tmp_path / "raw", [1000, 1700], 400)
    ids = item_ids(tmp_path, shards)
    runs = []
    for workers in (1, 2, 4):  # in several partitions, which 4 workers transform at once
        out = tmp_path / f"out{workers}"
        summary = preprocess(make_pipeline(tmp_path, {"max_len": max_len, "min_len": min_len}), shards, out, workers=workers, memory_budget=96 << 10)
        assert summary.files > 4
        got = check(out, table, ids, max_len, min_len)
        groups = reference(table)
        dropped = sum(1 for evs in groups.values() if len(evs) < min_len)
        assert (summary.rows_in, summary.rows_out, summary.rows_quarantined) == (3000, len(groups) - dropped, 0)
        assert summary.stages == (StageRows("Groupby", 3000, got.num_rows, dropped),)
        runs.append(digests(out))
    assert runs[0] == runs[1] == runs[2]
    counts = got.column("item_count").to_pylist()
    assert min(counts) == min_len and max(counts) > 10  # groups of one event (or of min_len), long ones
    if min_len > 1:
        assert dropped > 0


def test_same_bytes_for_shards_cut_differently(tmp_path: Path) -> None:
    table = events(2500, seed=5)
    cuts = {"one": ([], 2500), "three": ([700, 701], 128), "four": ([1, 900, 2000], 333)}
    seen = []
    for name, (at, group) in cuts.items():
        out = tmp_path / f"out-{name}"
        preprocess(make_pipeline(tmp_path, {}), write_shards(table, tmp_path / name, at, group), out, workers=2)
        seen.append((digests(out), read_manifest(out).totals))
    assert seen[0] == seen[1] == seen[2]


def test_several_partitions_hold_the_rows_of_one(tmp_path: Path) -> None:
    table = events(5000, seed=9, sessions=600)
    shards = write_shards(table, tmp_path / "raw", [1500], 500)
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    preprocess(make_pipeline(tmp_path, {}), shards, whole, workers=2)
    summary = preprocess(make_pipeline(tmp_path, {}), shards, parts, workers=2, memory_budget=64 << 10)
    assert summary.files > 3 and len(read_manifest(parts).files) == summary.files
    assert check(parts, table, item_ids(tmp_path, shards)).equals(outputs(whole))
    entries = read_manifest(parts).files
    assert [e.source for e in entries] == [f"<exchange by key 'session, shop': partition {p} of {summary.files}>" for p in range(summary.files)]
    assert sum(e.rows_in for e in entries) == 5000 and sum(e.rows_out for e in entries) == len(reference(table))


def test_events_rejected_before_groupby_are_no_events(tmp_path: Path) -> None:
    table = events(2000, seed=11, nulls=True)
    shards = write_shards(table, tmp_path / "raw", [800], 300)
    out = tmp_path / "out"
    summary = preprocess(make_pipeline(tmp_path, {}), shards, out, on_error="quarantine", workers=2)
    rows = table.to_pylist()
    bad = {r["eid"] for r in rows if r["label"] is None or r["session"] is None}
    ids = item_ids(tmp_path, write_shards(table.filter(pa.array([r["eid"] not in bad for r in rows])), tmp_path / "good", [], 500))
    check(out, table, ids, kept={r["eid"] for r in rows} - bad)
    assert summary.rows_quarantined == len(bad)
    q = pa.concat_tables([pq.read_table(out / e.quarantine) for e in read_manifest(out).files if e.quarantine])
    assert sorted(q.column("eid").to_pylist()) == sorted(bad)
    for r in q.to_pylist():
        raw = rows[r["eid"]]
        assert (r["_source"], r["_row"]) == (str(shards[0] if r["eid"] < 800 else shards[1]), r["eid"] % 800 if r["eid"] < 800 else r["eid"] - 800)
        assert (r["_column"], r["_reason"]) == (("label", "label is missing") if raw["label"] is None else ("session", "the group key is missing"))
    with pytest.raises(RowError) as e:
        preprocess(make_pipeline(tmp_path, {}), shards, tmp_path / "raise", workers=1)
    assert not [p for p in (tmp_path / "raise").rglob("*") if is_temporary(p.name)]
    assert e.value.path in {str(s) for s in shards} and e.value.column in ("label", "session")


def test_groups_whose_sum_float32_cannot_hold(tmp_path: Path) -> None:
    table = events(1500, seed=12, huge=True)
    shards = write_shards(table, tmp_path / "raw", [600], 250)
    out = tmp_path / "out"
    summary = preprocess(make_pipeline(tmp_path, {}), shards, out, on_error="quarantine", workers=2)
    huge = {k for k, evs in reference(table).items() if any(e["w"] > 1e38 for e in evs)}
    assert huge
    bad = {e["eid"] for k in huge for e in reference(table)[k]}
    check(out, table, item_ids(tmp_path, shards), kept={r for r in range(1500) if r not in bad})
    assert summary.rows_quarantined == len(bad)
    q = pa.concat_tables([pq.read_table(out / e.quarantine) for e in read_manifest(out).files if e.quarantine])
    assert set(q.column("_reason").to_pylist()) == {"the group's sum of 'w' is NaN, infinite or beyond the float32 range"}
    assert set(q.column("_column").to_pylist()) == {"w"} and sorted(q.column("eid").to_pylist()) == sorted(bad)
    with pytest.raises(RowError, match="sum of 'w'") as e:
        preprocess(make_pipeline(tmp_path, {}), shards, tmp_path / "raise")
    starts = [evs[0]["pos"] for k, evs in reference(table).items() if k in huge]
    firsts = {(str(shards[0]), pos) if pos < 600 else (str(shards[1]), pos - 600) for pos in starts}
    assert (e.value.path, e.value.row) in firsts and e.value.column == "w"


def test_a_filter_stage_runs_before_the_exchange(tmp_path: Path) -> None:
    table = events(1500, seed=13)
    shards = write_shards(table, tmp_path / "raw", [600], 250)
    out = tmp_path / "out"
    pipe = make_pipeline(tmp_path, {"label": "max"}, stages=[{"stage": "Filter", "where": {"column": "price", "op": "<", "value": 70.0}}])
    summary = preprocess(pipe, shards, out, workers=2, memory_budget=48 << 10)
    kept = {r["eid"] for r in table.to_pylist() if r["price"] < 70.0}
    ids = item_ids(tmp_path, write_shards(table.filter(pa.array([e in kept for e in range(1500)])), tmp_path / "kept", [], 500))
    got = check(out, table, ids, label="max", kept=kept)
    assert summary.rows_in == 1500 and summary.rows_out == got.num_rows
    assert summary.stages == (StageRows("Filter", 1500, len(kept)), StageRows("Groupby", len(kept), got.num_rows, 0))
    for e in read_manifest(out).files:  # the accounting holds per partition
        assert e.stages is not None and e.stages[0].rows_in == e.rows_in and e.stages[-1].rows_out == e.rows_out + e.rows_quarantined


def test_artifacts_of_etl_fit_give_the_same_bytes(tmp_path: Path) -> None:
    shards = write_shards(events(1000, seed=14), tmp_path / "raw", [400], 200)
    fitted = make_pipeline(tmp_path, {})
    fitted.fit(shards, workers=2)
    fitted.save(tmp_path / "artifacts")
    preprocess(make_pipeline(tmp_path, {}), shards, tmp_path / "a", workers=2)
    preprocess(make_pipeline(tmp_path, {}), shards, tmp_path / "b", workers=1, artifacts=tmp_path / "artifacts")
    assert digests(tmp_path / "a") == digests(tmp_path / "b")
    assert Pipeline.load(tmp_path / "artifacts").output_columns == make_pipeline(tmp_path, {}).output_columns


def test_the_loader_reads_the_output_and_refuses_raw_shards(tmp_path: Path) -> None:
    from etl import Loader

    shards = write_shards(events(1200, seed=15), tmp_path / "raw", [500], 300)
    out = tmp_path / "out"
    preprocess(make_pipeline(tmp_path, {}), shards, out, memory_budget=64 << 10)
    got = outputs(out)
    loader = Loader(out, batch_size=100, drop_last=False)
    assert (loader.layout.dense, loader.layout.sparse, loader.layout.lists) == (
        ["item_count", "price_sum", "price_mean", "price_min", "price_max", "w_sum"], ["item_first", "item_last"], ["item_list"])  # fmt: skip
    labels, sparse, lists = [], [], []
    for batch in loader:
        values, offsets = batch.lists["item_list"]
        labels += batch.label.tolist()
        sparse += batch.sparse.tolist()
        lists += [values[a:b].tolist() for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
    assert labels == got.column("label").to_pylist() and lists == got.column("item_list").to_pylist()
    assert sparse == [list(p) for p in zip(got.column("item_first").to_pylist(), got.column("item_last").to_pylist())]
    with pytest.raises(ConfigError) as e:
        Loader(tmp_path / "raw", tmp_path / "groupby.yaml", batch_size=10)
    assert "\n" not in str(e.value) and "ends with Groupby" in str(e.value) and "run `etl preprocess` first" in str(e.value)


def test_no_events(tmp_path: Path) -> None:
    shards = write_shards(events(10, 1).slice(0, 0), tmp_path / "raw", [], 100)
    summary = preprocess(make_pipeline(tmp_path, {}), shards, tmp_path / "out")
    assert (summary.files, summary.rows_in, summary.rows_out) == (1, 0, 0)
    assert outputs(tmp_path / "out").num_rows == 0
    assert outputs(tmp_path / "out").schema == Pipeline.load(tmp_path / "out" / "artifacts").output_schema()


def test_refusals(tmp_path: Path) -> None:
    shards = write_shards(events(100, seed=16), tmp_path / "raw", [], 100)
    with pytest.raises(ListColumnsError, match="Groupby writes list columns"):
        preprocess(make_pipeline(tmp_path, {}), shards, tmp_path / "npy", formats=("npy",))
    with pytest.raises(ConfigError, match="Parquet only"):
        preprocess(make_pipeline(tmp_path, {"aggs": {"price": ["sum"]}}, max_len=None), shards, tmp_path / "npy2", formats=("npy",))
    history = {"op": "History", "key": "session", "time": "ts", "columns": ["item"], "max_len": 2}
    doc = yaml.safe_load((tmp_path / "groupby.yaml").read_text())
    doc["ops"].insert(2, history)
    (tmp_path / "both.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(ConfigError, match="History and Groupby each need an exchange by their own key"):
        preprocess(Pipeline.from_file(tmp_path / "both.yaml"), shards, tmp_path / "both")
    with pytest.raises(ConfigError, match="ends with Groupby"):
        make_pipeline(tmp_path, {}).transform_table(events(3, seed=1))


@pytest.mark.slow
def test_300k_events_in_several_partitions(tmp_path: Path) -> None:
    n = 300_000
    table = events(n, seed=21, sessions=20_000, span=5_000)
    shards = write_shards(table, tmp_path / "raw", [90_000, 195_000], 30_000)
    out = tmp_path / "out"
    summary = preprocess(make_pipeline(tmp_path, {"max_len": 4, "min_len": 2}), shards, out, workers=2, memory_budget="16M")
    assert summary.files >= 4 and summary.rows_in == n
    # the reference in one sort of (key, time, position)
    keys = list(zip(table.column("session").to_pylist(), table.column("shop").to_pylist(), table.column("ts").to_pylist(), range(n)))
    keys.sort()
    prices = table.column("price").to_pylist()
    want: dict[tuple[str, int], tuple[list[int], float]] = {}
    start = 0
    for i in range(1, n + 1):
        if i == n or keys[i][:2] != keys[start][:2]:
            if i - start >= 2:
                positions = [k[3] for k in keys[start:i]]
                want[keys[start][:2]] = (positions, sum(prices[p] for p in positions))
            start = i
    got = outputs(out)
    assert got.num_rows == len(want) == summary.rows_out and summary.stages is not None and summary.stages[0].groups_dropped == len(
        {k[:2] for k in keys}) - len(want)  # fmt: skip
    for r in got.select(["session", "shop", "item_count", "eid_list", "eid_first", "eid_last", "price_sum"]).to_pylist():
        positions, total = want[(r["session"], r["shop"])]
        assert (r["item_count"], r["eid_list"], r["eid_first"], r["eid_last"]) == (len(positions), positions[-4:], positions[0], positions[-1])
        assert math.isclose(r["price_sum"], float(np.float32(total)), rel_tol=1e-6)


def test_the_documented_example(tmp_path: Path) -> None:
    """pipelines/README.md's Groupby example: one session's events, a tie in time kept in input order."""
    columns = [("label", "label", "int64"), ("session_id", "passthrough", "string"), ("item_id", "passthrough", "int64"),
               ("price", "dense", "float64"), ("timestamp", "passthrough", "int64")]  # fmt: skip
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump({"name": "ex", "columns": [{"name": n, "role": r, "dtype": d} for n, r, d in columns]}))
    aggs = {"item_id": ["list", "count", "first", "last"], "price": ["sum", "mean"]}
    groupby = {"op": "Groupby", "by": ["session_id"], "sort_by": ["timestamp"], "max_len": 2, "aggs": aggs}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"schema": "schema.yaml", "ops": [{"op": "FillMissing", "columns": ["price"]}, groupby]}))
    rows = pa.table({"label": [0, 1, 0], "session_id": ["s"] * 3, "item_id": [8, 7, 9], "price": [1.0, 2.0, 4.0], "timestamp": [20, 10, 20]})
    preprocess(Pipeline.from_file(tmp_path / "p.yaml"), write_shards(rows, tmp_path / "raw", [], 10), tmp_path / "out")
    want = {"session_id": "s", "label": 0.0, "item_id_list": [8, 9], "item_id_count": 3.0, "item_id_first": 7, "item_id_last": 9,
            "price_sum": 7.0, "price_mean": float(np.float32(7 / 3))}  # fmt: skip
    assert outputs(tmp_path / "out").to_pylist() == [want]


def test_sort_by_a_timestamp_column(tmp_path: Path) -> None:
    """sort_by a Parquet timestamp[us] column (schema: int64 with unit us): ordered by its exact value."""
    table = events(1500, seed=31)
    exact = table.set_column(5, "ts", pa.array(1_700_000_000_000_000 + table.column("ts").to_numpy(), pa.int64()))
    shards = write_shards(exact.set_column(5, "ts", exact.column("ts").cast(pa.timestamp("us"))), tmp_path / "raw", [700], 250)
    ids = item_ids(tmp_path, write_shards(exact, tmp_path / "ints", [700], 250))
    make_pipeline(tmp_path, {})
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump({**SCHEMA, "columns": [{**c, "unit": "us"} if c["name"] == "ts" else c
                                                                                for c in SCHEMA["columns"]]}))  # fmt: skip
    out = tmp_path / "out"
    preprocess(Pipeline.from_file(tmp_path / "groupby.yaml"), shards, out, workers=2)
    check(out, exact, ids)
