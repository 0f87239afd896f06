"""Transformed rows in the shape training wants, between the pipeline's output and the loader's ring.

A ``Layout`` maps a pipeline's output columns to batch fields: ``label`` [n] float32, ``dense`` [n, D] float32
(dense columns in output order), ``sparse`` [n, S] ids (single-valued id columns in output order: the schema's, in
schema order, then those ops create, such as HashedCross and DateParts columns, in pipeline order; int32 when every
cardinality fits, else int64), and ``lists``: one (values, offsets) pair per multi-hot column. Passthrough columns
are no batch field: they are left out of the loader's batches.

Columns given by the loader's streaming states (``etl.ops.stream``, ``etl.loader.stream_state``) are not filled by
the transform (``Layout.streamed``); the columns those states read travel with the rows instead, raw
(``Layout.carried``, ``Chunk.carried``).

The lengths column of a History op's lists (``hist_len``, ``etl.loader.sequences``) is no sparse column: it goes to
the field ``lengths`` [n, K] int32 (the lengths columns in op order; no such field without them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import torch

from etl.backends.rows import scatter_rows, split_rows
from etl.batch import Array, Batch, Column, list_elements
from etl.io.npy import FixedColumns
from etl.loader.ring import Field
from etl.loader.sequences import Sequence, sequences_of
from etl.ops.stream import Carried, StreamInput, stream_specs
from etl.pipeline import Pipeline


@dataclass(frozen=True)
class Layout:
    label: str
    dense: list[str]
    sparse: list[str]
    lists: list[str]
    sparse_dtype: torch.dtype
    #: dense or sparse columns whose values the loader's streaming states give (``etl.loader.stream_state``):
    #: the transform leaves their fields unfilled
    streamed: tuple[str, ...] = ()
    #: the columns those states read, carried raw from the transform to them (``Chunk.carried``), each once
    carried: tuple[StreamInput, ...] = ()
    #: the list columns of each History op and their lengths column (``etl.loader.sequences``)
    sequences: tuple[Sequence, ...] = ()

    @property
    def lengths(self) -> list[str]:
        """The sequences' lengths columns: the columns of the field ``lengths``, in order."""
        return [s.length for s in self.sequences]

    @classmethod
    def of(cls, pipeline: Pipeline, raw: bool = True) -> Layout:
        """The layout of ``pipeline``'s batches: made from ``raw`` shards, with its streaming states, or read from a
        processed output (whose rows hold every value)."""
        labels = pipeline.schema.by_role("label")
        if len(labels) != 1:
            raise ValueError(f"the loader needs exactly one label column, the schema has {labels}")
        c = FixedColumns.of(pipeline.output_schema(), labels[0], pipeline.passthrough)  # passthrough columns are not batch fields
        specs = stream_specs(pipeline.ops) if raw else []
        streamed = tuple(x for s in specs for x in s.outputs)
        outside = [x for s in specs for x in s.outputs if x not in c.dense and x not in c.sparse and not (x in c.lists and x in s.lengths)]
        if outside:
            raise ValueError(f"streaming state writes column '{outside[0]}', which is no dense or single-valued sparse column of the batch, "
                             "nor a list column it gives the lengths of")  # fmt: skip
        carried: dict[str, StreamInput] = {}
        for i in (i for s in specs for i in s.inputs):
            if carried.setdefault(i.column, i) != i:
                raise ValueError(f"streaming states read column '{i.column}' as {carried[i.column].dtype} and as {i.dtype}")
        sequences = sequences_of(pipeline.ops, c.lists, c.sparse)
        lengths = {s.length for s in sequences}
        sparse = [x for x in c.sparse if x not in lengths]
        return cls(c.label, c.dense, sparse, c.lists, torch.int64 if c.wide else torch.int32, streamed, tuple(carried.values()), sequences)

    @property
    def fixed_columns(self) -> FixedColumns:
        return FixedColumns(self.label, self.dense, self.sparse, self.lists, self.sparse_dtype == torch.int64)

    @property
    def columns(self) -> list[str]:
        return [self.label, *self.dense, *self.sparse, *self.lengths, *self.lists]

    @property
    def sparse_numpy(self) -> np.dtype:
        return np.dtype(np.int64) if self.sparse_dtype == torch.int64 else np.dtype(np.int32)

    def stream_fields(self) -> dict[str, tuple[str, int]]:
        """Where each ``streamed`` column goes in a batch: its field (``dense``, ``sparse`` or ``lengths``) and index
        there (list columns are no field: the states give them whole)."""
        fields = {"dense": self.dense, "sparse": self.sparse, "lengths": self.lengths}
        return {c: next((f, names.index(c)) for f, names in fields.items() if c in names) for c in self.streamed if c not in self.lists}

    def batch_fields(self) -> list[Field]:
        """The fixed-shape fields of a batch, as ring slots hold them: ``label`` [B] float32, ``dense`` [B, D]
        float32, ``sparse`` [B, S] ids, and with sequences ``lengths`` [B, K] int32."""
        fields = [
            Field("label", (), torch.float32),
            Field("dense", (len(self.dense),), torch.float32),
            Field("sparse", (len(self.sparse),), self.sparse_dtype),
        ]
        return fields + [Field("lengths", (len(self.sequences),), torch.int32)] if self.sequences else fields

    def empty(self) -> Chunk:
        fixed = {
            "label": np.zeros(0, np.float32),
            "dense": np.zeros((0, len(self.dense)), np.float32),
            "sparse": np.zeros((0, len(self.sparse)), self.sparse_numpy),
        }
        if self.sequences:
            fixed["lengths"] = np.zeros((0, len(self.sequences)), np.int32)
        lists = {c: Column(np.zeros(0, self.sparse_numpy), None, np.zeros(1, np.int64)) for c in self.lists}
        return Chunk(0, fixed, lists)


@dataclass(frozen=True)
class Chunk:
    """``n`` rows: fixed-shape fields (``label``, ``dense``, ``sparse``; other names for the inputs of a device
    transform, see ``etl.loader.device_stage``), list columns (values, per-value ``valid`` or None, offsets) and
    the columns carried raw to the loader's streaming states (``Layout.carried``: values and valid mask per row).
    Fields are numpy arrays, or torch tensors on the device for chunks read there (``etl.loader.device_columns``,
    which have no list columns)."""

    n: int
    fixed: dict[str, Array]
    lists: dict[str, Column]
    carried: dict[str, Carried] = field(default_factory=dict)
    #: where its rows come from, when they are consecutive rows of one row group of a raw shard: its path, the row
    #: group and the file row of the first row (for the errors of the streaming states)
    origin: tuple[str, int, int] | None = None

    @classmethod
    def from_table(cls, table: pa.Table, layout: Layout) -> Chunk:
        """An output table (``Pipeline.to_arrow`` or a processed shard) → a chunk."""
        fixed = layout.fixed_columns.arrays(table)
        if layout.sequences:
            fixed["lengths"] = np.stack([table.column(c).to_numpy().astype(np.int32, copy=False) for c in layout.lengths], axis=1)
        lists = {}
        for c in layout.lists:
            arr = table.column(c).combine_chunks()
            offsets = arr.offsets.to_numpy().astype(np.int64)
            values = arr.values.to_numpy().astype(layout.sparse_numpy)[offsets[0] : offsets[-1]]
            lists[c] = Column(values, None, offsets - offsets[0])
        return cls(table.num_rows, fixed, lists)

    @classmethod
    def from_batch(cls, batch: Batch, layout: Layout) -> Chunk:
        """A transformed batch (numpy columns, ``Pipeline.transform``'s output) → a chunk, without going through
        Arrow: the same values as ``from_table(pipeline.to_arrow(batch))`` (missing dense values become NaN). The
        layout's ``streamed`` columns are left unfilled, its ``carried`` columns go to ``carried`` as they are in
        ``batch``."""
        n = batch.num_rows

        def stack(names: list[str], dtype: np.dtype) -> np.ndarray:
            out = np.empty((n, len(names)), dtype)
            for j, c in enumerate(names):
                if c in layout.streamed:
                    continue
                col = batch[c]
                out[:, j] = col.array
                if col.valid is not None:
                    out[~col.valid, j] = np.nan
            return out

        fixed = {
            "label": batch[layout.label].array.astype(np.float32),
            "dense": stack(layout.dense, np.dtype(np.float32)),
            "sparse": stack(layout.sparse, layout.sparse_numpy),
        }
        if layout.sequences:
            fixed["lengths"] = stack(layout.lengths, np.dtype(np.int32))
        lists = {c: Column(batch[c].array.astype(layout.sparse_numpy), None, batch[c].list_offsets.astype(np.int64))
                 for c in layout.lists if c not in layout.streamed}  # fmt: skip
        if len(lists) < len(layout.lists):  # lists a streaming state gives: empty until it does
            lists |= {c: Column(np.zeros(0, layout.sparse_numpy), None, np.zeros(n + 1, np.int64)) for c in layout.lists if c in layout.streamed}
            lists = {c: lists[c] for c in layout.lists}
        carried = {}
        for c, dtype in layout.carried:
            col = batch[c]
            values = col.array
            same = values.dtype.kind in "iu" and dtype.kind in "iu" and values.dtype.itemsize == dtype.itemsize
            carried[c] = Carried(values.view(dtype) if same else values.astype(dtype), np.ones(n, np.bool_) if col.valid is None else col.valid)
        origin = None
        if layout.carried and (n == 0 or int(batch.row_ids[-1]) - int(batch.row_ids[0]) == n - 1):
            origin = (batch.source, batch.row_group, int(batch.row_ids[0]) if n else 0)
        return cls(n, fixed, lists, carried, origin)

    def row_origin(self, i: int) -> tuple[str, int, int] | None:
        """The path, row group and file row of row ``i`` (None when ``origin`` is not known)."""
        return None if self.origin is None else (self.origin[0], self.origin[1], self.origin[2] + i)

    def slice(self, a: int, b: int) -> Chunk:
        lists = {}
        for k, c in self.lists.items():
            o = c.list_offsets[a : b + 1]
            lists[k] = Column(c.array[o[0] : o[-1]], None if c.valid is None else c.valid[o[0] : o[-1]], o - o[0])
        carried = {k: Carried(v.values[a:b], v.valid[a:b]) for k, v in self.carried.items()}
        return Chunk(b - a, {k: v[a:b] for k, v in self.fixed.items()}, lists, carried, self.row_origin(a))

    def take_lists(self, rows: np.ndarray) -> Chunk:
        """The list columns of rows ``rows`` (no fixed fields: the loader gathers those into its ring)."""
        lists = {}
        for k, c in self.lists.items():
            elems, offsets = list_elements(c.list_offsets, rows)
            lists[k] = Column(c.array[elems], None if c.valid is None else c.valid[elems], offsets)
        return Chunk(len(rows), {}, lists)

    @staticmethod
    def concat(chunks: list[Chunk]) -> Chunk:
        if len(chunks) == 1:
            return chunks[0]
        fixed = {k: np.concatenate([c.fixed[k] for c in chunks]) for k in chunks[0].fixed}
        lists = {}
        for k in chunks[0].lists:
            parts = [c.lists[k] for c in chunks]
            ends = np.cumsum([len(p.values) for p in parts])
            offsets = np.concatenate([np.zeros(1, np.int64)] + [p.list_offsets[1:] + (ends[i - 1] if i else 0) for i, p in enumerate(parts)])
            valid = None
            if any(p.valid is not None for p in parts):
                valid = np.concatenate([np.ones(len(p.values), np.bool_) if p.valid is None else p.valid for p in parts])
            lists[k] = Column(np.concatenate([p.values for p in parts]), valid, offsets.astype(np.int64))
        carried = {k: Carried(*(np.concatenate([c.carried[k][i] for c in chunks]) for i in range(2))) for k in chunks[0].carried}
        return Chunk(sum(c.n for c in chunks), fixed, lists, carried)


class ChunkRun:
    """Chunks taken as one run of rows (a shuffle buffer) without concatenating their fixed fields: row i of the
    run is row ``i - starts[k]`` of chunk k, for the k with ``starts[k] <= i < starts[k + 1]``. ``gather`` copies
    rows straight from the chunks into their destination (one copy per row, as ``np.take`` from a concatenation
    would, without the concatenation); the list columns are concatenated once (``lists``)."""

    def __init__(self, chunks: list[Chunk]):
        self.chunks = chunks
        self.starts = np.zeros(len(chunks) + 1, np.int64)
        np.cumsum([c.n for c in chunks], out=self.starts[1:])
        self.lists = Chunk.concat([Chunk(c.n, {}, c.lists) for c in chunks])
        self.on_device = bool(chunks) and any(isinstance(v, torch.Tensor) for v in chunks[0].fixed.values())
        self._whole: dict[str, torch.Tensor] | None = None  # the fields of chunks on the device, concatenated

    @property
    def n(self) -> int:
        return int(self.starts[-1])

    def row_origin(self, row: int) -> tuple[str, int, int] | None:
        """The path, row group and file row of row ``row`` of the run (``Chunk.row_origin``)."""
        k = int(np.searchsorted(self.starts, row, side="right")) - 1
        return self.chunks[k].row_origin(row - int(self.starts[k]))

    def gather_tensors(self, rows: np.ndarray, out: dict[str, torch.Tensor]) -> None:
        """``gather`` for chunks of tensors (``on_device``), on their device and the current stream: the run's
        fields are concatenated there once, then rows ``rows`` are selected from them into the tensors ``out``."""
        whole = self._concatenated()
        index = _index(rows, next(iter(whole.values())).device)
        for name, dest in out.items():
            torch.index_select(whole[name], 0, index, out=dest)

    def _concatenated(self) -> dict[str, torch.Tensor]:
        if self._whole is None:
            fields = self.chunks[0].fixed
            if any(v.is_cuda for v in fields.values()):
                stream = torch.cuda.current_stream()
                for c in self.chunks:  # made on a reader's stream, read on this one: not reused before this reads them
                    for v in c.fixed.values():
                        v.record_stream(stream)
            self._whole = {k: torch.cat([c.fixed[k] for c in self.chunks]) for k in fields}
        return self._whole

    def gather(self, rows: np.ndarray, out: dict[str, np.ndarray], carried: dict[str, Carried] | None = None) -> None:
        """Fixed fields of rows ``rows`` (row numbers of the run; ``IndexError`` for one out of range) into
        ``out``: name → array of ``len(rows)`` rows, and carried columns into ``carried``: column → values and
        valid of ``len(rows)`` rows."""
        src_rows, out_rows, bounds = split_rows(self.starts, rows)
        for k, c in enumerate(self.chunks):
            a, b = bounds[k], bounds[k + 1]
            if a < b:
                for name, dest in out.items():
                    scatter_rows(c.fixed[name], src_rows[a:b], dest, out_rows[a:b])
                for name, (values, valid) in (carried or {}).items():
                    scatter_rows(c.carried[name].values, src_rows[a:b], values, out_rows[a:b])
                    scatter_rows(c.carried[name].valid, src_rows[a:b], valid, out_rows[a:b])

    def take_fixed(self, name: str, rows: np.ndarray) -> Array:
        """Fixed field ``name`` of rows ``rows``, as a new array (a tensor on the device when ``on_device``)."""
        if self.on_device:
            whole = self._concatenated()[name]
            return torch.index_select(whole, 0, _index(rows, whole.device))
        field = self.chunks[0].fixed[name]
        out = {name: np.empty((len(rows), *field.shape[1:]), field.dtype)}
        self.gather(rows, out)
        return out[name]


def _index(rows: np.ndarray, device: torch.device) -> torch.Tensor:
    """Row numbers as an int64 tensor on ``device``, copied there without waiting (``tensor.to_device``, staged)."""
    from etl.backends import tensor  # imported here: host chunks never need it

    return tensor.to_device(rows.astype(np.int64, copy=False), device, staged=True)
