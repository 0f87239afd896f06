"""etl preprocess with a split (etl.preprocess.split) against plain-Python references: each split's rows, the
vocabularies and normalisation fitted on the train rows only, values unseen in train, History over the whole
timeline; the same bytes for 1 and 2 workers; the artifacts untouched by any change to the valid and test rows;
row accounting and quarantine per split; reruns; what is refused."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

from etl.backends.hashing import string_key
from etl.errors import ConfigError, OutputError
from etl.io.processed import Unseen, open_processed, read_manifest
from etl.loader import Loader
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.tools.inspect import describe
from tests.unit.preprocess.test_keyed import reference as history_reference

SCHEMA = {
    "name": "events",
    "columns": [
        {"name": "label", "role": "label", "dtype": "int64"},
        {"name": "user", "role": "categorical", "dtype": "int64", "encoding": "int"},
        {"name": "item", "role": "categorical", "dtype": "string", "encoding": "string"},
        {"name": "tags", "role": "list", "dtype": "string", "encoding": "string", "separator": "|"},
        {"name": "price", "role": "dense", "dtype": "float64"},
        {"name": "ts", "role": "passthrough", "dtype": "int64"},
        {"name": "tb", "role": "passthrough", "dtype": "int64"},
        {"name": "eid", "role": "passthrough", "dtype": "int64"},
    ],
}
OPS = [{"op": "Decode", "columns": ["user", "item", "tags"]}, {"op": "Categorify", "columns": ["user", "item", "tags"]},
       {"op": "Normalize", "columns": ["price"]}]  # fmt: skip
TIME = {"by": "time", "column": "ts", "train_until": 60, "valid_until": 80}
UNSEEN = ("user", "item", "tags")


def events(n: int, seed: int, null_labels: bool = False) -> pa.Table:
    """Events over times 0..99 (ties), users and items whose later ids appear only late (cold start)."""
    rng = np.random.default_rng(seed)
    ts = rng.integers(0, 100, n)
    user = rng.integers(0, 20 + ts // 2)  # users 20.. appear only from time 0..
    item = [f"i{v}" for v in rng.integers(0, 10 + ts // 3)]
    tags = [[f"t{v}" for v in rng.integers(0, 3 + t // 10, k)] for t, k in zip(ts, rng.integers(0, 3, n))]
    return pa.table({
        "label": pa.array(rng.integers(0, 2, n), pa.int64(), mask=(rng.random(n) < 0.03) if null_labels else None),
        "user": pa.array(user, pa.int64()),
        "item": pa.array(item),
        "tags": pa.array(tags, pa.list_(pa.string())),
        "price": pa.array(rng.random(n) * 100),
        "ts": pa.array(ts, pa.int64()),
        "tb": pa.array(rng.integers(0, 3, n), pa.int64(), mask=rng.random(n) < 0.2),
        "eid": pa.array(np.arange(n), pa.int64()),
    })  # fmt: skip


def write(tmp: Path, table: pa.Table, cuts: list[int], ops: list[dict[str, Any]] | None = None, **doc: Any) -> tuple[Pipeline, list[Path]]:
    (tmp / "schema.yaml").write_text(yaml.safe_dump(SCHEMA))
    (tmp / "p.yaml").write_text(yaml.safe_dump({"name": "events", "schema": "schema.yaml", "ops": ops or OPS, **doc}))
    raw = tmp / "raw"
    raw.mkdir(exist_ok=True)
    for old in raw.iterdir():
        old.unlink()
    bounds = [0, *cuts, table.num_rows]
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        pq.write_table(table.slice(a, b - a), raw / f"s{i}.parquet", row_group_size=64)
    return Pipeline.from_file(tmp / "p.yaml"), sorted(raw.iterdir())


def output(directory: Path) -> pa.Table:
    return pa.concat_tables([pq.read_table(p) for p in open_processed(directory).parts])


def tree(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.rglob("*")) if p.is_file()}


def role_of(r: dict[str, Any], split: dict[str, Any]) -> str:
    return "train" if r["ts"] < split["train_until"] else "valid" if r["ts"] < split["valid_until"] else "test"


def vocabulary(values: list[Any], key: Any) -> dict[Any, int]:
    """Categorify's ids of the values counted (0 pad, 1 missing, 2 OOV): by count descending, then key."""
    counts = Counter(values)
    return {v: 3 + i for i, v in enumerate(sorted(counts, key=lambda v: (-counts[v], key(v))))}


@pytest.mark.parametrize("workers", [1, 2])
def test_time_split_against_a_reference(tmp_path: Path, workers: int) -> None:
    table = events(1500, seed=1)
    pipeline, shards = write(tmp_path, table, [400, 401, 1000])
    summary = preprocess(pipeline, shards, tmp_path / "out", workers=workers, split=TIME)
    rows = table.to_pylist()
    train = [r for r in rows if role_of(r, TIME) == "train"]
    users = vocabulary([r["user"] for r in train], key=lambda v: v)
    items = vocabulary([r["item"] for r in train], key=lambda v: string_key(v.encode()))
    tags = vocabulary([t for r in train for t in r["tags"]], key=lambda v: string_key(v.encode()))
    prices = np.array([r["price"] for r in train])
    assert [p.role for p in summary.splits] == ["train", "valid", "test"]
    for part in summary.splits:
        mine = [r for r in rows if role_of(r, TIME) == part.role]
        got = output(tmp_path / "out" / part.role).to_pylist()
        assert [g["eid"] for g in got] == [r["eid"] for r in mine]  # in input order
        assert [g["user"] for g in got] == [users.get(r["user"], 2) for r in mine]
        assert [g["item"] for g in got] == [items.get(r["item"], 2) for r in mine]
        assert [g["tags"] for g in got] == [[tags.get(t, 2) for t in r["tags"]] for r in mine]
        want = ((np.array([r["price"] for r in mine]) - prices.mean()) / prices.std()).astype(np.float32)
        np.testing.assert_allclose([g["price"] for g in got], want, rtol=1e-5, atol=1e-6)
        # the report: rows, and the values train's vocabularies lack
        m = read_manifest(tmp_path / "out" / part.role)
        assert m.split == part.report and part.report.rows == len(mine) == m.totals.rows_out
        expected = () if part.role == "train" else tuple(unseen(mine, vocab, c) for c, vocab in zip(UNSEEN, (users, items, tags)))
        assert part.report.unseen == expected
        t = m.totals
        assert t.rows_in == len(rows) == t.rows_out + t.rows_quarantined + t.rows_removed
        assert [(s.stage, s.rows_in, s.rows_out) for s in t.stages] == [("Split", len(rows), len(mine))]
    assert summary.splits[2].report.unseen[0].rows > 0 and summary.splits[1].report.rule == "60 <= ts < 80"
    assert (summary.rows_in, summary.rows_out, summary.stages) == (len(rows), len(rows), None)
    art = [tree(tmp_path / "out" / role / "artifacts") for role in ("train", "valid", "test")]
    assert art[0] == art[1] == art[2]  # fitted once, the same bytes in each split
    vocab = pq.read_table(tmp_path / "out/train/artifacts/01-Categorify/user.parquet").to_pydict()
    assert dict(zip(vocab["key"], vocab["id"])) == users and vocab["count"] == sorted(Counter(r["user"] for r in train).values(), reverse=True)


def unseen(rows: list[dict[str, Any]], vocab: dict[Any, int], column: str) -> Unseen:
    """The reference count of values of ``column`` absent from ``vocab``: rows holding one, distinct values."""
    values = [r[column] if isinstance(r[column], list) else [r[column]] for r in rows]
    missing = [[v for v in vs if v not in vocab] for vs in values]
    return Unseen(column, sum(1 for m in missing if m), len({v for m in missing for v in m}))


def test_one_and_two_workers_give_the_same_bytes(tmp_path: Path) -> None:
    table = events(900, seed=2)
    outs = []
    for k, workers in enumerate([1, 2]):
        (tmp_path / str(k)).mkdir()
        pipeline, shards = write(tmp_path / str(k), table, [300, 600])
        preprocess(pipeline, shards, tmp_path / str(k) / "out", workers=workers, split={**TIME, "train_until": {"quantile": 0.5}})
        outs.append(tmp_path / str(k) / "out")
    for role in ("train", "valid", "test"):
        assert output(outs[0] / role) == output(outs[1] / role)
        assert tree(outs[0] / role / "artifacts") == tree(outs[1] / role / "artifacts")


def test_no_statistic_reads_a_valid_or_test_row(tmp_path: Path) -> None:
    """Every valid and test row's label, categorical values, list and dense value changed: every artifact keeps
    its bytes (the vocabularies, Normalize's mean and std, TargetEncode's sums and counts), and so does the train
    output."""
    table = events(1200, seed=3)
    rng = np.random.default_rng(9)
    later = np.array([r["ts"] >= TIME["train_until"] for r in table.to_pylist()])
    n = table.num_rows
    changed = {
        "label": np.where(later, 1 - np.asarray(table["label"]), table["label"]),
        "user": np.where(later, 1000 + rng.integers(0, 5, n), table["user"]),
        "item": [f"x{rng.integers(0, 5)}" if late else v for late, v in zip(later, table["item"].to_pylist())],
        "tags": [["new"] if late else v for late, v in zip(later, table["tags"].to_pylist())],
        "price": np.where(later, 1e6 * rng.random(n), table["price"]),
    }
    other = table
    for c, v in changed.items():
        other = other.set_column(other.column_names.index(c), c, pa.array(v, table.schema.field(c).type))
    outs = []
    for k, t in enumerate([table, other]):
        (tmp_path / str(k)).mkdir()
        target = {"op": "TargetEncode", "columns": ["item", ["user", "item"]], "target": "label", "kfold": 3, "export_fold": True}
        pipeline, shards = write(tmp_path / str(k), t, [500], ops=[*OPS, target])
        preprocess(pipeline, shards, tmp_path / str(k) / "out", workers=2, split=TIME)
        outs.append(tmp_path / str(k) / "out")
    for role in ("train", "valid", "test"):
        assert tree(outs[0] / role / "artifacts") == tree(outs[1] / role / "artifacts")
    assert output(outs[0] / "train") == output(outs[1] / "train")
    assert output(outs[0] / "valid") != output(outs[1] / "valid")


HISTORY = {"op": "History", "key": "user", "time": "ts", "tiebreak": ["tb"], "columns": ["item"], "max_len": 4}


@pytest.mark.parametrize("workers", [1, 2])
def test_last_split_with_history_over_the_whole_timeline(tmp_path: Path, workers: int) -> None:
    table = events(1000, seed=4)
    ops = [*OPS[:2], HISTORY, OPS[2]]
    split = {"by": "last", "key": "user", "time": "ts", "tiebreak": ["tb"], "valid": 1, "test": 2}
    pipeline, shards = write(tmp_path, table, [333, 700], ops=ops)
    summary = preprocess(pipeline, shards, tmp_path / "out", workers=workers, split=split, memory_budget="40K")  # several partitions
    rows = table.to_pylist()
    role = {}
    by_user: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_user.setdefault(r["user"], []).append(i)
    for members in by_user.values():
        ordered = sorted(members, key=lambda i: (rows[i]["ts"], rows[i]["tb"] is not None, rows[i]["tb"] or 0, i))
        for rank, i in enumerate(reversed(ordered)):
            role[rows[i]["eid"]] = "test" if rank < 2 else "valid" if rank < 3 else "train"
    items = vocabulary([r["item"] for r in rows if role[r["eid"]] == "train"], key=lambda v: string_key(v.encode()))
    history = history_reference(table, 4, None)  # over every row: the whole timeline
    item_of = {r["eid"]: items.get(r["item"], 2) for r in rows}
    for part in summary.splits:
        got = output(tmp_path / "out" / part.role).to_pylist()
        assert sorted(g["eid"] for g in got) == sorted(e for e, r in role.items() if r == part.role)
        for g in got:
            assert g["hist_item"] == [item_of[e] for e in history[g["eid"]]] and g["hist_len"] == len(history[g["eid"]])
        stages = [(s.stage, s.rows_in, s.rows_out) for s in read_manifest(tmp_path / "out" / part.role).totals.stages]
        assert stages == [("Split", len(rows), len(got)), ("History", len(got), len(got))]
    test_rows = output(tmp_path / "out" / "test").to_pylist()
    assert any(role[e] == "train" for g in test_rows for e in history[g["eid"]])  # a test row sees earlier train events
    assert [(s.stage, s.rows_in, s.rows_out) for s in summary.stages] == [("History", len(rows), len(rows))]


def test_time_split_with_history_sees_every_earlier_event(tmp_path: Path) -> None:
    """The time column is passthrough; a Filter before the split; quarantined rows land in their split's
    quarantine."""
    table = events(800, seed=5, null_labels=True)
    ops = [*OPS[:2], HISTORY, OPS[2]]
    stages = [{"stage": "Filter", "where": {"column": "price", "op": "<", "value": 90}}]
    pipeline, shards = write(tmp_path, table, [400], ops=ops, stages=stages)
    summary = preprocess(pipeline, shards, tmp_path / "out", workers=2, split=TIME, on_error="quarantine")
    rows = [r for r in table.to_pylist() if r["price"] < 90]
    kept = {r["eid"] for r in rows if r["label"] is not None}
    history = history_reference(table, 4, None, kept)
    for part in summary.splits:
        mine = {r["eid"] for r in rows if role_of(r, TIME) == part.role}
        got = output(tmp_path / "out" / part.role)
        assert sorted(got["eid"].to_pylist()) == sorted(mine & kept)
        m = read_manifest(tmp_path / "out" / part.role)
        quarantined = pa.concat_tables([pq.read_table(tmp_path / "out" / part.role / e.quarantine) for e in m.files if e.quarantine])
        assert sorted(quarantined["eid"].to_pylist()) == sorted(mine - kept) and m.totals.rows_quarantined == len(mine - kept)
        assert [(s.stage, s.rows_out) for s in m.totals.stages] == [("Filter", len(rows)), ("Split", len(mine)), ("History", len(mine))]
        for g in got.to_pylist():
            assert len(history[g["eid"]]) == g["hist_len"]
    assert summary.rows_in == table.num_rows and summary.rows_out + summary.rows_quarantined == len(rows)


def test_a_rerun_keeps_what_is_done_and_another_split_redoes_it(tmp_path: Path) -> None:
    table = events(600, seed=6)
    pipeline, shards = write(tmp_path, table, [300])
    first = preprocess(pipeline, shards, tmp_path / "out", split=TIME)
    before = {role: tree(tmp_path / "out" / role) for role in ("train", "valid", "test")}
    again = preprocess(Pipeline.from_file(tmp_path / "p.yaml"), shards, tmp_path / "out", split=TIME)
    assert [p.summary.files_skipped for p in again.splits] == [2, 2, 2] and [p.report for p in again.splits] == [p.report for p in first.splits]
    assert {role: tree(tmp_path / "out" / role) for role in ("train", "valid", "test")} == before
    other = preprocess(Pipeline.from_file(tmp_path / "p.yaml"), shards, tmp_path / "out", split={**TIME, "valid_until": 90})
    assert [p.summary.files_skipped for p in other.splits] == [0, 0, 0]
    assert output(tmp_path / "out" / "test")["eid"].to_pylist() == [r["eid"] for r in table.to_pylist() if r["ts"] >= 90]
    with pytest.raises(OutputError, match="holds the valid split of an earlier run; this split has none"):
        preprocess(Pipeline.from_file(tmp_path / "p.yaml"), shards, tmp_path / "out", split={**TIME, "valid_until": None})


def test_the_pipelines_own_split_and_what_is_refused(tmp_path: Path) -> None:
    table = events(300, seed=7)
    pipeline, shards = write(tmp_path, table, [], split=TIME)
    summary = preprocess(pipeline, shards, tmp_path / "out")
    assert [p.role for p in summary.splits] == ["train", "valid", "test"]
    art = tmp_path / "out" / "train" / "artifacts"
    assert json.loads((art / "pipeline.json").read_text())["pipeline"]["split"] == TIME
    with pytest.raises(ConfigError, match="takes no fitted artifacts"):
        preprocess(Pipeline.from_file(tmp_path / "p.yaml"), shards, tmp_path / "out2", artifacts=art)
    with pytest.raises(ConfigError, match="takes no fitted artifacts"):
        preprocess(Pipeline.load(art), shards, tmp_path / "out2", split=TIME)
    plain = write(tmp_path, table, [])[0]
    preprocess(plain, shards, tmp_path / "plain")
    with pytest.raises(OutputError, match="holds the output of a run without a split"):
        preprocess(Pipeline.from_file(tmp_path / "p.yaml"), shards, tmp_path / "plain", split=TIME)
    # the train-fitted artifacts transform other rows as any artifacts do: no split left to run
    preprocess(Pipeline.load(art), shards, tmp_path / "served")
    served, train = output(tmp_path / "served"), output(tmp_path / "out" / "train")
    assert served.filter(pc.is_in(served["eid"], train["eid"])) == train and read_manifest(tmp_path / "served").split is None


def test_each_split_reads_as_a_processed_output(tmp_path: Path) -> None:
    table = events(400, seed=8)
    pipeline, shards = write(tmp_path, table, [200])
    preprocess(pipeline, shards, tmp_path / "out", split="{by: time, column: ts, train_until: 60, valid_until: 80}")
    for role in ("train", "valid", "test"):
        got = output(tmp_path / "out" / role)
        batches = list(Loader(tmp_path / "out" / role, batch_size=64))
        assert sum(len(b.label) for b in batches) == got.num_rows
        np.testing.assert_array_equal(np.concatenate([b.label.numpy() for b in batches]), got["label"].to_numpy())
        text = describe(tmp_path / "out" / role)
        assert f"split: {role}" in text
    assert "never seen in train: user" in describe(tmp_path / "out" / "test")
    whole = describe(tmp_path / "out")  # the split run's directory: each split
    assert [line.split()[2] for line in whole.splitlines() if line.startswith("processed output:")] == [
        str(tmp_path / "out" / role) for role in ("train", "valid", "test")]  # fmt: skip
