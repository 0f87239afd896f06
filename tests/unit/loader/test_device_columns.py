"""etl.loader.device_columns: the device column layout → device chunks (CPU tensors, fed by the adapter's pyarrow
twin), and ChunkRun's gather of such chunks on their device."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from etl.backends import tensor
from etl.errors import InputError
from etl.io.parquet import batch_from_arrow
from etl.loader.chunk import ChunkRun, Layout
from etl.loader.device_columns import DeviceColumnReader, device_chunk
from etl.loader.device_stage import DeviceStage
from etl.loader.order import Piece, RowGroup
from etl.loader.stats import LoaderStats
from etl.pipeline import Pipeline
from tests.conftest import REPO, criteo_table
from tests.unit.loader.test_cudf_columns import arrow_twin

HASH = REPO / "pipelines/criteo_hash.yaml"


def test_device_chunk_holds_what_inputs_chunk_holds() -> None:
    pipe = Pipeline.from_file(HASH)
    stage = DeviceStage(pipe, Layout.of(pipe), [])
    raw = batch_from_arrow(criteo_table(80, 2), pipe.schema, "f.parquet", 1, 500)
    want = stage.inputs.chunk(pipe.transform(raw, part="host").batch, 3, 460)
    host = pipe.transform(tensor.batch_to(raw, "cpu"), part="host", xp=tensor).batch
    got = device_chunk(stage.inputs, host, 3, 460)
    assert got.n == want.n and got.lists == {} and set(got.fixed) == set(want.fixed)
    for k, v in want.fixed.items():
        assert isinstance(got.fixed[k], torch.Tensor)
        np.testing.assert_array_equal(got.fixed[k].numpy(), v, err_msg=k)


def test_gather_tensors_equals_gather() -> None:
    pipe = Pipeline.from_file(HASH)
    stage = DeviceStage(pipe, Layout.of(pipe), [])
    host_chunks, device_chunks = [], []
    for i, n in enumerate((30, 1, 45)):
        raw = batch_from_arrow(criteo_table(n, 10 + i), pipe.schema, "f.parquet", i, 0)
        host_chunks.append(stage.inputs.chunk(pipe.transform(raw, part="host").batch, i, 0))
        device_chunks.append(device_chunk(stage.inputs, pipe.transform(tensor.batch_to(raw, "cpu"), part="host", xp=tensor).batch, i, 0))
    on_host, on_device = ChunkRun(host_chunks), ChunkRun(device_chunks)
    assert on_device.on_device and not on_host.on_device
    rows = np.random.default_rng(0).permutation(76)[:50]
    want = {k: np.zeros((50, *v.shape[1:]), v.dtype) for k, v in host_chunks[0].fixed.items() if k != "origin"}
    on_host.gather(rows, want)
    got = {k: torch.full((50, *v.shape[1:]), 7).to(v.dtype) for k, v in device_chunks[0].fixed.items() if k != "origin"}
    on_device.gather_tensors(rows, got)
    for k in want:
        np.testing.assert_array_equal(got[k].numpy(), want[k], err_msg=k)
    np.testing.assert_array_equal(on_device.take_fixed("origin", rows).numpy(), on_host.take_fixed("origin", rows))


def test_reader_checks_column_types_from_the_footer(tmp_path: Path) -> None:
    pipe = Pipeline.from_file(HASH)
    table = criteo_table(20, 1)
    table = table.set_column(table.schema.get_field_index("C3"), "C3", pa.array(np.arange(20, dtype=np.float64)))
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path)
    group = RowGroup(path, 0, 0, 20)
    stage = DeviceStage(pipe, Layout.of(pipe), [group])
    reader = DeviceColumnReader(pipe, stage, [group], LoaderStats(), torch.device("cpu"), arrow_twin)
    with pytest.raises(InputError, match="C3"):
        reader(Piece(group, 0, 20))


def test_reader_chunk_origin_counts_from_the_piece(tmp_path: Path) -> None:
    pipe = Pipeline.from_file(HASH)
    path = tmp_path / "ok.parquet"
    pq.write_table(criteo_table(50, 4), path, row_group_size=20)
    groups = [RowGroup(path, i, 20 * i, min(20, 50 - 20 * i)) for i in range(3)]
    stage = DeviceStage(pipe, Layout.of(pipe), groups)
    stats = LoaderStats()
    chunk = DeviceColumnReader(pipe, stage, groups, stats, torch.device("cpu"), arrow_twin)(Piece(groups[1], 5, 12))
    assert chunk.n == 12 and chunk.fixed["origin"].tolist() == [(1 << 32) | r for r in range(5, 17)]
