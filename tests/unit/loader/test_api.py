"""LoaderBatch and Loader bookkeeping (the threads and data paths are covered in tests/integration/test_loader.py)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from etl.errors import ConfigError
from etl.loader import Loader, LoaderBatch
from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import etl_threads, new_threads, stacks

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


@pytest.mark.parametrize("kw", [{"batch_size": 0}, {"num_workers": -1}, {"prefetch": 0}, {"transform_on": "gpu"},
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


def test_a_dropped_loader_stops_its_threads(raw: Path) -> None:
    """No thread of a pass refers to the loader, so dropping it (and its iterators) ends every pass it started,
    including the next epoch's, which runs in the background after a whole pass."""
    before = etl_threads()
    loader = Loader(raw, pipeline=REPO / "pipelines/criteo_hash.yaml", batch_size=500, shuffle=True)
    assert sum(len(b) for b in loader) == 3000
    assert loader._engine.ahead is not None and loader._engine.ahead.thread.is_alive()
    del loader
    assert not (left := new_threads(before)), stacks(left)
    loader = Loader(raw, pipeline=REPO / "pipelines/criteo_hash.yaml", batch_size=500, prefetch=1)
    it = iter(loader)
    next(it)
    del loader, it
    assert not (left := new_threads(before)), stacks(left)


def _batches(loader: Loader) -> list[tuple[torch.Tensor, ...]]:
    return [(b.label.clone(), b.dense.clone(), b.sparse.clone()) for b in loader]


def _equal(a: list[tuple[torch.Tensor, ...]], b: list[tuple[torch.Tensor, ...]]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for pa, pb in zip(a, b) for x, y in zip(pa, pb))


def test_no_workers_runs_in_the_calling_thread_with_the_batches_of_one_worker(raw: Path) -> None:
    settings = dict(pipeline=REPO / "pipelines/criteo_hash.yaml", batch_size=400, shuffle=True, seed=3, shuffle_buffer=700)
    one = Loader(raw, num_workers=1, **settings)
    inline = Loader(raw, num_workers=0, **settings)
    before = etl_threads()
    for epoch in (0, 1):
        one.set_epoch(epoch)
        inline.set_epoch(epoch)
        want = _batches(one)
        one.close()
        running = etl_threads()
        got = _batches(inline)
        assert not etl_threads() - running  # no thread started
        assert _equal(got, want) and sum(len(b[0]) for b in got) == 3000
    assert inline._engine.ahead is None
    assert not (left := new_threads(before)), stacks(left)
    it = iter(inline)  # resumes exactly, as with workers
    next(it), next(it)
    state = inline.state_dict()
    resumed = Loader(raw, num_workers=0, **settings)
    resumed.load_state_dict(state)
    assert _equal(_batches(resumed), _batches(one)[2:])


def test_a_batch_larger_than_a_rank_with_drop_last_names_both_numbers(raw: Path) -> None:
    with pytest.raises(ConfigError, match=r"batch_size=2000 is larger than the 1500 rows of a rank \(3000 rows over 2 rank"):
        Loader(raw, pipeline=REPO / "pipelines/criteo_hash.yaml", batch_size=2000, drop_last=True, rank=0, world_size=2)
    short = Loader(raw, pipeline=REPO / "pipelines/criteo_hash.yaml", batch_size=5000, drop_last=False)
    assert len(short) == 1 and [len(b) for b in short] == [3000]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_copy_hands_out_owned_tensors(raw: Path, num_workers: int) -> None:
    settings = dict(pipeline=REPO / "pipelines/criteo_hash.yaml", batch_size=300, shuffle=True, num_workers=num_workers, prefetch=1)
    kept = list(Loader(raw, copy=True, **settings))
    assert _equal([(b.label, b.dense, b.sparse) for b in kept], _batches(Loader(raw, **settings)))
    storages = {b.sparse.untyped_storage().data_ptr() for b in kept}
    assert len(storages) == len(kept) == 10  # no two batches share memory
    views = [b.sparse for b in Loader(raw, **settings)]  # without copy: views of the few reused slots
    assert len({v.untyped_storage().data_ptr() for v in views}) <= 3


def test_a_pipeline_given_with_a_processed_output_must_be_its_own(raw: Path, tmp_path: Path) -> None:
    from etl.errors import ArtifactError
    from etl.pipeline import Pipeline
    from etl.preprocess import preprocess

    out = tmp_path / "processed"
    preprocess(Pipeline.from_file(REPO / "pipelines/criteo_hash.yaml"), sorted(raw.glob("*.parquet")), out)
    reference = _batches(Loader(out, batch_size=500))
    same = Loader(out, pipeline=REPO / "pipelines/criteo_hash.yaml", artifacts=out / "artifacts", batch_size=500)
    assert _equal(_batches(same), reference)
    with pytest.raises(ArtifactError, match="another pipeline or schema"):
        Loader(out, pipeline=REPO / "pipelines/criteo.yaml")
    other = tmp_path / "other"
    p = Pipeline.from_file(REPO / "pipelines/criteo.yaml")
    p.fit(sorted(raw.glob("*.parquet")))
    p.save(other)
    with pytest.raises(ArtifactError, match="not the artifacts"):
        Loader(out, artifacts=other)
    with pytest.raises(ArtifactError, match="cannot read"):
        Loader(out, artifacts=tmp_path / "missing")


def test_transform_selects_what_the_older_pair_selected(raw: Path) -> None:
    settings = dict(pipeline=REPO / "pipelines/criteo_hash.yaml", batch_size=700, shuffle=True, seed=2, num_workers=1)
    host = _batches(Loader(raw, **settings))
    device = Loader(raw, transform="device", **settings)
    assert device.stage is not None and _equal(_batches(device), host)
    older = Loader(raw, transform_on="device", **settings)
    assert older.stage is not None and _equal(_batches(older), host)
    with pytest.raises(ConfigError, match="replaces transform_on= and reader="):
        Loader(raw, transform="device", transform_on="device", **settings)
    with pytest.raises(ConfigError, match="transform must be one of"):
        Loader(raw, transform="gpu", **settings)


def test_a_loader_is_an_iterable_dataset_a_data_loader_hands_on_as_is(raw: Path) -> None:
    from torch.utils.data import DataLoader, IterableDataset

    settings = dict(pipeline=REPO / "pipelines/criteo_hash.yaml", batch_size=700, shuffle=True, seed=4)
    loader = Loader(raw, **settings)
    assert isinstance(loader, IterableDataset)
    wrapped = DataLoader(loader, batch_size=None)
    assert len(wrapped) == len(loader) == 5
    got = [(b["label"].clone(), b["dense"].clone(), b["sparse"].clone()) for b in wrapped]
    assert _equal(got, _batches(Loader(raw, **settings)))
    first = next(iter(wrapped))
    assert type(first) is dict and list(first) == list(next(iter(Loader(raw, **settings))))  # torch rebuilds a mapping as a dict
    assert torch.equal(first["C3"], first["sparse"][:, 2]) and torch.equal(first["I13"], first["dense"][:, 12])
    assert loader.state_dict()["position"] == 1  # the DataLoader iterated this very loader


def test_a_data_loader_with_worker_processes_is_refused_with_the_way_out(raw: Path) -> None:
    from torch.utils.data import DataLoader

    loader = Loader(raw, pipeline=REPO / "pipelines/criteo_hash.yaml", batch_size=700, num_workers=1)
    wrapped = DataLoader(loader, batch_size=None, num_workers=2, multiprocessing_context="fork")
    with pytest.raises(ConfigError, match=r"worker \d of 2\).*DataLoader\(loader, batch_size=None\) with num_workers=0.*here 1\)"):
        next(iter(wrapped))
    assert sum(len(b) for b in loader) == 3000  # the loader itself is untouched
