"""Sequences in loader batches (etl.loader.sequences): a History op's lengths column comes as ``batch.lengths``, out
of ``sparse`` and ``to_kjt``; ``pad_to`` gives its lists as padded [B, L] ids (left or right, the latest L
entries of a longer history) in ring fields allocated once; the same for a processed output and for the streaming
History on raw shards; refusals of bad settings."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from etl import Loader
from etl.errors import ConfigError
from etl.ids import PAD
from etl.loader.sequences import Padding, Sequence, pad_into, paddings
from etl.preprocess import preprocess
from tests.unit.loader.test_stream_history import fitted, time_ordered
from tests.unit.preprocess.test_keyed import make_pipeline, write_shards


def padded_reference(lists: list[list[int]], size: int, side: str) -> list[list[int]]:
    """Plain Python: each list's latest ``size`` entries, padded with PAD on ``side``."""
    out = []
    for entries in lists:
        kept = entries[len(entries) - min(len(entries), size) :]
        pad = [PAD] * (size - len(kept))
        out.append(pad + kept if side == "left" else kept + pad)
    return out


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_pad_into_keeps_the_latest_entries_on_the_chosen_side(side: str, dtype: type) -> None:
    rng = np.random.default_rng(3)
    lists = [list(rng.integers(2, 100, k)) for k in [0, 1, 3, 4, 7, 0, 2]]
    values = np.array([v for x in lists for v in x], dtype)
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
    out = np.full((len(lists), 4), -5, dtype)  # stale values of an earlier batch are overwritten
    pad_into(values, offsets, out, side)
    assert out.tolist() == padded_reference([[int(v) for v in x] for x in lists], 4, side)
    with pytest.raises(ValueError, match="pad_into"):
        pad_into(values, offsets, np.zeros((3, 4), dtype), side)


def test_paddings_from_the_loader_arguments() -> None:
    seqs = (Sequence("a_len", ("a_x", "a_y")), Sequence("b_len", ("b_x",)))
    assert paddings(seqs, None, "right") == ()
    assert paddings(seqs, 5, "left") == (Padding("a_x", "a_len", 5, "left"), Padding("a_y", "a_len", 5, "left"), Padding("b_x", "b_len", 5, "left"))
    assert paddings(seqs, {"b_len": 2}, "right") == (Padding("b_x", "b_len", 2, "right"),)
    with pytest.raises(ConfigError, match="pad_side"):
        paddings(seqs, 5, "middle")
    with pytest.raises(ConfigError, match="'c_len'"):
        paddings(seqs, {"c_len": 3}, "right")
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigError, match="integer >= 1"):
            paddings(seqs, bad, "right")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="no"):
        paddings((), 5, "right")


def histories(batches: Any) -> list[tuple[list[int], int, list[int] | None]]:
    """Each row's (jagged hist_item, hist_len, padded hist_item or None), in row order."""
    out = []
    for b in batches:
        values, offsets = b.lists["hist_item"]
        padded = b.padded.get("hist_item")
        for i in range(len(b)):
            out.append((values[offsets[i] : offsets[i + 1]].tolist(), int(b.lengths["hist_len"][i]), None if padded is None else padded[i].tolist()))
    return out


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """Time-ordered events in two shards, the pipeline fitted (History max_len 5, no tiebreak) and preprocessed."""
    tmp = tmp_path_factory.mktemp("seq")
    shards = write_shards(time_ordered(1500, seed=4), tmp / "raw", [700], 300)
    fitted(tmp, shards, max_len=5)
    preprocess(make_pipeline(tmp, tiebreak=[], max_len=5), shards, tmp / "out", artifacts=tmp / "artifacts")
    return tmp, shards


def test_the_lengths_column_is_no_sparse_feature(made: tuple[Path, list[Path]]) -> None:
    tmp, shards = made
    for loader in (Loader(tmp / "out", batch_size=100), Loader(shards, pipeline=tmp / "pipeline.yaml", artifacts=tmp / "artifacts", batch_size=100)):
        assert loader.layout.lengths == ["hist_len"] and "hist_len" not in loader.layout.sparse
        b = next(iter(loader))
        assert b.sparse_names == ["user", "item"] and b.sparse.shape == (100, 2)
        assert b.lengths["hist_len"].dtype == torch.int32 and b.lengths["hist_len"].shape == (100,)
        _, offsets = b.lists["hist_item"]
        assert b.lengths["hist_len"].tolist() == (offsets[1:] - offsets[:-1]).tolist()
        assert b.padded == {}
        loader.close()


def test_to_kjt_leaves_the_lengths_out(made: tuple[Path, list[Path]], monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    class FakeKJT:
        @staticmethod
        def from_lengths_sync(keys: list[str], values: torch.Tensor, lengths: torch.Tensor) -> None:
            calls.extend(keys)

    mod = types.ModuleType("torchrec.sparse.jagged_tensor")
    mod.KeyedJaggedTensor = FakeKJT  # type: ignore[attr-defined]
    for name in ("torchrec", "torchrec.sparse"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "torchrec.sparse.jagged_tensor", mod)
    next(iter(Loader(made[0] / "out", batch_size=10))).to_kjt()
    assert calls == ["user", "item", "hist_item"]


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_histories_of_a_processed_output_and_of_raw_shards(made: tuple[Path, list[Path]], side: str) -> None:
    tmp, shards = made
    for source, kw in ((tmp / "out", {}), (shards, {"pipeline": tmp / "pipeline.yaml", "artifacts": tmp / "artifacts"})):
        for workers in (0, 2):
            loader = Loader(source, batch_size=64, num_workers=workers, pad_to=3, pad_side=side, **kw)  # type: ignore[arg-type]
            rows = histories(loader)
            assert len(rows) == 1500
            jagged = [r[0] for r in rows]
            assert [r[2] for r in rows] == padded_reference(jagged, 3, side)
            assert [r[1] for r in rows] == [len(x) for x in jagged]
            assert any(n > 3 for _, n, _ in rows) and any(n == 0 for _, n, _ in rows)  # longer than L and empty ones
            assert rows == histories(Loader(source, batch_size=64, num_workers=workers, pad_to={"hist_len": 3}, pad_side=side, **kw))  # type: ignore[arg-type]
    # the streaming lists are the offline ones (time-ordered input), padded the same; the processed output holds
    # its rows partitioned by key, so the rows are compared as a multiset
    offline = histories(Loader(tmp / "out", batch_size=200, pad_to=8, pad_side=side))
    streamed = histories(Loader(shards, pipeline=tmp / "pipeline.yaml", artifacts=tmp / "artifacts", batch_size=200, pad_to=8, pad_side=side))
    assert sorted(offline) == sorted(streamed)


def test_padded_fields_are_ring_slots_allocated_once(made: tuple[Path, list[Path]]) -> None:
    tmp, shards = made
    loader = Loader(shards, pipeline=tmp / "pipeline.yaml", artifacts=tmp / "artifacts", batch_size=50, pad_to=4, num_workers=1, prefetch=1)
    pointers = set()
    for b in loader:
        assert b.padded["hist_item"].shape == (len(b), 4) and b.padded["hist_item"].dtype == b.sparse.dtype
        pointers.add(b.padded["hist_item"].data_ptr())
    assert len(pointers) <= 3  # prefetch + 2 slots, reused batch after batch
    # copy=True: every batch owns its tensors
    kept = list(Loader(shards, pipeline=tmp / "pipeline.yaml", artifacts=tmp / "artifacts", batch_size=50, pad_to=4, copy=True))
    again = Loader(shards, pipeline=tmp / "pipeline.yaml", artifacts=tmp / "artifacts", batch_size=50, pad_to=4)
    for a, b in zip(kept, again):
        assert torch.equal(a.padded["hist_item"], b.padded["hist_item"]) and torch.equal(a.lengths["hist_len"], b.lengths["hist_len"])
    assert len({b.padded["hist_item"].data_ptr() for b in kept}) == len(kept)


def test_refusals(made: tuple[Path, list[Path]], tmp_path: Path) -> None:
    tmp, _ = made
    with pytest.raises(ConfigError, match="pad_side"):
        Loader(tmp / "out", batch_size=10, pad_to=3, pad_side="top")
    with pytest.raises(ConfigError, match="hist_item"):
        Loader(tmp / "out", batch_size=10, pad_to={"hist_item": 3})
    from etl.schema import load_schema
    from etl.tools.synth import generate
    from tests.unit.loader.test_api import REPO

    generate(load_schema(REPO / "schemas/criteo.yaml"), 200, 1, tmp_path / "raw", seed=1)
    with pytest.raises(ConfigError, match="History"):
        Loader(tmp_path / "raw", pipeline=REPO / "pipelines/criteo_hash.yaml", batch_size=10, pad_to=3)
