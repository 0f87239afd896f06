"""``Loader(reader="cudf")``: row groups read into device memory, the host part, the shuffle-buffer gather and the
device part run there. Here the adapter (``etl.loader.cudf_columns``) is replaced by its pyarrow twin on CPU
tensors, so everything downstream of it runs as on a GPU: its batches must equal host placement's bit for bit and
its errors name the same rows. The reader is refused, in one line, where it cannot run."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from etl.errors import ConfigError, RowError
from etl.loader import Loader, cudf_columns
from tests.conftest import REPO
from tests.integration.test_loader import DENSE, HASH, build_raw, collect
from tests.integration.test_loader_device import assert_equal_passes
from tests.unit.loader.test_cudf_columns import arrow_twin


@pytest.fixture
def twin(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter's pyarrow twin in its place, and no refusal for want of cudf or a GPU."""
    monkeypatch.setattr(cudf_columns, "read_columns", arrow_twin)
    monkeypatch.setattr(cudf_columns, "unavailable", lambda device, schema: None)


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    return build_raw(tmp_path_factory.mktemp("cudf"), 7_001, 3, [1_100, 2_000], seed=17)


@pytest.fixture(scope="module")
def fitted(raw: Path, tmp_path_factory) -> Path:
    from etl.pipeline import Pipeline

    art = tmp_path_factory.mktemp("art")
    pipe = Pipeline.from_file(REPO / "pipelines/criteo.yaml")
    pipe.fit(sorted(raw.glob("*.parquet")), workers=2)
    pipe.save(art)
    return art


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_batches_equal_host_placement(twin: None, raw: Path, fitted: Path, workers: int, shuffle: bool) -> None:
    for pipeline, artifacts in ((REPO / "pipelines/criteo.yaml", fitted), (HASH, None)):
        kw = dict(pipeline=pipeline, artifacts=artifacts, batch_size=1_000, shuffle=shuffle, seed=5, shuffle_buffer=2_300, num_workers=workers)
        host = collect(Loader(raw, **kw))
        loader = Loader(raw, transform_on="device", reader="cudf", **kw)
        got = collect(loader)
        assert_equal_passes(got, host)
        assert loader.stats.rows == 7_001


def test_resume_mid_epoch(twin: None, raw: Path, fitted: Path) -> None:
    kw = dict(pipeline=REPO / "pipelines/criteo.yaml", artifacts=fitted, batch_size=700, shuffle=True, seed=2, shuffle_buffer=1_500)
    whole = collect(Loader(raw, transform_on="device", reader="cudf", **kw))
    first = Loader(raw, transform_on="device", reader="cudf", **kw)
    it = iter(first)
    for _ in range(4):
        next(it)
    state = first.state_dict()
    first.close()
    second = Loader(raw, transform_on="device", reader="cudf", **kw)
    second.load_state_dict(state)
    assert_equal_passes(collect(second), whole[4:])


def test_malformed_text_and_nonfinite_values_name_their_rows(twin: None, tmp_path: Path) -> None:
    """A malformed hex key fails in the host part (run on the device here), a NaN made by Log1p in the device
    part's output check: both name the file, row group and row, as the default reader does."""
    raw = build_raw(tmp_path, 3_000, 1, [1_000], seed=9)
    path = next(raw.glob("*.parquet"))
    t = pq.read_table(path)
    c5 = t.column("C5").to_pylist()
    c5[2_345] = "zz"
    i3 = [None if v is None else abs(v) for v in t.column("I3").to_pylist()]
    i3[1_234] = -5
    t = t.set_column(t.schema.get_field_index("C5"), "C5", pa.array(c5, pa.string()))
    t = t.set_column(t.schema.get_field_index("I3"), "I3", pa.array(i3, pa.int64()))
    pq.write_table(t, path, row_group_size=1_000)
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
    errors = []
    for reader in ("cpu", "cudf"):
        with pytest.raises(RowError) as info:
            collect(Loader(raw, pipeline=pipeline, batch_size=500, transform_on="device", reader=reader, num_workers=0))
        errors.append(info.value)
    assert [(e.path, e.row_group, e.row, e.column, e.problem) for e in errors] == [(str(path), 1, 1_234, "I3", errors[0].problem)] * 2
    t = t.set_column(t.schema.get_field_index("I3"), "I3", pa.array([None if v is None else abs(v) for v in i3], pa.int64()))
    pq.write_table(t, path, row_group_size=1_000)
    for reader in ("cpu", "cudf"):
        with pytest.raises(RowError) as info:
            collect(Loader(raw, pipeline=pipeline, batch_size=500, transform_on="device", reader=reader, num_workers=0))
        errors.append(info.value)
    assert errors[2].column == "C5" and (errors[2].row, str(errors[2])) == (errors[3].row, str(errors[3]))


def test_refused_in_one_line_where_it_cannot_run(raw: Path) -> None:
    with pytest.raises(ConfigError, match="transform_on='device'"):
        Loader(raw, pipeline=HASH, reader="cudf")
    with pytest.raises(ConfigError, match="reader must be"):
        Loader(raw, pipeline=HASH, reader="gpu")
    with pytest.raises(ConfigError) as info:
        Loader(raw, pipeline=HASH, transform_on="device", reader="cudf", device="cpu")
    assert str(info.value) == cudf_columns.unavailable(torch.device("cpu"), Loader(raw, pipeline=HASH).pipeline.schema)
    assert "\n" not in str(info.value)
