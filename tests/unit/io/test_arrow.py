"""etl.io.arrow: Arrow arrays from numpy buffers equal those pyarrow.array builds, and they write the same Parquet."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.io.arrow import from_numpy, strings, to_numpy, validity


def parquet_bytes(arr: pa.Array) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table({"x": arr}), sink)
    return sink.getvalue()


@pytest.mark.parametrize(
    ("values", "t"),
    [
        (np.array([3, 1, 2], np.uint64), pa.uint64()),
        (np.array([3, -1, 2], np.int64), pa.int32()),
        (np.array([0.5, 1.5, -0.25]), pa.float32()),
        (np.array([True, False, True]), pa.bool_()),
        (np.arange(70, dtype=np.int16), pa.int16()),
    ],
)
@pytest.mark.parametrize("with_nulls", [False, True])
def test_from_numpy_equals_pyarrow_array(values: np.ndarray, t: pa.DataType, with_nulls: bool) -> None:
    valid = (np.arange(len(values)) % 3 != 1) if with_nulls else None
    ours = from_numpy(values, t, valid)
    theirs = pa.array(values.astype(t.to_pandas_dtype()), t, mask=None if valid is None else ~valid)
    assert ours.type == t
    assert ours.null_count == theirs.null_count
    assert ours.equals(theirs)
    assert parquet_bytes(ours) == parquet_bytes(theirs)


def test_from_numpy_default_type_and_all_valid() -> None:
    arr = from_numpy(np.array([1, 2], np.uint32), valid=np.array([True, True]))
    assert arr.type == pa.uint32() and arr.null_count == 0 and arr.buffers()[0] is None
    nan = from_numpy(np.array([np.nan, 1.0]))
    assert nan.type == pa.float64() and nan.null_count == 0  # NaN is a value, as with pyarrow.array


def test_from_numpy_refuses_2d() -> None:
    with pytest.raises(ValueError, match="1-d"):
        from_numpy(np.zeros((2, 2)))


def test_validity_bitmap() -> None:
    assert validity(None) is None
    assert validity(np.ones(5, bool)) is None
    bits = validity(np.array([True, False, True, True, False, False, True, True, True]))
    assert bits is not None and bytes(bits) == bytes([0b11001101, 0b1])


def test_strings_equals_pyarrow_array() -> None:
    texts = ["a", "", "é€", "x" * 100]
    assert strings(texts).equals(pa.array(texts, pa.string()))
    assert strings([]).equals(pa.array([], pa.string()))


def test_to_numpy_reads_chunks_slices_and_refuses_nulls() -> None:
    arr = pa.array(np.arange(10, dtype=np.int64)).slice(3, 4)
    assert to_numpy(arr).tolist() == [3, 4, 5, 6]
    chunked = pa.chunked_array([pa.array([1, 2], pa.uint64()), pa.array([3], pa.uint64())])
    assert to_numpy(chunked).tolist() == [1, 2, 3] and to_numpy(chunked).dtype == np.uint64
    assert to_numpy(pa.chunked_array([], pa.int64())).dtype == np.int64
    with pytest.raises(ValueError, match="null"):
        to_numpy(pa.array([1, None]))
    with pytest.raises(TypeError, match="fixed-width"):
        to_numpy(pa.array(["a"]))


def test_building_arrays_does_not_import_pandas() -> None:
    code = (
        "import sys, numpy as np\n"
        "from etl.io.arrow import from_numpy, strings, to_numpy\n"
        "a = from_numpy(np.arange(5), valid=np.arange(5) > 1)\n"
        "to_numpy(from_numpy(np.arange(5)))\n"
        "strings(['a', 'b']).take(from_numpy(np.array([1, 0])))\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
