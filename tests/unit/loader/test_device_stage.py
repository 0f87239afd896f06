"""etl.loader.device_stage: the inputs a device transform receives, and the device part run on them (CPU tensors)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from etl.errors import RowError
from etl.io.parquet import batch_from_arrow
from etl.loader.chunk import Chunk, Layout
from etl.loader.device_stage import ROW_BITS, DeviceStage, Inputs, PendingCheck
from etl.loader.order import RowGroup
from etl.pipeline import Pipeline
from tests.conftest import REPO, criteo_table


def tensors(chunk: Chunk) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in chunk.fixed.items() if k != "origin"}


def outputs(stage: DeviceStage, n: int) -> dict[str, torch.Tensor]:
    return {f.name: torch.full((n, *f.shape), -7, dtype=f.dtype) for f in stage.outputs()}  # poisoned


def test_inputs_of_movielens_hold_lists_and_int_keys() -> None:
    inputs = Inputs.of(Pipeline.from_file(REPO / "pipelines/movielens.yaml"))
    assert (inputs.label, inputs.numbers, inputs.keys, inputs.lists) == ("rating", ["timestamp"], ["userId", "movieId"], ["genres"])
    assert [f.name for f in inputs.fields()] == ["in_label", "in_numbers", "in_numbers_valid", "in_keys", "in_keys_valid"]


def test_chunk_lays_out_keys_as_bits_and_rows_as_origins() -> None:
    pipe = Pipeline.from_file(REPO / "pipelines/criteo_hash.yaml")
    table = criteo_table(50, 1)
    host = pipe.transform(batch_from_arrow(table, pipe.schema, "f.parquet", 3, 1_000), part="host").batch
    chunk = Inputs.of(pipe).chunk(host, group_no=5, group_first_row=1_000)
    assert chunk.fixed["in_keys"].dtype == np.int64 and chunk.fixed["in_keys"].shape == (50, 26)
    np.testing.assert_array_equal(chunk.fixed["in_keys"][:, 0].view(np.uint64), host["C1"].values)
    np.testing.assert_array_equal(chunk.fixed["in_keys_valid"][:, 0], host["C1"].valid)
    np.testing.assert_array_equal(chunk.fixed["in_numbers_valid"][:, 2], host["I3"].valid)
    np.testing.assert_array_equal(chunk.fixed["origin"], (5 << ROW_BITS) | np.arange(50))
    empty = Inputs.of(pipe).empty()
    assert empty.n == 0 and {k: v.shape[1:] for k, v in empty.fixed.items()} == {k: v.shape[1:] for k, v in chunk.fixed.items()}


@pytest.mark.parametrize("name", ["criteo_hash", "criteo"])
def test_run_equals_the_host_transform(name: str, tmp_path: Path) -> None:
    pipe = Pipeline.from_file(REPO / f"pipelines/{name}.yaml")
    table = criteo_table(300, 2)
    batch = batch_from_arrow(table, pipe.schema)
    if not pipe.is_fitted:
        path = tmp_path / "t.parquet"
        pq.write_table(table, path)
        pipe.fit([path])
    layout = Layout.of(pipe)
    want = Chunk.from_table(pipe.to_arrow(pipe.transform(batch).batch), layout)
    stage = DeviceStage(pipe, layout, [])
    chunk = stage.inputs.chunk(pipe.transform(batch, part="host").batch, 0, 0)
    out = outputs(stage, 300)
    lists, check = stage.run(tensors(chunk), out, chunk.lists, chunk.fixed["origin"])
    assert lists == {}
    check.raise_if_set()  # nothing found
    for k in ("label", "dense", "sparse"):
        assert out[k].dtype == torch.from_numpy(want.fixed[k]).dtype
        np.testing.assert_array_equal(out[k].numpy(), want.fixed[k], err_msg=k)


def test_missing_dense_values_left_by_the_pipeline_become_nan(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(f"""name: nofill
schema: {REPO / 'schemas/criteo.yaml'}
ops:
  - {{op: Clamp, columns: "@dense", min: 0}}
  - {{op: Decode, columns: "@categorical"}}
  - {{op: Hash, columns: "@categorical", num_buckets: 100}}
""")
    pipe = Pipeline.from_file(p)
    batch = batch_from_arrow(criteo_table(100, 3), pipe.schema)
    want = Chunk.from_table(pipe.to_arrow(pipe.transform(batch).batch), Layout.of(pipe))
    stage = DeviceStage(pipe, Layout.of(pipe), [])
    chunk = stage.inputs.chunk(pipe.transform(batch, part="host").batch, 0, 0)
    out = outputs(stage, 100)
    stage.run(tensors(chunk), out, chunk.lists, chunk.fixed["origin"])
    assert np.isnan(want.fixed["dense"]).any()
    np.testing.assert_array_equal(out["dense"].numpy(), want.fixed["dense"])  # NaN where NaN, equal elsewhere


def unclamped_stage(tmp_path: Path, i3: list[int], log_first: bool = False) -> tuple[DeviceStage, Chunk]:
    """A stage whose pipeline takes ln(1 + I3) unclamped (NaN below -1) after FillMissing (or also before it:
    ``log_first``), and the chunk of 10 rows of row group 4 of b.parquet (rows 400 ..) holding ``i3`` (the other
    dense columns 1)."""
    p = tmp_path / "p.yaml"
    first = "{op: Log1p, columns: \"@dense\"}" if log_first else "{op: Clamp, columns: \"@dense\", max: 1.0e+300}"
    p.write_text(f"""name: unclamped
schema: {REPO / 'schemas/criteo.yaml'}
ops:
  - {first}
  - {{op: FillMissing, columns: "@dense"}}
  - {{op: Log1p, columns: "@dense"}}
  - {{op: Decode, columns: "@categorical"}}
  - {{op: Hash, columns: "@categorical", num_buckets: 100}}
""")
    pipe = Pipeline.from_file(p)
    table = criteo_table(10, 4)
    table = table.set_column(3, "I3", pa.array(i3))
    for i in range(1, 14):
        if i != 3:
            table = table.set_column(table.schema.get_field_index(f"I{i}"), f"I{i}", pa.array(np.ones(10, np.int64)))
    groups = [RowGroup(Path("a.parquet"), 0, 0, 10), RowGroup(Path("b.parquet"), 4, 400, 10)]
    stage = DeviceStage(pipe, Layout.of(pipe), groups)
    return stage, stage.inputs.chunk(pipe.transform(batch_from_arrow(table, pipe.schema, "b.parquet", 4, 400), part="host").batch, 1, 400)


def test_an_error_on_the_device_names_the_source_row(tmp_path: Path) -> None:
    stage, chunk = unclamped_stage(tmp_path, [5, 5, 5, 5, 5, 5, 5, -9, 5, 5])  # ln(1 - 9) is NaN
    _, check = stage.run(tensors(chunk), outputs(stage, 10), chunk.lists, chunk.fixed["origin"])  # does not raise
    with pytest.raises(RowError) as info:
        check.raise_if_set()
    assert (info.value.path, info.value.row_group, info.value.row, info.value.column) == ("b.parquet", 4, 407, "I3")
    assert info.value.problem == "value is NaN or infinite after the transform: nan"


def test_the_deferred_check_reports_the_first_error_in_op_order(tmp_path: Path) -> None:
    """ln(1 - 9) before FillMissing is FillMissing's error (an op before the output check), even though its check
    was deferred and the output check finds the same row too: the error is the one the host raises."""
    stage, chunk = unclamped_stage(tmp_path, [5, 5, 5, 5, 5, 5, 5, -9, 5, 5], log_first=True)
    _, check = stage.run(tensors(chunk), outputs(stage, 10), chunk.lists, chunk.fixed["origin"])
    assert bool(check.flag[0]) and check.done is None  # CPU tensors: the flag is the device flag itself
    with pytest.raises(RowError) as info:
        check.raise_if_set()
    assert (info.value.row, info.value.column, info.value.problem) == (407, "I3", "value is NaN or infinite: nan")


def test_a_set_flag_that_the_recheck_does_not_confirm_is_an_error() -> None:
    check = PendingCheck(torch.ones(1, dtype=torch.bool), None, lambda: None)
    with pytest.raises(RuntimeError, match="did not find"):
        check.raise_if_set()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="host synchronisation is a CUDA notion")
@pytest.mark.parametrize("name", ["criteo_hash", "criteo"])
def test_run_does_not_synchronise(name: str, tmp_path: Path) -> None:
    """Every function the device part calls, by construction: a whole ``run`` (after a first one that makes the
    constants and vocabularies resident) and the consumer's examination of its checks, under sync debug mode."""
    pipe = Pipeline.from_file(REPO / f"pipelines/{name}.yaml")
    table = criteo_table(3_000, 5)
    if not pipe.is_fitted:
        pq.write_table(table, tmp_path / "t.parquet")
        pipe.fit([tmp_path / "t.parquet"])
    stage = DeviceStage(pipe, Layout.of(pipe), [])
    chunk = stage.inputs.chunk(pipe.transform(batch_from_arrow(table, pipe.schema), part="host").batch, 0, 0)
    inputs = {k: v.cuda() for k, v in tensors(chunk).items()}
    out = {k: v.cuda() for k, v in outputs(stage, 3_000).items()}
    stage.run(inputs, out, chunk.lists, chunk.fixed["origin"])[1].raise_if_set()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _, check = stage.run(inputs, out, chunk.lists, chunk.fixed["origin"])
        check.raise_if_set()
    finally:
        torch.cuda.set_sync_debug_mode(0)
