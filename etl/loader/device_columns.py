"""Raw shards read into device memory (``Loader(reader="cudf")``): from the device column layout to device chunks.

A ``ReadColumns`` function (``etl.loader.cudf_columns.read_columns`` on a GPU with cudf) returns the rows of one
piece in the **device column layout**: per column an ``etl.batch.Column`` of torch tensors on the device (numbers
as int64 / float64 ``values``, text as ``etl.batch.Strings`` of uint8 bytes and int64 starts/ends, ``valid`` bool
or None), exactly what ``etl.backends.tensor.batch_to(etl.io.parquet.batch_from_arrow(...))`` makes of the same
rows. Everything after it is here and runs on CPU tensors as on CUDA ones (the tests feed it that pyarrow twin):

- ``DeviceColumnReader`` runs the pipeline's host part (label check, ``Decode`` of hex and integer text...) with
  the torch backend on the device, and lays the result out as ``device_chunk``: the fixed-width inputs of
  ``etl.loader.device_stage`` (``Inputs``), as tensors on the device, ``origin`` included;
- the assembler gathers shuffle-buffer rows from such chunks on the device (``ChunkRun.gather_tensors``) straight
  into the ring slot's device inputs, and the device stage transforms them: no host copy of the rows, and no work
  per row on the CPU (the shuffle order, a permutation per buffer, is drawn on the host as on every path, so that
  the batches are the same).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import torch

from etl.batch import Batch, Column
from etl.errors import InputError
from etl.io.fs import Location
from etl.io.parquet import check_type, read_footer
from etl.loader.chunk import Chunk
from etl.loader.device_stage import ROW_BITS, DeviceStage, Inputs
from etl.loader.order import Piece, RowGroup
from etl.loader.stats import LoaderStats
from etl.pipeline import Pipeline
from etl.schema import Schema

#: (path, schema, columns, row group, first row within it, rows, device) → columns in the device column layout
ReadColumns = Callable[[str, Schema, list[str], int, int, int, torch.device], dict[str, Column]]


def device_chunk(inputs: Inputs, batch: Batch, group_no: int, group_first_row: int) -> Chunk:
    """``Inputs.chunk`` for a host-part output held in tensors: the same fields, as tensors on the batch's device
    (``origin`` included: it is gathered there with the rows)."""
    n = batch.num_rows
    device = batch[inputs.label].array.device

    def stack(names: list[str], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if not names:
            return torch.empty((n, 0), dtype=dtype, device=device), torch.ones((n, 0), dtype=torch.bool, device=device)
        values = torch.stack([batch[c].array.to(dtype) for c in names], dim=1)
        present = torch.ones(n, dtype=torch.bool, device=device)
        valid = torch.stack([_present(batch[c].valid, present) for c in names], dim=1)
        return values, valid

    numbers, numbers_valid = stack(inputs.numbers, torch.float64)
    keys, keys_valid = stack(inputs.keys, torch.int64)
    first = int(batch.row_ids[0]) - group_first_row if n else 0
    origin = torch.arange(first, first + n, dtype=torch.int64, device=device)
    origin |= group_no << ROW_BITS
    fixed = {
        "in_label": batch[inputs.label].array.to(torch.float64, copy=True),  # every field its own (torch) memory
        "in_numbers": numbers,
        "in_numbers_valid": numbers_valid,
        "in_keys": keys,
        "in_keys_valid": keys_valid,
        "origin": origin,
    }
    return Chunk(n, fixed, {})


def _present(valid: torch.Tensor | None, everywhere: torch.Tensor) -> torch.Tensor:
    return everywhere if valid is None else valid


class DeviceColumnReader:
    """A raw shard read by ``read`` into the device column layout on ``device``, and taken through the pipeline's
    host part on the device into a ``device_chunk`` for ``stage``. Each file's column types are checked against
    the schema (from its footer, once) before its first rows are read, as the default reader does. Work is queued
    on the calling thread's current stream (the legacy default stream, ordered after cudf's own work there or on
    a per-thread default stream), which is synchronised before the chunk is returned: the assembler reads it from
    another stream. The chunk's fields are fresh torch allocations, never the reader's buffers."""

    def __init__(self, pipeline: Pipeline, stage: DeviceStage, groups: list[RowGroup], stats: LoaderStats,
                 device: torch.device, read: ReadColumns) -> None:  # fmt: skip
        from etl.backends import tensor  # imported here: the default readers never need it

        self.xp = tensor
        self.pipeline, self.stage, self.stats, self.device, self.read = pipeline, stage, stats, device, read
        self.columns = pipeline.input_columns
        self.group_no = {g: i for i, g in enumerate(groups)}
        self._checked: set[Location] = set()
        self._lock = threading.Lock()

    def __call__(self, piece: Piece) -> Chunk:
        g = piece.group
        self._check_types(g.path)
        t0 = time.perf_counter()
        columns = self.read(str(g.path), self.pipeline.schema, self.columns, g.index, piece.start, piece.length, self.device)
        t1 = time.perf_counter()
        first = g.first_row + piece.start
        batch = Batch(columns, piece.length, str(g.path), g.index, np.arange(first, first + piece.length, dtype=np.int64))
        host = self.pipeline.transform(batch, part="host", xp=self.xp).batch
        chunk = device_chunk(self.stage.inputs, host, self.group_no[g], g.first_row)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        self.stats.add_read(t1 - t0, time.perf_counter() - t1)
        return chunk

    def _check_types(self, path: Location) -> None:
        """``InputError`` when a column of the file is missing or of a type the schema's column cannot hold."""
        with self._lock:
            if path in self._checked:
                return
            arrow = read_footer(path).schema.to_arrow_schema()
            for name in self.columns:
                if name not in arrow.names:
                    raise InputError(str(path), "column missing", column=name)
                check_type(str(path), self.pipeline.schema.column(name), arrow.field(name).type)
            self._checked.add(path)
