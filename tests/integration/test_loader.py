"""The loader end to end: sharding over ranks, the real Criteo sample against ``etl preprocess``, list columns,
backpressure, error propagation, clean shutdown, stats, and (on a GPU) the CUDA path.

Synthetic Criteo shards here have I1 = global row number, so the loader's dense[:, 0] = log1p(row) identifies every
row exactly (float32 log1p is injective and invertible by rounding below 200k); each row is also compared with the
pipeline's own transform of the raw table (``Pipeline.transform_table``)."""

from __future__ import annotations

import gc
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import etl.loader.chunk
from etl.errors import LoaderError, RowError
from etl.loader import Loader
from etl.loader.threads import ThreadEngine
from etl.pipeline import Pipeline
from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import REPO, etl_threads, new_threads, run_etl, stacks

HASH = REPO / "pipelines/criteo_hash.yaml"
DENSE = [f"I{i}" for i in range(1, 14)]
CATS = [f"C{i}" for i in range(1, 27)]
ROWS = 20_003


# ---------------------------------------------------------------- data and helpers


def build_raw(root: Path, rows: int, files: int, group_rows: list[int], seed: int, schema: str = "criteo", id_column: str = "I1") -> Path:
    """Synthetic shards with ``id_column`` = global row number, row groups cycling through ``group_rows``."""
    synth = generate(load_schema(REPO / f"schemas/{schema}.yaml"), rows, files, root / "synth", seed=seed)
    raw = root / "raw"
    raw.mkdir()
    start = 0
    for i, p in enumerate(synth):
        t = pq.read_table(p)
        j = t.schema.get_field_index(id_column)
        t = t.set_column(j, t.schema.field(j), pa.array(np.arange(start, start + t.num_rows), pa.int64()))
        pq.write_table(t, raw / p.name, row_group_size=group_rows[i % len(group_rows)])
        start += t.num_rows
    return raw


def row_ids(dense: torch.Tensor) -> np.ndarray:
    return np.rint(np.expm1(dense[:, 0].double().cpu().numpy())).astype(np.int64)


def collect(loader: Loader) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """A whole pass, cloned (the tensors of a batch live in a reused slot)."""
    return [(b.label.clone(), b.dense.clone(), b.sparse.clone()) for b in loader]


def run_with_timeout(fn: Callable[[], Any], seconds: float) -> tuple[bool, dict[str, Any]]:
    """Run ``fn`` in a daemon thread; (still running after ``seconds``, {'value'|'error': ...})."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=target, daemon=True, name="test-runner")
    t.start()
    t.join(seconds)
    out["thread"] = t
    return t.is_alive(), out


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    return build_raw(tmp_path_factory.mktemp("loader"), ROWS, 3, [2_500, 1_700, 3_100], seed=21)


@pytest.fixture(scope="module")
def expected(raw: Path) -> dict[str, np.ndarray]:
    """The pipeline's transform of every raw row, indexed by row number."""
    table = pa.concat_tables([pq.read_table(p) for p in sorted(raw.glob("*.parquet"))])
    out = Pipeline.from_file(HASH).transform_table(table)
    assert out.num_rows == ROWS
    return {
        "label": out.column("label").to_numpy(),
        "dense": np.stack([out.column(c).to_numpy() for c in DENSE], axis=1),
        "sparse": np.stack([out.column(c).to_numpy() for c in CATS], axis=1),
    }


@pytest.fixture(scope="module")
def small_raw(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("small")
    generate(load_schema(REPO / "schemas/criteo.yaml"), 3_000, 2, d, seed=2)
    return d


# ---------------------------------------------------------------- (1) sharding


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ranks_partition_the_data(raw: Path, expected: dict, world_size: int, drop_last: bool, shuffle: bool) -> None:
    B = 777
    lengths, per_rank = [], []
    for rank in range(world_size):
        loader = Loader(raw, pipeline=HASH, batch_size=B, shuffle=shuffle, seed=4, shuffle_buffer=3_000,
                        drop_last=drop_last, rank=rank, world_size=world_size, num_workers=2, prefetch=2)  # fmt: skip
        batches = collect(loader)
        loader.close()
        rank_rows = (rank + 1) * ROWS // world_size - rank * ROWS // world_size
        assert len(batches) == len(loader), f"rank {rank}"
        lengths.append(len(loader))
        sizes = [len(lab) for lab, _, _ in batches]
        if drop_last:
            assert sizes == [B] * len(batches)
            assert len(batches) == (ROWS // world_size) // B
        else:
            assert sizes[:-1] == [B] * (len(batches) - 1)
            assert sum(sizes) == rank_rows
        ids = np.concatenate([row_ids(d) for _, d, _ in batches])
        per_rank.append(ids)
        # every row is the transform of the raw row it claims to be
        label = torch.cat([lab for lab, _, _ in batches]).numpy()
        dense = torch.cat([d for _, d, _ in batches]).numpy()
        sparse = torch.cat([s for _, _, s in batches]).numpy()
        assert ids.min() >= 0 and ids.max() < ROWS
        np.testing.assert_array_equal(label, expected["label"][ids])
        np.testing.assert_array_equal(dense, expected["dense"][ids])
        np.testing.assert_array_equal(sparse, expected["sparse"][ids])
        if not shuffle and world_size == 1:
            np.testing.assert_array_equal(ids, np.arange(len(ids)))
    assert len(set(lengths)) == 1, f"ranks yield different numbers of batches: {lengths}"
    everything = np.concatenate(per_rank)
    assert len(np.unique(everything)) == len(everything), "a row was yielded twice"
    if not drop_last:
        np.testing.assert_array_equal(np.sort(everything), np.arange(ROWS))
    else:
        assert len(everything) == world_size * lengths[0] * B


def test_a_shorter_rank_ends_with_an_empty_batch(tmp_path: Path) -> None:
    """2,001 rows on 2 ranks, batches of 500: rank 1 has 1,001 rows (3 batches), so rank 0 (1,000 rows) must
    yield a third, empty batch, or a collective in the training loop hangs."""
    raw = build_raw(tmp_path, 2_001, 2, [400], seed=3)
    got = {}
    for rank in (0, 1):
        loader = Loader(raw, pipeline=HASH, batch_size=500, rank=rank, world_size=2, shuffle=True, shuffle_buffer=700)
        assert len(loader) == 3
        batches = collect(loader)
        got[rank] = batches
    assert [len(b[0]) for b in got[0]] == [500, 500, 0]
    assert [len(b[0]) for b in got[1]] == [500, 500, 1]
    label, dense, sparse = got[0][-1]
    assert label.shape == (0,) and dense.shape == (0, 13) and sparse.shape == (0, 26) and sparse.dtype == torch.int32
    ids = np.concatenate([row_ids(d) for r in (0, 1) for _, d, _ in got[r]])
    np.testing.assert_array_equal(np.sort(ids), np.arange(2_001))


@pytest.mark.parametrize(
    ("rank", "world_size"),
    [
        (2, 2),
        (-1, 2),
        (0, 0),
    ],
)
def test_an_invalid_rank_raises_value_error(small_raw: Path, rank: int, world_size: int) -> None:
    with pytest.raises(ValueError, match="rank"):
        Loader(small_raw, pipeline=HASH, batch_size=500, rank=rank, world_size=world_size)


# ---------------------------------------------------------------- (2) the real Criteo sample


@pytest.fixture(scope="module")
def criteo_processed(criteo_8k_shards: Path, tmp_path_factory) -> tuple[Path, Path, dict[str, np.ndarray]]:
    raw, out = criteo_8k_shards, tmp_path_factory.mktemp("criteo-loader") / "out"
    run_etl("preprocess", "--pipeline", REPO / "pipelines/criteo.yaml", "--input", raw, "--out", out, "--workers", 2)
    manifest = json.loads((out / "manifest.json").read_text())
    tables = [pq.read_table(out / f["output"]) for f in manifest["files"]]
    t = pa.concat_tables(tables)
    assert t.num_rows == 8_000
    cols = {
        "label": t.column("label").to_numpy(),
        "dense": np.stack([t.column(c).to_numpy() for c in DENSE], axis=1),
        "sparse": np.stack([t.column(c).to_numpy() for c in CATS], axis=1),
    }
    return raw, out, cols


def _concat(batches) -> dict[str, np.ndarray]:
    return {
        "label": torch.cat([b[0] for b in batches]).numpy(),
        "dense": torch.cat([b[1] for b in batches]).numpy(),
        "sparse": torch.cat([b[2] for b in batches]).numpy(),
    }


def test_real_criteo_loader_matches_preprocess(criteo_processed) -> None:
    raw, out, want = criteo_processed
    from_raw = Loader(raw, pipeline=REPO / "pipelines/criteo.yaml", artifacts=out / "artifacts", batch_size=777)
    assert from_raw.layout.dense == DENSE and from_raw.layout.sparse == CATS and from_raw.layout.sparse_dtype == torch.int32
    got = _concat(collect(from_raw))
    from_out = Loader(out, batch_size=1000, num_workers=3)
    got_out = _concat(collect(from_out))
    for name in ("label", "dense", "sparse"):
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"raw + artifacts: {name}")
        np.testing.assert_array_equal(got_out[name], want[name], err_msg=f"processed dir: {name}")

    # preprocess keeps one row group per input row group, so a shuffled pass is the same from either source
    pipeline, artifacts = REPO / "pipelines/criteo.yaml", out / "artifacts"
    a = collect(Loader(raw, pipeline=pipeline, artifacts=artifacts, batch_size=500, shuffle=True, seed=9, shuffle_buffer=1_200))
    b = collect(Loader(out, batch_size=500, shuffle=True, seed=9, shuffle_buffer=1_200))
    assert len(a) == len(b) == 16
    for x, y in zip(a, b):
        assert all(torch.equal(u, v) for u, v in zip(x, y))
    shuffled = _concat(a)
    assert not np.array_equal(shuffled["label"], want["label"]) or not np.array_equal(shuffled["dense"], want["dense"])
    key = lambda d: np.lexsort(np.concatenate([d["dense"].view(np.int32), d["sparse"]], axis=1).T)  # noqa: E731
    for name in ("label", "dense", "sparse"):  # the same rows, reordered
        np.testing.assert_array_equal(shuffled[name][key(shuffled)], want[name][key(want)])


# ---------------------------------------------------------------- list columns


def test_list_columns_follow_their_rows(tmp_path: Path) -> None:
    """MovieLens-like rows with a multi-hot column (timestamp = row number identifies rows), fitted artifacts."""
    raw = build_raw(tmp_path, 5_000, 3, [700, 1_100], seed=8, schema="movielens", id_column="timestamp")
    pipe = Pipeline.from_file(REPO / "pipelines/movielens.yaml")
    pipe.fit(sorted(raw.glob("*.parquet")))
    pipe.save(tmp_path / "art")
    table = pipe.transform_table(pa.concat_tables([pq.read_table(p) for p in sorted(raw.glob("*.parquet"))]))
    ts = table.column("timestamp").to_numpy()
    want_lists = table.column("genres").to_pylist()
    index = {float(v): i for i, v in enumerate(ts)}
    assert len(index) == 5_000

    for shuffle in (False, True):
        loader = Loader(raw, pipeline=REPO / "pipelines/movielens.yaml", artifacts=tmp_path / "art", batch_size=333,
                        shuffle=shuffle, shuffle_buffer=900, seed=1)  # fmt: skip
        assert loader.layout.lists == ["genres"]
        seen = []
        for b in loader:
            values, offsets = b.lists["genres"]
            assert offsets.shape == (len(b) + 1,) and offsets[0] == 0 and offsets[-1] == len(values)
            for i in range(len(b)):
                row = index[float(b.dense[i, 0])]
                seen.append(row)
                assert values[offsets[i] : offsets[i + 1]].tolist() == want_lists[row], row
                assert b.sparse[i].tolist() == [table.column("userId")[row].as_py(), table.column("movieId")[row].as_py()]
        assert sorted(seen) == list(range(5_000))
        if not shuffle:
            assert seen == list(range(5_000))


# ---------------------------------------------------------------- (3) backpressure


def test_a_stalled_consumer_bounds_the_reads(tmp_path: Path, monkeypatch) -> None:
    raw = build_raw(tmp_path, 30_000, 3, [500], seed=5)  # 60 pieces of 500 rows
    calls = []
    lock = threading.Lock()
    original = ThreadEngine.read

    def counting(self, piece):
        with lock:
            calls.append(piece)
        return original(self, piece)

    monkeypatch.setattr(ThreadEngine, "read", counting)
    monkeypatch.setattr(ThreadEngine, "start_ahead", lambda self, loader, epoch, after: None)  # count this pass's reads only
    W, P, B, S, piece = 2, 2, 100, 1_000, 500
    loader = Loader(raw, pipeline=HASH, batch_size=B, shuffle=True, shuffle_buffer=S, num_workers=W, prefetch=P)
    total_pieces = len(loader.groups)
    assert total_pieces == 60
    it = iter(loader)
    first = next(it)
    assert len(first) == B
    # stall until the reads settle (no new read for 0.5 s; a loader without backpressure reads all 60)
    read_after_stall, deadline = -1, time.monotonic() + 10
    while len(calls) != read_after_stall and time.monotonic() < deadline:
        read_after_stall = len(calls)
        time.sleep(0.5)
    assert len(calls) == read_after_stall, "reading went on while the consumer stalled"
    slots_rows = (P + 2) * B  # batches the ring and ready queue can hold
    bound = W + P + -(-S // piece) + -(-slots_rows // piece) + 2
    assert read_after_stall <= bound < total_pieces, (read_after_stall, bound)
    # once the consumer goes on, everything is read exactly once
    rest = sum(len(b) for b in it)
    loader.close()
    assert rest + B == 30_000
    assert len(calls) == total_pieces
    assert len({(p.group.path, p.group.index, p.start) for p in calls}) == total_pieces


# ---------------------------------------------------------------- (4) errors


def _with_bad_hex(root: Path, rows: int, bad_row: int, group_rows: int) -> Path:
    """One shard whose C5 holds a malformed key at ``bad_row``."""
    p = generate(load_schema(REPO / "schemas/criteo.yaml"), rows, 1, root / "synth", seed=6)[0]
    t = pq.read_table(p)
    j = t.schema.get_field_index("C5")
    values = t.column(j).to_pylist()
    values[bad_row] = "12345g78"
    t = t.set_column(j, t.schema.field(j), pa.array(values, t.schema.field(j).type))
    out = root / "bad.parquet"
    pq.write_table(t, out, row_group_size=group_rows)
    return out


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_malformed_value_raises_row_error_with_its_location(tmp_path: Path, shuffle: bool) -> None:
    before = etl_threads()
    good = generate(load_schema(REPO / "schemas/criteo.yaml"), 4_500, 1, tmp_path / "good", seed=7)[0]
    bad = _with_bad_hex(tmp_path, 5_000, bad_row=2_345, group_rows=1_000)
    loader = Loader([good, bad], pipeline=HASH, batch_size=1_000, shuffle=shuffle, shuffle_buffer=1_500)
    with pytest.raises(RowError) as info:
        for _ in loader:
            pass
    e = info.value
    assert (e.path, e.row_group, e.row, e.column) == (str(bad), 2, 2_345, "C5")
    assert str(bad) in str(e) and "row group 2" in str(e) and "row 2345" in str(e) and "'C5'" in str(e)
    assert not (left := new_threads(before)), stacks(left)  # the error stopped the threads


def test_row_error_counts_rows_from_the_file_start_when_a_rank_starts_mid_group(tmp_path: Path) -> None:
    """Rank 1 of 2 starts at global row 4,750 = row 250 of the bad file, inside its row group 0."""
    good = generate(load_schema(REPO / "schemas/criteo.yaml"), 4_500, 1, tmp_path / "good", seed=7)[0]
    bad = _with_bad_hex(tmp_path, 5_000, bad_row=600, group_rows=1_000)
    rank0 = Loader([good, bad], pipeline=HASH, batch_size=1_000, rank=0, world_size=2)
    assert sum(len(b) for b in rank0) == 4_750  # the bad row is not rank 0's
    rank1 = Loader([good, bad], pipeline=HASH, batch_size=1_000, rank=1, world_size=2)
    with pytest.raises(RowError) as info:
        for _ in rank1:
            pass
    assert (info.value.path, info.value.row_group, info.value.row, info.value.column) == (str(bad), 0, 600, "C5")


def test_an_unexpected_worker_failure_is_wrapped_with_the_piece(raw: Path, monkeypatch) -> None:
    # workers of earlier loaders finish their current piece after shutdown(wait=False): let them, so that they
    # do not count as calls below
    new_threads(set())
    before = etl_threads()
    original = etl.loader.chunk.Chunk.from_batch.__func__
    calls = []
    lock = threading.Lock()

    def flaky(cls, batch, layout):
        with lock:
            calls.append(1)
            n = len(calls)
        if n == 3:
            raise RuntimeError("disk on fire")
        return original(cls, batch, layout)

    monkeypatch.setattr(etl.loader.chunk.Chunk, "from_batch", classmethod(flaky))
    loader = Loader(raw, pipeline=HASH, batch_size=500, num_workers=1, prefetch=1)
    third = loader.groups[2]  # shuffle off, one worker: the third piece read is the third row group
    got = 0
    with pytest.raises(LoaderError) as info:
        for b in loader:
            got += len(b)
    msg = str(info.value)
    assert str(third.path) in msg and f"row group {third.index}" in msg, msg
    assert "RuntimeError" in msg and "disk on fire" in msg
    assert isinstance(info.value.__cause__, RuntimeError)
    # batches made of the pieces before it came first; none with rows of the failed piece
    rows_before = loader.groups[0].num_rows + loader.groups[1].num_rows
    assert 0 < got <= rows_before
    assert not (left := new_threads(before)), stacks(left)


# ---------------------------------------------------------------- (5) shutdown


def test_break_mid_epoch_stops_the_threads(raw: Path) -> None:
    before = etl_threads()
    loader = Loader(raw, pipeline=HASH, batch_size=500, num_workers=2, prefetch=2)
    it = iter(loader)
    for _ in range(3):
        next(it)
    assert "etl-assembler" in {t.name for t in etl_threads() - before}  # the assembler (and workers) run while iterating
    del it
    gc.collect()
    assert not (left := new_threads(before)), stacks(left)

    # the same with a for loop and break
    for i, _ in enumerate(Loader(raw, pipeline=HASH, batch_size=500)):
        if i == 2:
            break
    gc.collect()
    assert not (left := new_threads(before)), stacks(left)


def test_many_short_epochs_do_not_grow_the_threads(small_raw: Path) -> None:
    """Between epochs only the next epoch's pass runs (its assembler and num_workers workers); close stops it."""
    before = etl_threads()
    loader = Loader(small_raw, pipeline=HASH, batch_size=500, shuffle=True, shuffle_buffer=800, num_workers=2)
    counts = []
    for epoch in range(20):
        loader.set_epoch(epoch)
        assert sum(len(b) for b in loader) == 3_000
        counts.append(len(new_threads(before, allow=3)))
    assert max(counts) <= 3, counts
    loader.close()
    assert not (left := new_threads(before)), stacks(left)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_the_next_epoch_starts_while_the_current_one_drains(small_raw: Path, device: str) -> None:
    """After a full pass, epoch + 1 is already being assembled; set_epoch(epoch + 1) then yields exactly the
    batches a fresh loader yields for that epoch, and iterating again without set_epoch repeats the epoch."""
    kw = dict(pipeline=HASH, batch_size=500, shuffle=True, shuffle_buffer=800, seed=5, device=device)
    loader = Loader(small_raw, **kw)
    first = collect(loader)
    assert loader._engine.ahead is not None and loader._engine.ahead.epoch == 1
    again = collect(loader)  # no set_epoch: epoch 0 again, the prepared epoch 1 is discarded
    assert all(torch.equal(u, v) for x, y in zip(first, again) for u, v in zip(x, y))
    loader.set_epoch(1)
    loader.set_epoch(1)  # setting the current epoch keeps the prepared pass
    assert loader._engine.ahead is not None and loader._engine.ahead.epoch == 1
    second = collect(loader)
    fresh = Loader(small_raw, **kw)
    fresh.set_epoch(1)
    want = collect(fresh)
    assert len(second) == len(want) == 6
    assert all(torch.equal(u, v) for x, y in zip(second, want) for u, v in zip(x, y))
    assert not all(torch.equal(x[0], y[0]) for x, y in zip(first, second))  # another shuffle
    loader.set_epoch(7)  # not the prepared epoch: it is discarded
    assert loader._engine.ahead is None
    assert sum(len(b[0]) for b in collect(loader)) == 3_000
    loader.close()
    fresh.close()


def test_close_is_idempotent(small_raw: Path) -> None:
    before = etl_threads()
    loader = Loader(small_raw, pipeline=HASH, batch_size=500)
    loader.close()
    loader.close()  # before any iteration
    it = iter(loader)
    next(it)
    loader.close()
    loader.close()
    assert not (left := new_threads(before)), stacks(left)
    del it
    gc.collect()
    loader.close()
    assert not (left := new_threads(before)), stacks(left)


def test_iterating_again_after_a_break_does_not_hang(small_raw: Path) -> None:
    loader = Loader(small_raw, pipeline=HASH, batch_size=500, prefetch=2)
    try:
        for cycle in range(3):
            it = iter(loader)
            next(it)
            time.sleep(0.3)  # the assembler fills every slot meanwhile
            del it  # as a `break` does
            gc.collect()
            hung, out = run_with_timeout(lambda: sum(len(b) for b in loader), 5)
            assert not hung, f"cycle {cycle}: no batch within 5 s after abandoning an epoch"
            assert out.get("value") == 2_500  # a new iteration yields the rest of the abandoned epoch
    finally:
        loader.close()  # stops the assembler, so a stuck consumer thread ends with an error
        gc.collect()
        new_threads(set())


# ---------------------------------------------------------------- (6) stats


def test_stats_after_an_epoch(raw: Path) -> None:
    loader = Loader(raw, pipeline=HASH, batch_size=1_000, shuffle=True, shuffle_buffer=2_500)
    n = sum(len(b) for b in loader)
    s = loader.stats
    assert n == ROWS
    assert s.batches == len(loader) == 21
    assert s.rows == ROWS
    assert 0.0 <= s.data_wait_fraction <= 1.0
    assert s.consumer_seconds > 0 and 0 <= s.wait_seconds <= s.consumer_seconds
    assert s.read_seconds > 0 and s.transform_seconds > 0 and s.assemble_seconds > 0
    d = s.as_dict()
    assert d["batches"] == s.batches and d["data_wait_fraction"] == s.data_wait_fraction


# ---------------------------------------------------------------- (7) CUDA


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batches_equal_the_cpu_batches(raw: Path) -> None:
    kw = dict(pipeline=HASH, batch_size=777, shuffle=True, seed=3, shuffle_buffer=2_000, prefetch=2)
    cpu = collect(Loader(raw, **kw))
    loader = Loader(raw, device="cuda", **kw)
    sums = []
    for i, b in enumerate(loader):
        assert b.label.is_cuda and b.dense.is_cuda and b.sparse.is_cuda
        if i % 2:
            torch.cuda._sleep(20_000_000)  # queued GPU work still reads the slot when the next batch is asked for
        # work queued on the consumer's stream, behind the sleep: it must still see this batch, not the next
        sums.append((b.label.sum(), b.sparse.long().sum(0), b.label.clone(), b.dense.clone(), b.sparse.clone()))
    torch.cuda.synchronize()
    assert len(sums) == len(cpu)
    for (ls, ss, lab, dense, sparse), (clab, cdense, csparse) in zip(sums, cpu):
        assert torch.equal(lab.cpu(), clab) and torch.equal(dense.cpu(), cdense) and torch.equal(sparse.cpu(), csparse)
        assert ls.item() == clab.sum().item()  # 0/1 labels: exact
        assert torch.equal(ss.cpu(), csparse.long().sum(0))
