"""The loader's resume contract: ``state_dict`` after any batch, loaded into a fresh loader, continues with exactly
the batches the uninterrupted loader yields; the order is a pure function of (data, seed, epoch, rank, world size).

Data: synthetic Criteo shards whose I1 holds the global row number (the loader's dense[:, 0] is log1p(row), from
which the row is recovered exactly), rewritten with small row groups of several sizes so that shuffle buffers and
batches straddle pieces and shards."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from etl.loader import Loader
from etl.schema import load_schema
from etl.tools.synth import generate

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "pipelines/criteo_hash.yaml"
ROWS = 10_001
BATCH = 777
BUFFER = 2_000  # not a multiple of BATCH; row groups are 900-1,300 rows: buffers span pieces and shards
SEED = 11


def build_raw(root: Path, rows: int, files: int, group_rows: list[int], seed: int) -> Path:
    """Synthetic Criteo shards with I1 = global row number, row groups cycling through ``group_rows``."""
    synth = generate(load_schema(ROOT / "schemas/criteo.yaml"), rows, files, root / "synth", seed=seed)
    raw = root / "raw"
    raw.mkdir()
    start = 0
    for i, p in enumerate(synth):
        t = pq.read_table(p)
        j = t.schema.get_field_index("I1")
        t = t.set_column(j, t.schema.field(j), pa.array(np.arange(start, start + t.num_rows), pa.int64()))
        pq.write_table(t, raw / p.name, row_group_size=group_rows[i % len(group_rows)])
        start += t.num_rows
    return raw


def row_ids(dense: torch.Tensor) -> np.ndarray:
    return np.rint(np.expm1(dense[:, 0].double().numpy())).astype(np.int64)


Batches = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def take(it, k: int | None = None) -> Batches:
    """Up to ``k`` batches (all when None) from an iterator, cloned (the loader reuses its slots)."""
    out: Batches = []
    while k is None or len(out) < k:
        try:
            b = next(it)
        except StopIteration:
            break
        out.append((b.label.clone(), b.dense.clone(), b.sparse.clone()))
    return out


def assert_same(got: Batches, want: Batches) -> None:
    assert len(got) == len(want)
    for i, ((l1, d1, s1), (l2, d2, s2)) in enumerate(zip(got, want)):
        assert torch.equal(l1, l2) and torch.equal(d1, d2) and torch.equal(s1, s2), f"batch {i} differs"


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    return build_raw(tmp_path_factory.mktemp("resume"), ROWS, 4, [1_100, 900, 1_300], seed=5)


def make(raw: Path, **kw) -> Loader:
    args = dict(pipeline=PIPELINE, batch_size=BATCH, shuffle=True, seed=SEED, shuffle_buffer=BUFFER, num_workers=2, prefetch=3)
    return Loader(raw, **(args | kw))


_reference: dict[tuple, Batches] = {}


def reference(raw: Path, epoch: int, **kw) -> Batches:
    """The whole epoch from an uninterrupted loader (cached per settings)."""
    key = (epoch, *sorted(kw.items()))
    if key not in _reference:
        loader = make(raw, **kw)
        loader.set_epoch(epoch)
        _reference[key] = take(iter(loader))
        assert len(_reference[key]) == len(loader)
        loader.close()
    return _reference[key]


def _straddling(n_batches: int, skip_first_buffer: bool) -> int:
    """The first k whose next batch straddles a shuffle-buffer boundary (after the first buffer if asked)."""
    for k in range(1, n_batches):
        a, b = k * BATCH, (k + 1) * BATCH - 1
        if a // BUFFER != b // BUFFER and (not skip_first_buffer or a >= BUFFER) and a % BUFFER:
            return k
    raise AssertionError("no straddling batch")


K_CASES = ["zero", "one", "straddle", "straddle-later", "last"]


def _k(case: str, n: int) -> int:
    return {"zero": 0, "one": 1, "straddle": _straddling(n, False), "straddle-later": _straddling(n, True), "last": n - 1}[case]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("case", K_CASES)
def test_resume_continues_with_the_same_batches(raw: Path, case: str, world_size: int, drop_last: bool) -> None:
    epoch = 1 if world_size == 1 else 2
    for rank in range(world_size):
        settings = dict(rank=rank, world_size=world_size, drop_last=drop_last)
        want = reference(raw, epoch, **settings)
        k = _k(case, len(want))
        assert 0 <= k <= len(want)

        first = make(raw, **settings)
        first.set_epoch(epoch)
        it = iter(first)
        head = take(it, k)
        state = first.state_dict()
        assert state["epoch"] == epoch and state["position"] == k
        json.dumps(state)  # a handful of plain numbers
        first.close()
        assert_same(head, want[:k])

        # a fresh loader, other thread counts (the order must not depend on them), still at epoch 0 until loaded
        second = make(raw, num_workers=3, prefetch=1, **settings)
        second.load_state_dict(state)
        assert second.state_dict() == state
        rest = take(iter(second))
        second.close()
        assert_same(rest, want[k:])


@pytest.mark.parametrize("case", ["one", "straddle-later"])
def test_resume_with_device_placement(raw: Path, case: str) -> None:
    """With transform_on="device" the batches, and the resumed batches, are those of host placement."""
    want = reference(raw, 1)
    k = _k(case, len(want))
    first = make(raw, transform_on="device")
    first.set_epoch(1)
    head = take(iter(first), k)
    state = first.state_dict()
    first.close()
    assert_same(head, want[:k])
    second = make(raw, transform_on="device", num_workers=1)
    second.load_state_dict(state)
    rest = take(iter(second))
    second.close()
    assert_same(rest, want[k:])


def test_resume_from_a_state_saved_after_the_last_batch(raw: Path) -> None:
    want = reference(raw, 1)
    first = make(raw)
    first.set_epoch(1)
    it = iter(first)
    assert_same(take(it, len(want)), want)
    state = first.state_dict()
    assert state["position"] == len(want)
    assert take(it) == []  # the saving pass is over: nothing is left of epoch 1
    first.close()

    second = make(raw)
    second.load_state_dict(state)
    second.set_epoch(state["epoch"])  # a training loop resuming at the saved epoch
    assert take(iter(second)) == [], "epoch 1 is yielded a second time after the resume"


@pytest.mark.parametrize("shuffle_buffer", [1, 500, BATCH])
def test_resume_with_buffers_no_larger_than_a_batch(raw: Path, shuffle_buffer: int) -> None:
    want = reference(raw, 0, shuffle_buffer=shuffle_buffer)
    for k in (1, 2, 7, len(want) - 1):
        first = make(raw, shuffle_buffer=shuffle_buffer)
        it = iter(first)
        assert_same(take(it, k), want[:k])
        state = first.state_dict()
        first.close()
        second = make(raw, shuffle_buffer=shuffle_buffer)
        second.load_state_dict(state)
        assert_same(take(iter(second)), want[k:])
        second.close()


def test_resume_twice_and_after_an_epoch_boundary(raw: Path) -> None:
    want = reference(raw, 0)
    loader = make(raw)
    it = iter(loader)
    got = take(it, 3)
    state = loader.state_dict()
    loader.close()
    for stop_at in (5, 9):  # resume, stop again, resume again
        nxt = make(raw)
        nxt.load_state_dict(state)
        it = iter(nxt)
        got += take(it, stop_at - len(got))
        state = nxt.state_dict()
        nxt.close()
    last = make(raw)
    last.load_state_dict(state)
    got += take(iter(last))
    assert_same(got, want)
    # after the epoch, set_epoch moves on; the next epoch matches a fresh loader's
    last.set_epoch(1)
    assert last.state_dict()["epoch"] == 1 and last.state_dict()["position"] == 0
    assert_same(take(iter(last)), reference(raw, 1))
    last.close()


def test_load_state_dict_rejects_other_settings(raw: Path) -> None:
    state = make(raw).state_dict()
    for kw in [dict(batch_size=BATCH + 1), dict(seed=SEED + 1), dict(shuffle=False), dict(shuffle_buffer=BUFFER + 1),
               dict(drop_last=True), dict(rank=1, world_size=2)]:  # fmt: skip
        with pytest.raises(ValueError, match="state_dict mismatch"):
            make(raw, **kw).load_state_dict(state)


def test_order_is_a_function_of_seed_and_epoch(raw: Path) -> None:
    e0, e1 = reference(raw, 0), reference(raw, 1)
    loader = make(raw)
    assert_same(take(iter(loader)), e0)  # same seed and epoch → identical
    loader.set_epoch(1)
    assert_same(take(iter(loader)), e1)
    loader.set_epoch(0)
    assert_same(take(iter(loader)), e0)  # going back to an epoch repeats it
    loader.close()

    ids0 = [row_ids(d) for _, d, _ in e0]
    ids1 = [row_ids(d) for _, d, _ in e1]
    assert not np.array_equal(np.concatenate(ids0), np.concatenate(ids1))  # set_epoch reshuffles
    assert np.array_equal(np.sort(np.concatenate(ids0)), np.arange(ROWS))  # ... the same rows, each once
    assert np.array_equal(np.sort(np.concatenate(ids1)), np.arange(ROWS))
    other = make(raw, seed=SEED + 1)
    ids_seed = np.concatenate([row_ids(d) for _, d, _ in take(iter(other))])
    other.close()
    assert not np.array_equal(ids_seed, np.concatenate(ids0))

    # the shuffle mixes rows within a buffer: the first batch is not a run of consecutive rows
    first = ids0[0]
    assert len(first) == BATCH and np.any(np.diff(first) != 1)
    assert first.max() - first.min() > 1_000  # rows of more than one piece
    # without shuffle: file order, whatever the seed or epoch
    plain = make(raw, shuffle=False, seed=3)
    plain.set_epoch(4)
    ids_plain = np.concatenate([row_ids(d) for _, d, _ in take(iter(plain))])
    plain.close()
    assert np.array_equal(ids_plain, np.arange(ROWS))


def test_set_epoch_mid_epoch_restarts_at_position_zero(raw: Path) -> None:
    loader = make(raw)
    it = iter(loader)
    take(it, 4)
    assert loader.state_dict()["position"] == 4
    loader.set_epoch(1)
    assert loader.state_dict()["position"] == 0 and loader.state_dict()["epoch"] == 1
    loader.close()
    fresh = make(raw)
    fresh.set_epoch(1)
    assert_same(take(iter(fresh)), reference(raw, 1))
    fresh.close()
