"""The npy format of a processed output: the loader's batch fields as fixed-width chunks of .npy files.

``etl preprocess --format npy`` writes, for the output of each input shard (``part-00000.parquet`` names the shard
whether or not the Parquet file is written), one directory ``npy/part-00000/`` holding chunks of ``chunk_rows``
consecutive rows (the shard's last chunk may be shorter), each chunk one .npy file per field::

    npy/part-00000/label-00000.npy    [rows] float32
    npy/part-00000/dense-00000.npy    [rows, D] float32      dense columns in the loader's order
    npy/part-00000/sparse-00000.npy   [rows, S] int32/int64  single-valued id columns in the loader's order

The values are those of the loader's batches (``etl.loader.chunk``, which takes its field order from
``FixedColumns``): a missing dense value is NaN, ids are int64 when one id column is int64 and int32 otherwise
(the pipeline's ids are signed: ``etl.ids.id_dtype``, so DALI, which hands out no uint64, reads them as they are).
Passthrough columns are not loader fields and are not written; a pipeline with list (multi-hot) columns is refused
(``ListColumnsError``): a list has no fixed width.

These are the files DALI's numpy reader takes (``etl.loader.dali``); the default loader engine reads them too.
The manifest (``etl.io.processed``) records the ``NpySpec`` once and one ``NpyChunk`` (rows, checksums) per chunk.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from etl.errors import ConfigError, InputError
from etl.io.files import HashingFile, temporary_path
from etl.io.fs import Location, open_file

#: The directory of the npy chunks, relative to the output directory.
NPY_DIR = "npy"
#: The fields of a chunk, in file order.
FIELDS = ("label", "dense", "sparse")
#: Rows per chunk unless told otherwise: 64 k rows of a Criteo layout are ~10 MB, one DALI sample.
DEFAULT_CHUNK_ROWS = 65536


class ListColumnsError(ConfigError):
    """The npy format was asked for a pipeline whose output has list columns."""


@dataclass(frozen=True)
class FixedColumns:
    """The output columns behind each batch field: ``label``, ``dense`` (float columns but the label, in output
    order), ``sparse`` (integer columns, in output order), ``lists`` (list columns), and whether the ids need 64
    bits (``wide``: one sparse column is 64-bit). Passthrough columns are none of them."""

    label: str
    dense: list[str]
    sparse: list[str]
    lists: list[str]
    wide: bool

    @classmethod
    def of(cls, schema: pa.Schema, label: str, passthrough: list[str]) -> FixedColumns:
        """The fields of the output ``schema`` whose label column is ``label``."""
        fields = [f for f in schema if f.name not in passthrough]
        sparse = [f.name for f in fields if pa.types.is_integer(f.type)]
        return cls(
            label=label,
            dense=[f.name for f in fields if pa.types.is_floating(f.type) and f.name != label],
            sparse=sparse,
            lists=[f.name for f in fields if pa.types.is_list(f.type)],
            wide=any(schema.field(c).type == pa.int64() for c in sparse),
        )

    @property
    def sparse_numpy(self) -> np.dtype:
        return np.dtype(np.int64) if self.wide else np.dtype(np.int32)

    def arrays(self, table: pa.Table) -> dict[str, np.ndarray]:
        """The fixed fields of the rows of ``table`` (an output table): ``label`` [n] float32, ``dense`` [n, D]
        float32 (nulls as NaN), ``sparse`` [n, S] ids."""
        n = table.num_rows

        def stack(names: list[str], dtype: np.dtype) -> np.ndarray:
            out = np.empty((n, len(names)), dtype)
            for j, c in enumerate(names):
                out[:, j] = table.column(c).to_numpy()
            return out

        return {
            "label": table.column(self.label).to_numpy().astype(np.float32, copy=False),
            "dense": stack(self.dense, np.dtype(np.float32)),
            "sparse": stack(self.sparse, self.sparse_numpy),
        }


@dataclass(frozen=True)
class NpySpec:
    """What every chunk of an output holds: ``chunk_rows`` rows (the last of a shard may have fewer), and per
    field its numpy dtype (``dtypes``, as ``np.dtype.str``) and its width (``widths``; None for the
    one-dimensional label)."""

    chunk_rows: int
    dtypes: dict[str, str]
    widths: dict[str, int | None]

    @classmethod
    def of(cls, columns: FixedColumns, chunk_rows: int) -> NpySpec:
        """The spec of ``columns`` in chunks of ``chunk_rows``; ``ListColumnsError`` when they have list columns."""
        if columns.lists:
            raise ListColumnsError(f"--format npy: the output has list (multi-hot) column(s) {columns.lists}, which have no fixed width; "
                                   "write them with --format parquet")  # fmt: skip
        if chunk_rows < 1:
            raise ConfigError(f"npy chunk rows must be >= 1, got {chunk_rows}")
        return cls(
            chunk_rows=chunk_rows,
            dtypes={"label": "<f4", "dense": "<f4", "sparse": columns.sparse_numpy.str},
            widths={"label": None, "dense": len(columns.dense), "sparse": len(columns.sparse)},
        )

    def shape(self, field: str, rows: int) -> tuple[int, ...]:
        width = self.widths[field]
        return (rows,) if width is None else (rows, width)


@dataclass(frozen=True)
class NpyChunk:
    """One chunk as the manifest records it: its ``rows`` and the sha256 of each field's file."""

    rows: int
    sha256: dict[str, str]


def chunk_dir(output: str) -> str:
    """The directory of the chunks of the shard whose output is named ``output``, relative to the output directory."""
    return f"{NPY_DIR}/{output.removesuffix('.parquet')}"


def field_file(field: str, index: int) -> str:
    """The name of the file of ``field`` of chunk ``index``, in its shard's chunk directory."""
    return f"{field}-{index:05d}.npy"


def chunk_file(output: str, field: str, index: int) -> str:
    """The file of ``field`` of chunk ``index`` of shard ``output``, relative to the output directory."""
    return f"{chunk_dir(output)}/{field_file(field, index)}"


def chunk_files(output: str, chunks: int) -> Iterator[str]:
    """Every file of the ``chunks`` chunks of shard ``output``."""
    for i in range(chunks):
        for field in FIELDS:
            yield chunk_file(output, field, i)


class ChunkWriter:
    """Writes the rows of one shard as chunks under temporary names in ``directory``: ``write`` takes fixed-field
    arrays (``FixedColumns.arrays``), ``close`` writes the last, shorter chunk; ``written`` pairs each temporary
    file with its final name (relative to ``directory``) and ``chunks`` lists the chunks for the manifest.
    ``discard`` removes what was written."""

    def __init__(self, directory: Location, output: str, spec: NpySpec):
        self.directory, self.output, self.spec = directory, output, spec
        self.chunks: list[NpyChunk] = []
        self.written: list[tuple[Location, str]] = []
        self._pending: list[dict[str, np.ndarray]] = []
        self._pending_rows = 0

    def write(self, arrays: dict[str, np.ndarray]) -> None:
        self._pending.append(arrays)
        self._pending_rows += len(arrays["label"])
        while self._pending_rows >= self.spec.chunk_rows:
            self._flush(self.spec.chunk_rows)

    def close(self) -> None:
        if self._pending_rows:
            self._flush(self._pending_rows)

    def discard(self) -> None:
        for tmp, _ in self.written:
            tmp.unlink(missing_ok=True)

    def _flush(self, rows: int) -> None:
        """Write the first ``rows`` pending rows as the next chunk."""
        merged = {f: np.concatenate([a[f] for a in self._pending]) for f in FIELDS}
        rest = {f: merged[f][rows:] for f in FIELDS}
        self._pending, self._pending_rows = ([rest] if len(rest["label"]) else []), len(rest["label"])
        (self.directory / chunk_dir(self.output)).mkdir(parents=True, exist_ok=True)
        digests = {}
        for field in FIELDS:
            name = chunk_file(self.output, field, len(self.chunks))
            tmp = temporary_path(self.directory / name)
            self.written.append((tmp, name))
            array = np.ascontiguousarray(merged[field][:rows], dtype=np.dtype(self.spec.dtypes[field]))
            with HashingFile(tmp) as sink:
                np.lib.format.write_array(sink, array, allow_pickle=False)
            digests[field] = sink.hexdigest()
        self.chunks.append(NpyChunk(rows, digests))


_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def check_header(path: Location, spec: NpySpec, field: str, rows: int) -> int:
    """Check that the .npy file at ``path`` holds a C-ordered array of ``field``'s dtype and the shape of ``rows``
    rows, and that its size is its header's plus that array's; returns the offset of the data. Raises
    ``InputError`` naming the file otherwise (a truncated or foreign file among them)."""
    expected = spec.shape(field, rows)
    dtype = np.dtype(spec.dtypes[field])
    try:
        with open_file(path) as f:
            version = np.lib.format.read_magic(f)
            if version not in _HEADER_READERS:
                raise ValueError(f"npy format version {version} (this reader takes 1.0 and 2.0)")
            shape, fortran, found = _HEADER_READERS[version](f)
            offset = f.tell()
            f.seek(0, 2)
            size = f.tell()
    except FileNotFoundError:
        raise InputError(str(path), "the npy chunk is missing") from None
    except (OSError, ValueError) as e:
        raise InputError(str(path), f"not a readable .npy file: {e}") from None
    if found != dtype or fortran or tuple(shape) != expected:
        raise InputError(str(path), f"the npy chunk holds {found.str} {tuple(shape)}{' (Fortran order)' if fortran else ''}, "
                                    f"expected {dtype.str} {expected}")  # fmt: skip
    data = int(np.prod(expected)) * dtype.itemsize
    if size != offset + data:
        raise InputError(str(path), f"the npy chunk has {size} bytes, expected {offset + data} (header {offset} + data {data}): truncated or padded")
    return offset


def read_rows(path: Location, spec: NpySpec, field: str, rows: int, start: int, length: int) -> np.ndarray:
    """Rows ``[start, start + length)`` of ``field`` from the chunk file at ``path`` of ``rows`` rows (its header
    checked as ``check_header`` does)."""
    offset = check_header(path, spec, field, rows)
    dtype = np.dtype(spec.dtypes[field])
    row_bytes = int(np.prod(spec.shape(field, 1))) * dtype.itemsize
    with open_file(path) as f:
        f.seek(offset + start * row_bytes)
        data = f.read(length * row_bytes)
    if len(data) != length * row_bytes:
        raise InputError(str(path), f"the npy chunk ended before row {start + length}")
    return np.frombuffer(data, dtype).reshape(spec.shape(field, length))
