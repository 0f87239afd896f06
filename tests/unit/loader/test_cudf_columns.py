"""etl.loader.cudf_columns: cudf's buffers → the device column layout. On CPU, with stand-ins for pylibcudf columns
(numpy buffers), against the pyarrow twin of the adapter (``arrow_twin``); the real adapter runs only with cudf on
a GPU (marked ``cudf``, skipped with the reason ``unavailable`` gives)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from etl.backends import tensor
from etl.batch import Column, Strings
from etl.io.parquet import batch_from_arrow
from etl.loader import cudf_columns
from etl.schema import Schema, load_schema
from tests.conftest import REPO, criteo_table

CRITEO = load_schema(REPO / "schemas/criteo.yaml")
CUDF_MISSING = cudf_columns.unavailable(torch.device("cuda"), CRITEO)


def arrow_twin(path: str, schema: Schema, columns: list[str], row_group: int, start: int, length: int, device: torch.device) -> dict[str, Column]:
    """What ``cudf_columns.read_columns`` returns, made with pyarrow: the device column layout of the rows."""
    table = pq.ParquetFile(path).read_row_group(row_group, columns=columns).slice(start, length)
    return tensor.batch_to(batch_from_arrow(table, schema, path, row_group, 0, columns), device).columns


@dataclass
class FakeType:
    name: str

    def id(self) -> FakeType:
        return self


@dataclass
class FakeColumn:
    """The part of a ``pylibcudf.Column`` the adapter uses, over numpy buffers (uint8)."""

    type_name: str
    buffer: np.ndarray | None
    rows: int
    start: int = 0
    mask: np.ndarray | None = None
    nulls: int = 0
    children: tuple[FakeColumn, ...] = ()

    def type(self) -> FakeType:
        return FakeType(self.type_name)

    def data(self) -> np.ndarray | None:
        return self.buffer

    def size(self) -> int:
        return self.rows

    def offset(self) -> int:
        return self.start

    def null_count(self) -> int:
        return self.nulls

    def null_mask(self) -> np.ndarray | None:
        return self.mask

    def child(self, i: int) -> FakeColumn:
        return self.children[i]


def fake_of(arr: pa.Array, start: int = 0) -> FakeColumn:
    """A stand-in for cudf's column of ``arr`` (fixed width or string), viewed from row ``start`` on."""
    bufs = arr.buffers()
    mask = None if bufs[0] is None else np.frombuffer(bufs[0], np.uint8)
    as_bytes = lambda b: None if b is None else np.frombuffer(b, np.uint8)  # noqa: E731
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        width = "INT64" if pa.types.is_large_string(arr.type) else "INT32"
        offsets = FakeColumn(width, as_bytes(bufs[1]), len(arr) + 1)
        return FakeColumn("STRING", as_bytes(bufs[2]), len(arr) - start, start, mask, arr.null_count, (offsets,))
    type_name = {"double": "FLOAT64", "float": "FLOAT32"}.get(str(arr.type), str(arr.type).upper())  # INT64, UINT32...
    return FakeColumn(type_name, as_bytes(bufs[1]), len(arr) - start, start, mask, arr.null_count)


def assert_same_column(got: Column, want: Column) -> None:
    if isinstance(want.values, Strings):
        assert isinstance(got.values, Strings)
        assert tensor.to_numpy(got.values).to_list() == tensor.to_numpy(want.values).to_list()
    else:
        assert got.values.dtype == want.values.dtype and torch.equal(got.values, want.values)
    assert (got.valid is None) == (want.valid is None)
    if want.valid is not None:
        assert torch.equal(got.valid, want.valid)


@pytest.mark.parametrize("start", [0, 3, 13])
def test_numbers_strings_and_null_masks_as_the_twin_reads_them(start: int) -> None:
    rng = np.random.default_rng(start)
    ints = [None if rng.random() < 0.3 else int(v) for v in rng.integers(-(10**12), 10**12, 41)]
    texts = [None if rng.random() < 0.3 else f"{int(v):08x}"[: 1 + int(v) % 8] for v in rng.integers(0, 2**31, 41)]
    for arr, spec in ((pa.array(ints, pa.int64()), "I1"), (pa.array(texts, pa.string()), "C1"), (pa.array(texts, pa.large_string()), "C2")):
        want = tensor.column_to(batch_from_arrow(pa.table({spec: arr.slice(start)}), CRITEO, columns=[spec])[spec], "cpu")
        col = fake_of(arr, start)
        dtype = CRITEO.column(spec).dtype
        cpu = torch.device("cpu")
        values = cudf_columns._strings(col, cpu) if dtype == "string" else cudf_columns._numbers(col, dtype, True, cpu)
        assert_same_column(Column(values, cudf_columns._valid(col, cpu)), want)


def test_unsigned_and_narrow_numbers() -> None:
    big = [0, 1, 2**63, 2**64 - 1, 2**53 + 1]
    col = fake_of(pa.array(big, pa.uint64()))
    as_numbers = cudf_columns._numbers(col, "float64", True, torch.device("cpu"))
    assert as_numbers.tolist() == np.array(big, np.uint64).astype(np.float64).tolist()  # by value, rounded as numpy
    keys = cudf_columns._numbers(col, "int64", False, torch.device("cpu"))
    assert keys.numpy().view(np.uint64).tolist() == big  # keys keep their bits
    for t, values in ((pa.uint32(), [0, 2**32 - 1, 7]), (pa.uint16(), [0, 65_535]), (pa.int8(), [-128, 127]), (pa.float32(), [1.5, -2.0])):
        got = cudf_columns._numbers(fake_of(pa.array(values, t)), "float64" if t == pa.float32() else "int64", True, torch.device("cpu"))
        assert got.tolist() == values


def test_rows_of_a_piece_are_views() -> None:
    s = Strings(torch.tensor(list(b"abcdef"), dtype=torch.uint8), torch.tensor([0, 1, 3]), torch.tensor([1, 3, 6]))
    part = cudf_columns._rows(s, 1, 2)
    assert tensor.to_numpy(part).to_list() == ["bc", "def"]
    assert cudf_columns._rows(torch.arange(5), 2, 2).tolist() == [2, 3]


def test_reasons_it_is_unavailable() -> None:
    assert "device='cuda'" in cudf_columns.unavailable(torch.device("cpu"), CRITEO)
    movielens = load_schema(REPO / "schemas/movielens.yaml")
    why = cudf_columns.unavailable(torch.device("cuda"), movielens)
    assert why is not None and "\n" not in why


@pytest.mark.cudf
@pytest.mark.skipif(CUDF_MISSING is not None, reason=str(CUDF_MISSING))
def test_cudf_reads_what_the_twin_reads(tmp_path: Path) -> None:
    table = criteo_table(5_000, 7)
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=2_000)
    device = torch.device("cuda")
    for group, start, length in ((0, 0, 2_000), (1, 17, 900), (2, 0, 1_000)):
        got = cudf_columns.read_columns(str(path), CRITEO, CRITEO.names, group, start, length, device)
        torch.cuda.synchronize()
        want = arrow_twin(str(path), CRITEO, CRITEO.names, group, start, length, device)
        assert list(got) == list(want)
        for name in want:
            assert_same_column(got[name], want[name])
