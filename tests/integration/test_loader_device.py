"""``Loader(transform_on="device")``: workers run the host part of the pipeline, the device part runs after the
copy with the torch backend. Its batches must equal host placement's bit for bit (on CPU tensors here, on CUDA
too when present); an invalid value the device part finds is reported with its file, row group and row."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from etl.errors import RowError
from etl.loader import Loader
from etl.loader.device_stage import Inputs
from etl.pipeline import Pipeline
from tests.conftest import REPO
from tests.integration.test_loader import CATS, DENSE, HASH, build_raw, collect

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    return build_raw(tmp_path_factory.mktemp("device"), 9_001, 3, [1_300, 2_000], seed=31)


@pytest.fixture(scope="module")
def fitted(raw: Path, tmp_path_factory) -> Path:
    art = tmp_path_factory.mktemp("art")
    pipe = Pipeline.from_file(REPO / "pipelines/criteo.yaml")
    pipe.fit(sorted(raw.glob("*.parquet")), workers=2)
    pipe.save(art)
    return art


def assert_equal_passes(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            assert u.dtype == v.dtype and torch.equal(u.cpu(), v.cpu())


def test_inputs_of_the_criteo_pipeline() -> None:
    inputs = Inputs.of(Pipeline.from_file(REPO / "pipelines/criteo.yaml"))
    assert (inputs.label, inputs.numbers, inputs.keys, inputs.lists) == ("label", DENSE, CATS, [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shuffle", [False, True])
def test_device_placement_equals_host_placement(raw: Path, fitted: Path, device: str, shuffle: bool) -> None:
    """Categorify (vocabularies on the device) and Hash pipelines; a final partial batch included."""
    for pipeline, artifacts in ((REPO / "pipelines/criteo.yaml", fitted), (HASH, None)):
        kw = dict(pipeline=pipeline, artifacts=artifacts, batch_size=1_000, shuffle=shuffle, seed=4, shuffle_buffer=2_500)
        host = collect(Loader(raw, **kw))
        dev = Loader(raw, device=device, transform_on="device", **kw)
        got = collect(dev)
        assert_equal_passes(got, host)
        assert sum(len(b[0]) for b in got) == 9_001
        assert dev.stats.rows == 9_001


def test_device_placement_with_lists(tmp_path: Path) -> None:
    raw = build_raw(tmp_path, 3_000, 2, [700], seed=8, schema="movielens", id_column="timestamp")
    pipe = Pipeline.from_file(REPO / "pipelines/movielens.yaml")
    pipe.fit(sorted(raw.glob("*.parquet")))
    pipe.save(tmp_path / "art")
    kw = dict(pipeline=REPO / "pipelines/movielens.yaml", artifacts=tmp_path / "art", batch_size=256, shuffle=True, shuffle_buffer=900)
    a = [(b.dense.clone(), b.sparse.clone(), b.lists["genres"][0].clone(), b.lists["genres"][1].clone()) for b in Loader(raw, **kw)]
    device = Loader(raw, transform_on="device", **kw)
    b = [(x.dense.clone(), x.sparse.clone(), x.lists["genres"][0].clone(), x.lists["genres"][1].clone()) for x in device]
    assert_equal_passes(b, a)


def test_empty_batch_of_a_shorter_rank(tmp_path: Path) -> None:
    """9 rows over 2 ranks with batch 2: rank 1 (4 rows) owes an empty fifth batch, on the device path too."""
    raw = build_raw(tmp_path, 9, 1, [9], seed=3)
    for rank in (0, 1):
        kw = dict(pipeline=HASH, batch_size=2, rank=rank, world_size=2)
        host, dev = collect(Loader(raw, **kw)), collect(Loader(raw, transform_on="device", **kw))
        assert [len(x[0]) for x in dev] == [len(x[0]) for x in host]
        assert_equal_passes(dev, host)


def test_an_invalid_value_found_on_the_device_names_its_row(tmp_path: Path) -> None:
    """Without a Clamp on I3, Log1p turns I3 = -5 into NaN, which the output check finds on the device: the error
    still names the file, row group and row the value came from."""
    raw = build_raw(tmp_path, 4_000, 2, [600], seed=12)
    path = sorted(raw.glob("*.parquet"))[1]
    t = pq.read_table(path)
    i3 = [None if v is None else abs(v) for v in t.column("I3").to_pylist()]
    i3[1_234] = -5
    t = t.set_column(t.schema.get_field_index("I3"), t.schema.field("I3"), pa.array(i3, pa.int64()))
    pq.write_table(t, path, row_group_size=600)
    pipeline = tmp_path / "unclamped.yaml"
    pipeline.write_text(f"""name: unclamped
schema: {REPO / 'schemas/criteo.yaml'}
ops:
  - {{op: FillMissing, columns: "@dense"}}
  - {{op: Clamp, columns: [{", ".join(c for c in DENSE if c != "I3")}], min: 0}}
  - {{op: Log1p, columns: "@dense"}}
  - {{op: Decode, columns: "@categorical"}}
  - {{op: Hash, columns: "@categorical", num_buckets: 1000}}
""")
    loader = Loader(raw, pipeline=pipeline, batch_size=500, shuffle=True, shuffle_buffer=1_000, transform_on="device")
    with pytest.raises(RowError) as info:
        for _ in loader:
            pass
    e = info.value
    assert (e.path, e.row_group, e.row, e.column) == (str(path), 2, 1_234, "I3")


def test_transform_on_is_checked(raw: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="transform_on"):
        Loader(raw, pipeline=HASH, transform_on="gpu")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_device_transform_never_overwrites_a_batch_in_use(raw: Path, fitted: Path) -> None:
    """GPU work queued on the consumer's stream (behind a sleep) still reads its own batch while the side stream
    copies and transforms the next ones: slots are reused only after the consumer released them."""
    kw = dict(pipeline=REPO / "pipelines/criteo.yaml", artifacts=fitted, batch_size=777, shuffle=True, seed=3, shuffle_buffer=2_000, prefetch=2)
    host = collect(Loader(raw, **kw))
    got = []
    for i, b in enumerate(Loader(raw, device="cuda", transform_on="device", **kw)):
        assert b.label.is_cuda and b.dense.is_cuda and b.sparse.is_cuda
        if i % 2:
            torch.cuda._sleep(20_000_000)
        got.append((b.label.clone(), b.dense.clone(), b.sparse.clone()))
    torch.cuda.synchronize()
    assert_equal_passes(got, host)
