"""etl.io.npy: the fixed fields of an output table, chunks written and read back, and the header checks that
name a truncated or foreign chunk file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from etl.errors import InputError
from etl.io.npy import ChunkWriter, FixedColumns, ListColumnsError, NpySpec, check_header, chunk_file, read_rows

SCHEMA = pa.schema([("label", pa.float32()), ("d", pa.float32()), ("c", pa.int32()), ("row", pa.int64())])


def table(n: int, start: int = 0) -> pa.Table:
    dense = pa.array([None if i % 3 == 0 else float(i) for i in range(start, start + n)], pa.float32())  # every third null
    ids = pa.array(np.arange(start, start + n, dtype=np.int32))
    return pa.table({"label": pa.array(np.ones(n, np.float32)), "d": dense, "c": ids, "row": pa.array(np.arange(n, dtype=np.int64))}, schema=SCHEMA)


def test_fixed_columns_leave_out_passthrough_and_turn_nulls_into_nan() -> None:
    cols = FixedColumns.of(SCHEMA, "label", ["row"])
    assert (cols.dense, cols.sparse, cols.lists, cols.wide) == (["d"], ["c"], [], False)
    arrays = cols.arrays(table(4))
    assert arrays["sparse"].dtype == np.int32 and arrays["sparse"].shape == (4, 1)
    assert np.isnan(arrays["dense"][0, 0]) and arrays["dense"][1, 0] == 1.0


def test_list_columns_are_refused() -> None:
    schema = SCHEMA.append(pa.field("tags", pa.list_(pa.int32())))
    with pytest.raises(ListColumnsError, match="tags"):
        NpySpec.of(FixedColumns.of(schema, "label", ["row"]), 10)


def write(tmp_path: Path, rows: list[int], chunk_rows: int) -> tuple[NpySpec, ChunkWriter]:
    cols = FixedColumns.of(SCHEMA, "label", ["row"])
    spec = NpySpec.of(cols, chunk_rows)
    writer = ChunkWriter(tmp_path, "part-00000.parquet", spec)
    start = 0
    for n in rows:
        writer.write(cols.arrays(table(n, start)))
        start += n
    writer.close()
    for tmp, name in writer.written:
        tmp.rename(tmp_path / name)
    return spec, writer


def test_chunks_hold_every_row_in_order(tmp_path: Path) -> None:
    spec, writer = write(tmp_path, [7, 5, 9], chunk_rows=8)
    assert [c.rows for c in writer.chunks] == [8, 8, 5]
    ids = np.concatenate([read_rows(tmp_path / chunk_file("part-00000.parquet", "sparse", i), spec, "sparse", c.rows, 0, c.rows)
                          for i, c in enumerate(writer.chunks)])  # fmt: skip
    assert ids[:, 0].tolist() == list(range(21))
    part = read_rows(tmp_path / chunk_file("part-00000.parquet", "dense", 1), spec, "dense", 8, 2, 3)
    assert part.shape == (3, 1) and part[:2, 0].tolist() == [10.0, 11.0] and np.isnan(part[2, 0])  # row 12 was null


def test_a_truncated_chunk_is_an_input_error_naming_the_file(tmp_path: Path) -> None:
    spec, _ = write(tmp_path, [8], chunk_rows=8)
    path = tmp_path / chunk_file("part-00000.parquet", "dense", 0)
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(InputError, match="truncated") as e:
        check_header(path, spec, "dense", 8)
    assert str(path) in str(e.value)


def test_a_chunk_of_another_shape_or_a_foreign_file_is_refused(tmp_path: Path) -> None:
    spec, _ = write(tmp_path, [8], chunk_rows=8)
    path = tmp_path / chunk_file("part-00000.parquet", "sparse", 0)
    with pytest.raises(InputError, match=r"expected <i4 \(7, 1\)"):
        check_header(path, spec, "sparse", 7)
    path.write_bytes(b"not numpy")
    with pytest.raises(InputError, match="not a readable .npy file"):
        check_header(path, spec, "sparse", 8)
