"""Transforming after the host→device copy: ``Loader(transform_on="device")``.

The pipeline is cut in two (``Pipeline.split``). Loader workers read shards and run only the host part (the label
check, decoding raw text into uint64 keys, DateParts) and lay the result out as fixed-width **inputs**; the assembler
shuffles and batches them into the ring's pinned slots; after a slot's host→device copy, on the same side
stream, the device part (dense ops, Hash, Categorify, crosses...) runs with the torch backend
(``etl.backends.tensor``, vocabularies resident on the device) and writes the batch the training loop gets
(``label``, ``dense``, ``sparse`` and the lists, as with host placement, bit for bit).

Inputs of one slot (``Inputs.fields``):

- ``in_label`` float64 [B];
- ``in_numbers`` float64 [B, N] and ``in_numbers_valid`` bool [B, N]: the columns that hold numbers after the host
  part (the dense columns), missing values marked invalid;
- ``in_keys`` int64 [B, K] and ``in_keys_valid`` bool [B, K]: single-valued key columns (DateParts' included), the
  uint64 keys' bits;
- list columns travel beside the ring as (values int64 keys, valid bool, offsets int64);
- ``origin`` (host only, never copied; on the device for rows read there, ``etl.loader.device_columns``):
  ``(row group number in the loader's list) << 32 | row within the row group`` of every row, so that a value found
  invalid on the device is reported with its file, row group and row.

The stage never makes the host wait for the device: the non-finite checks of ``FillMissing`` and of the output
run inside ``etl.backends.tensor.deferred_nonfinite`` and leave a flag on the device, copied into pinned memory
with an event (``PendingCheck``); the consumer examines it when it receives the batch and, when it is set, runs
the device part again with waiting checks to raise the ``RowError`` host placement raises. A batch with such a
value is never handed out.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from etl.batch import Batch, Column
from etl.errors import RowError
from etl.loader.chunk import Chunk, Layout
from etl.loader.order import RowGroup
from etl.loader.ring import Field
from etl.pipeline import Pipeline

ROW_BITS = 32


@dataclass(frozen=True)
class Inputs:
    """Which columns a device transform receives, and how (see the module docstring)."""

    label: str
    numbers: list[str]
    keys: list[str]
    lists: list[str]

    @classmethod
    def of(cls, pipeline: Pipeline) -> Inputs:
        schema = pipeline.schema
        kind = pipeline.kinds_after(pipeline.split()[0])
        label = schema.by_role("label")[0]
        lists = [c.name for c in schema.columns if c.is_list]
        raw = [c for c, k in kind.items() if k == "raw"]
        if raw:
            raise ValueError(f"column '{raw[0]}' is still raw after the host part of the pipeline")
        numbers = [c for c, k in kind.items() if k == "number" and c != label]
        keys = [c for c, k in kind.items() if k == "keys" and c not in lists]
        return cls(label, numbers, keys, lists)

    def fields(self) -> list[Field]:
        """The ring fields the inputs are copied through."""
        n, k = len(self.numbers), len(self.keys)
        return [
            Field("in_label", (), torch.float64),
            Field("in_numbers", (n,), torch.float64),
            Field("in_numbers_valid", (n,), torch.bool),
            Field("in_keys", (k,), torch.int64),
            Field("in_keys_valid", (k,), torch.bool),
        ]

    def empty(self) -> Chunk:
        """A chunk of no rows."""
        n, k = len(self.numbers), len(self.keys)
        fixed = {
            "in_label": np.zeros(0, np.float64),
            "in_numbers": np.zeros((0, n), np.float64),
            "in_numbers_valid": np.zeros((0, n), np.bool_),
            "in_keys": np.zeros((0, k), np.int64),
            "in_keys_valid": np.zeros((0, k), np.bool_),
            "origin": np.zeros(0, np.int64),
        }
        return Chunk(0, fixed, {c: Column(np.zeros(0, np.int64), None, np.zeros(1, np.int64)) for c in self.lists})

    def chunk(self, batch: Batch, group_no: int, group_first_row: int) -> Chunk:
        """The host part's output ``batch`` (numpy, rows of row group ``group_no`` of the loader, whose first row
        is row ``group_first_row`` of its file) as a chunk of inputs."""
        n = batch.num_rows

        def stack(names: list[str], dtype: Any) -> tuple[np.ndarray, np.ndarray]:
            values = np.empty((n, len(names)), dtype)
            valid = np.ones((n, len(names)), np.bool_)
            for j, c in enumerate(names):
                col = batch[c]
                v = col.array.view(np.int64) if col.array.dtype == np.uint64 else col.array
                values[:, j] = v
                if col.valid is not None:
                    valid[:, j] = col.valid
            return values, valid

        numbers, numbers_valid = stack(self.numbers, np.float64)
        keys, keys_valid = stack(self.keys, np.int64)
        fixed = {
            "in_label": batch[self.label].array.astype(np.float64, copy=False),
            "in_numbers": numbers,
            "in_numbers_valid": numbers_valid,
            "in_keys": keys,
            "in_keys_valid": keys_valid,
            "origin": (np.int64(group_no) << ROW_BITS) | (batch.row_ids - group_first_row),
        }
        lists = {}
        for c in self.lists:
            col = batch[c]
            lists[c] = Column(col.array.view(np.int64), col.valid, col.list_offsets.astype(np.int64, copy=False))
        return Chunk(n, fixed, lists)


@dataclass(frozen=True)
class PendingCheck:
    """The non-finite checks of one batch transformed on the device, examined by the consumer when it receives the
    batch: ``flag`` (host bool [1], pinned on CUDA) is set once the copy ``done`` (None: already done) has
    completed if a check found a present NaN or ±inf; ``recheck`` then raises the ``RowError`` naming it."""

    flag: torch.Tensor
    done: torch.cuda.Event | None
    recheck: Callable[[], None]

    def raise_if_set(self) -> None:
        """Wait for the batch's checks (not for the rest of the device's work) and raise the error they found."""
        if self.done is not None:
            self.done.synchronize()
        if bool(self.flag[0]):
            self.recheck()
            raise RuntimeError("the device flagged a NaN or infinite value that the checks, run again, did not find")


class DeviceStage:
    """Runs the device part of ``pipeline`` on one slot's inputs and writes the loader's batch fields."""

    def __init__(self, pipeline: Pipeline, layout: Layout, groups: list[RowGroup]):
        from etl.backends import tensor  # imported here: host placement never needs it

        self.xp = tensor
        self.pipeline, self.layout, self.groups = pipeline, layout, groups
        self.inputs = Inputs.of(pipeline)

    def outputs(self) -> tuple[Field, ...]:
        """The device-only ring fields the stage writes: ``label``, ``dense``, ``sparse``."""
        return tuple(self.layout.batch_fields())

    def run(
        self, inputs: dict[str, torch.Tensor], out: dict[str, torch.Tensor], lists: dict[str, Column], origin: np.ndarray | torch.Tensor
    ) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], PendingCheck]:
        """Transform one batch: ``inputs`` (device tensors of the slot), ``lists`` (numpy, copied here). Fills
        ``out`` and returns the list columns as (ids, offsets) on the device, and the batch's non-finite checks,
        which ran on the device without the host waiting for them (``PendingCheck``). Any other value the device
        part finds invalid raises ``RowError`` naming its source row at once."""
        batch = self.batch(inputs, lists)
        device = inputs["in_label"].device
        try:
            with self.xp.deferred_nonfinite(device) as deferred:
                result = self.pipeline.transform(batch, part="device", xp=self.xp).batch
        except RowError as e:
            self.check(batch, origin)  # a non-finite value the deferred checks passed over comes first
            raise self._located(e, origin) from None
        written = self.write(result, out)
        recheck = functools.partial(self.recheck, inputs, lists, origin)  # the slot's inputs: kept until it is released
        if device.type != "cuda":
            return written, PendingCheck(deferred.flag, None, recheck)
        flag = torch.empty(1, dtype=torch.bool, pin_memory=True)
        flag.copy_(deferred.flag, non_blocking=True)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(device))
        return written, PendingCheck(flag, done, recheck)

    def recheck(self, inputs: dict[str, torch.Tensor], lists: dict[str, Column], origin: np.ndarray | torch.Tensor) -> None:
        """``check`` on a slot's inputs, once its transform is done (the consumer holds the slot)."""
        self.check(self.batch(inputs, lists), origin)

    def check(self, batch: Batch, origin: np.ndarray | torch.Tensor) -> None:
        """Run the device part on ``batch`` with every check waiting for its result: raise ``RowError`` naming the
        source row of the first invalid value, in the order of the ops (the error host placement raises)."""
        try:
            self.pipeline.transform(batch, part="device", xp=self.xp)
        except RowError as e:
            raise self._located(e, origin) from None

    def batch(self, inputs: dict[str, torch.Tensor], lists: dict[str, Column]) -> Batch:
        """The slot's inputs as a batch of torch columns (lists copied to the inputs' device through pinned memory,
        without waiting for the copy)."""
        device = inputs["in_label"].device
        # one transpose per field, so that each column is contiguous for the ops
        fields = ("in_numbers", "in_numbers_valid", "in_keys", "in_keys_valid")
        numbers, numbers_valid, keys, keys_valid = (inputs[k].t().contiguous() for k in fields)
        columns = {self.inputs.label: Column(inputs["in_label"])}
        for j, c in enumerate(self.inputs.numbers):
            columns[c] = Column(numbers[j], numbers_valid[j])
        for j, c in enumerate(self.inputs.keys):
            columns[c] = Column(keys[j], keys_valid[j])
        for c, col in lists.items():
            columns[c] = self.xp.column_to(col, device, staged=True)
        return Batch(columns, inputs["in_label"].shape[0], "<device batch>")

    def write(self, result: Batch, out: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Copy the transformed batch into the loader's fields ``out``; return its lists as (ids, offsets).
        Dense values still missing (no FillMissing) become NaN, as with host placement."""
        out["label"].copy_(result[self.layout.label].array)
        dense = [result[c] for c in self.layout.dense]
        if dense:
            out["dense"].copy_(torch.stack([c.array if c.valid is None else torch.where(c.valid, c.array, torch.nan) for c in dense], dim=1))
        if self.layout.sparse:
            out["sparse"].copy_(torch.stack([result[c].array.to(self.layout.sparse_dtype) for c in self.layout.sparse], dim=1))
        return {c: (result[c].array.to(self.layout.sparse_dtype), result[c].list_offsets) for c in self.layout.lists}

    def _located(self, e: RowError, origin: np.ndarray | torch.Tensor) -> RowError:
        """``e`` (row = position in the batch) re-addressed to the file row the value came from."""
        o = int(origin[e.row])
        g = self.groups[o >> ROW_BITS]
        return RowError(str(g.path), g.index, g.first_row + (o & ((1 << ROW_BITS) - 1)), e.column, e.problem)
