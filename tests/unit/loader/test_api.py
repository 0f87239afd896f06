"""LoaderBatch and Loader bookkeeping (the threads and data paths are covered in tests/integration/test_loader.py)."""

from __future__ import annotations

import sys
import threading
import time
import types
from pathlib import Path

import pytest
import torch

from etl.errors import ConfigError
from etl.loader import Loader, LoaderBatch
from etl.schema import load_schema
from etl.synth import generate

REPO = Path(__file__).resolve().parents[3]


def test_to_kjt_builds_key_major_values_and_lengths(monkeypatch) -> None:
    calls = {}

    class FakeKJT:
        @staticmethod
        def from_lengths_sync(keys, values, lengths):
            calls.update(keys=keys, values=values.tolist(), lengths=lengths.tolist())
            return "kjt"

    mod = types.ModuleType("torchrec.sparse.jagged_tensor")
    mod.KeyedJaggedTensor = FakeKJT
    for name in ("torchrec", "torchrec.sparse"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "torchrec.sparse.jagged_tensor", mod)

    b = LoaderBatch(
        label=torch.zeros(2),
        dense=torch.zeros(2, 1),
        sparse=torch.tensor([[5, 7], [6, 8]], dtype=torch.int32),
        lists={"g": (torch.tensor([1, 2, 3]), torch.tensor([0, 2, 3]))},
        sparse_names=["a", "b"],
    )
    assert b.to_kjt() == "kjt"
    assert calls["keys"] == ["a", "b", "g"]
    assert calls["values"] == [5, 6, 7, 8, 1, 2, 3]  # key-major: all of a, then b, then the lists
    assert calls["lengths"] == [1, 1, 1, 1, 2, 1]


def test_to_kjt_without_torchrec_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torchrec", None)
    b = LoaderBatch(torch.zeros(1), torch.zeros(1, 1), torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(ImportError, match="pip install torchrec"):
        b.to_kjt()


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("raw")
    generate(load_schema(REPO / "schemas/criteo.yaml"), 3000, 2, d, seed=1)
    return d


def test_set_epoch_keeps_the_position_of_the_current_epoch(raw: Path) -> None:
    loader = Loader(raw, pipeline=REPO / "pipelines/criteo_hash.yaml", batch_size=500, shuffle=True)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == (0, 2)
    loader.set_epoch(0)
    assert loader.position == 2
    loader.set_epoch(1)
    assert (loader.epoch, loader.position) == (1, 0)
    assert len(list(loader)) == len(loader) == 6 and loader.position == 6
    assert len(list(loader)) == 6  # a finished epoch restarts on the next iteration


def test_state_dict_refuses_other_settings(raw: Path) -> None:
    a = Loader(raw, pipeline=REPO / "pipelines/criteo_hash.yaml", batch_size=500)
    b = Loader(raw, pipeline=REPO / "pipelines/criteo_hash.yaml", batch_size=400)
    with pytest.raises(ValueError, match="batch_size"):
        b.load_state_dict(a.state_dict())


def test_raw_shards_need_a_fitted_pipeline(raw: Path) -> None:
    with pytest.raises(ValueError, match="etl fit"):
        Loader(raw, pipeline=REPO / "pipelines/criteo.yaml")
    with pytest.raises(ValueError, match="need a pipeline"):
        Loader(raw)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_a_cuda_device_without_cuda_is_a_clear_error(tmp_path) -> None:
    generate(load_schema(REPO / "schemas/criteo.yaml"), 100, 1, tmp_path, seed=0)
    with pytest.raises(ValueError, match="sees no CUDA device"):
        Loader(tmp_path, pipeline=REPO / "pipelines/criteo_hash.yaml", device="cuda")


@pytest.mark.parametrize("kw", [{"batch_size": 0}, {"num_workers": 0}, {"prefetch": 0}, {"transform_on": "gpu"},
                                {"rank": 2, "world_size": 2}, {"rank": 0}])  # fmt: skip
def test_settings_that_cannot_work_are_config_errors(raw: Path, kw: dict) -> None:
    with pytest.raises(ConfigError):
        Loader(raw, pipeline=REPO / "pipelines/criteo_hash.yaml", **kw)


def test_source_and_state_mismatches_are_config_errors(raw: Path) -> None:
    with pytest.raises(ConfigError):
        Loader(raw)
    with pytest.raises(ConfigError):
        Loader(raw, pipeline=REPO / "pipelines/criteo.yaml")
    a = Loader(raw, pipeline=REPO / "pipelines/criteo_hash.yaml", batch_size=500)
    b = Loader(raw, pipeline=REPO / "pipelines/criteo_hash.yaml", batch_size=500, seed=1)
    with pytest.raises(ConfigError, match="seed"):
        b.load_state_dict(a.state_dict())


def _loader_threads(baseline: int, timeout: float = 5.0) -> int:
    """How many loader threads are alive once they are down to ``baseline`` or ``timeout`` passed (pool threads
    exit asynchronously)."""
    deadline = time.monotonic() + timeout
    while (alive := sum(t.name.startswith("etl-") for t in threading.enumerate())) > baseline and time.monotonic() < deadline:
        time.sleep(0.02)
    return alive


def test_a_dropped_loader_stops_its_threads(raw: Path) -> None:
    """No thread of a pass refers to the loader, so dropping it (and its iterators) ends every pass it started,
    including the next epoch's, which runs in the background after a whole pass."""
    baseline = _loader_threads(0)
    loader = Loader(raw, pipeline=REPO / "pipelines/criteo_hash.yaml", batch_size=500, shuffle=True)
    assert sum(len(b) for b in loader) == 3000
    assert loader._ahead is not None and loader._ahead.thread.is_alive()
    del loader
    assert _loader_threads(baseline) <= baseline
    loader = Loader(raw, pipeline=REPO / "pipelines/criteo_hash.yaml", batch_size=500, prefetch=1)
    it = iter(loader)
    next(it)
    del loader, it
    assert _loader_threads(baseline) <= baseline
