"""TargetEncode ``mode: ordered``: each row's value from the rows strictly before it, equal to a row-by-row Python
reference (within a batch too, through the table's growth, missing targets left out); the state goes back over the
batches in flight, restores exactly and refuses a tampered one; through the Loader (rows in their order: shuffle=False):
the same values on any worker count, each epoch from an empty state, an exact resume from state_dict, saved as JSON + Parquet;
the one-batch transform and etl preprocess refuse it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from etl.errors import ArtifactError, ConfigError
from etl.loader import Loader
from etl.ops.base import InvalidState
from etl.ops.stream import Carried
from etl.ops.target import TargetEncode
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.schema import parse_schema


def reference(keys: list, targets: list, smoothing: float) -> np.ndarray:
    """Row by row: the value from the rows before, then the row's target (None: missing) counted."""
    count: dict = {}
    total: dict = {}
    n, s, out = 0, 0.0, []
    for k, y in zip(keys, targets):
        prior = s / n if n else 0.0
        c, t = count.get(k, 0), total.get(k, 0.0)
        out.append((t + smoothing * prior) / (c + smoothing) if c + smoothing > 0 else prior)
        if y is not None:
            count[k], total[k], n, s = c + 1, t + y, n + 1, s + y
    return np.array(out)


def op(smoothing: float = 3.0) -> TargetEncode:
    return TargetEncode(["i", ["u", "i"]], target="y", mode="ordered", smoothing=smoothing)


def inputs(u: np.ndarray, i: np.ndarray, y: np.ndarray, present: np.ndarray) -> dict[str, Carried]:
    ones = np.ones(len(u), np.bool_)
    return {"u": Carried(u, ones), "i": Carried(i, ones), "y": Carried(y, present)}


@pytest.mark.parametrize("smoothing", [0.0, 3.0])
def test_values_are_those_of_the_rows_before(smoothing: float) -> None:
    rng = np.random.default_rng(4)
    n = 6_000
    u, i = rng.integers(0, 40, n), rng.integers(0, 1_500, n)  # more categories than a first table holds
    y, present = rng.integers(0, 11, n) / 2, rng.random(n) > 0.1
    te = op(smoothing)
    states = {name: te.new_stream_state(name) for name in te.names}
    got = {name: [] for name in te.names}
    for rows in np.array_split(np.arange(n), 7):
        batch = inputs(u[rows], i[rows], y[rows], present[rows])
        for name, state in states.items():
            got[name].append(state.advance(batch).outputs[name])
    targets = [float(t) if p else None for t, p in zip(y, present)]
    np.testing.assert_array_equal(np.concatenate(got["te_i"]), reference(list(i), targets, smoothing))
    np.testing.assert_array_equal(np.concatenate(got["te_u_i"]), reference(list(zip(u, i)), targets, smoothing))


def test_the_state_goes_back_over_batches_restores_exactly_and_refuses_a_tampered_one() -> None:
    rng = np.random.default_rng(5)
    te = op()
    state = te.new_stream_state("te_u_i")
    batches = [inputs(rng.integers(0, 30, 500), rng.integers(0, 900, 500), rng.integers(0, 2, 500).astype(float), rng.random(500) > 0.2)
               for _ in range(4)]  # fmt: skip
    steps = [state.advance(b) for b in batches[:2]]
    after_two = state.export()
    steps += [state.advance(b) for b in batches[2:]]
    back = state.export(undo=[steps[3].undo, steps[2].undo])
    assert back.keys() == after_two.keys() and all(np.array_equal(back[k], after_two[k]) for k in back)
    fresh = te.new_stream_state("te_u_i")
    fresh.check(back)
    fresh.restore(back)
    np.testing.assert_array_equal(fresh.advance(batches[2]).outputs["te_u_i"], steps[2].outputs["te_u_i"])
    for bad, problem in [({"count": np.r_[0, back["count"][1:]]}, "a count below 1"),
                         ({"key": np.r_[back["key"][:1], back["key"][:-1]]}, "a key appears more than once"),
                         ({"rows": int(back["rows"]) + 1}, "the entries add up to"),
                         ({"units": back["units"][:-1]}, "differ in length")]:  # fmt: skip
        with pytest.raises(InvalidState, match=problem):
            fresh.check(back | bad)


SCHEMA = {"name": "s", "columns": [{"name": "y", "role": "label", "dtype": "int64"},
                                   {"name": "u", "role": "categorical", "dtype": "int64", "encoding": "int"},
                                   {"name": "i", "role": "categorical", "dtype": "int64", "encoding": "int"}]}  # fmt: skip
OPS = [{"op": "Decode", "columns": ["u", "i"]}, {"op": "Categorify", "columns": ["u", "i"]},
       {"op": "TargetEncode", "columns": ["i", ["u", "i"]], "target": "y", "mode": "ordered", "smoothing": 2}]  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ordered")
    (d / "raw").mkdir()
    rng = np.random.default_rng(6)
    n = 2_500
    table = pa.table({"y": rng.integers(0, 2, n), "u": rng.integers(0, 40, n), "i": rng.integers(0, 60, n)})
    for k, (a, b) in enumerate([(0, 1_200), (1_200, n)]):
        pq.write_table(table.slice(a, b - a), d / "raw" / f"part-{k}.parquet", row_group_size=400)
    (d / "s.yaml").write_text(yaml.safe_dump(SCHEMA))
    (d / "p.yaml").write_text(yaml.safe_dump({"name": "p", "schema": "s.yaml", "ops": OPS}))
    p = Pipeline.from_file(d / "p.yaml")
    p.fit(sorted((d / "raw").iterdir()))
    p.save(d / "art")
    return d


def loader(data: Path, **kw) -> Loader:
    settings = {"batch_size": 200, "num_workers": 2, "copy": True} | kw
    return Loader(data / "raw", data / "p.yaml", artifacts=data / "art", **settings)


def epochs(ld: Loader, which: range) -> list[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    out = []
    for e in which:
        ld.set_epoch(e)
        out.append([(b.label.clone(), b.sparse.clone(), b.dense.clone()) for b in ld])
    return out


def check_epoch(batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
    """The values of one epoch, from an empty state, over its rows in the order the loader gave them (the
    categories: the ids the batch holds)."""
    y = torch.cat([b[0] for b in batches]).numpy().astype(float).tolist()
    ids = torch.cat([b[1] for b in batches]).numpy()
    dense = torch.cat([b[2] for b in batches]).numpy()
    np.testing.assert_array_equal(dense[:, 0], reference(list(ids[:, 1]), y, 2).astype(np.float32))
    np.testing.assert_array_equal(dense[:, 1], reference(list(map(tuple, ids)), y, 2).astype(np.float32))


def test_the_loader_gives_the_values_of_the_rows_before_each_epoch_from_scratch(data: Path) -> None:
    got = epochs(loader(data), range(2))
    for epoch in got:
        check_epoch(epoch)
    assert all(torch.equal(a[2], b[2]) for a, b in zip(got[0], epochs(loader(data, num_workers=0), range(1))[0]))
    assert all(torch.equal(a[2], b[2]) for a, b in zip(got[0], got[1]))  # the second epoch starts empty again
    with pytest.raises(ConfigError, match="ordered target statistics of 'te_i' .* loader's row order, which must be their time order"):
        loader(data, shuffle=True)


@pytest.mark.parametrize("stop", [1, 6, 13, 16])
def test_a_resumed_loader_gives_the_uninterrupted_values(data: Path, stop: int, tmp_path: Path) -> None:
    whole = [b for e in epochs(loader(data), range(2)) for b in e]
    first = loader(data)
    got = []
    for e in range(2):
        first.set_epoch(e)
        for b in first:
            got.append((b.label.clone(), b.sparse.clone(), b.dense.clone()))
            if len(got) == stop:
                break
        if len(got) == stop:
            break
    state = first.state_dict()
    first.save_vocabulary(tmp_path / "saved")
    first.close()
    for resume in ("state_dict", "saved"):
        resumed = loader(data, num_workers=1)
        if resume == "state_dict":
            resumed.load_state_dict(state)
        else:
            resumed.set_epoch(state["epoch"])
            resumed.load_state_dict(state)
            resumed.load_vocabulary(tmp_path / "saved")
        rest = [b for e in epochs(resumed, range(state["epoch"], 2)) for b in e]
        assert len(got) + len(rest) == len(whole)
        assert all(torch.equal(a[2], b[2]) for a, b in zip(got + rest, whole)), resume


def test_a_saved_state_is_json_and_parquet_and_a_tampered_one_is_refused(data: Path, tmp_path: Path) -> None:
    ld = loader(data)
    it = iter(ld)
    for _ in range(4):
        next(it)
    ld.save_vocabulary(tmp_path / "saved")
    doc = json.loads((tmp_path / "saved/stream_state.json").read_text())
    assert sorted(doc["states"]) == ["te_i", "te_u_i"]
    path = tmp_path / "saved" / doc["states"]["te_i"]["table"]
    t = pq.read_table(path)
    counts = t.column("count").to_numpy().copy()
    counts[0] += 1
    pq.write_table(t.set_column(t.schema.get_field_index("count"), "count", pa.array(counts)), path)
    with pytest.raises(ArtifactError, match=rf"{path}: .*the entries add up to"):
        loader(data).load_vocabulary(tmp_path / "saved")


def test_one_batch_transforms_and_preprocess_refuse_it(data: Path, tmp_path: Path) -> None:
    p = Pipeline.load(data / "art")
    assert p.is_fitted and p.ops[-1].state() == ({}, {})
    with pytest.raises(ConfigError, match="mode: ordered .* as the Loader streams them"):
        p.transform_table({"u": [1], "i": [2]})
    with pytest.raises(ConfigError, match="ordered target statistics of 'te_i'.*given by etl.Loader"):
        preprocess(Pipeline.from_file(data / "p.yaml"), sorted((data / "raw").iterdir()), tmp_path / "out")
    with pytest.raises(ValueError, match="fold_by and export_fold are for mode: kfold"):
        Pipeline({"ops": [*OPS[:2], OPS[2] | {"fold_by": "u"}]}, parse_schema(SCHEMA))
