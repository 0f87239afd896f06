"""The assembler: one pass's pieces → shuffle buffers → fixed-size batches in ring slots.

The pieces of the pass (``etl.loader.order.rank_pieces``) go to a pool of reader threads, at most ``read_ahead``
of them ahead of the one being assembled, and come back in order. Their rows fill shuffle buffers of
``shuffle_buffer`` rows; each full buffer (a ``ChunkRun``: its chunks are not concatenated) is given its order:
a permutation drawn from (seed, epoch, rank, buffer number) with shuffle, else its rows as they are. Batches of
``batch_size`` rows are cut from that row stream (the remainder carries over across pieces and shards) and
gathered straight from the buffers' chunks into a free ring slot, one copy per row; the slot's host→device copy
starts at once and the batch is queued for the consumer as an ``Item``. After the last piece come the final partial
batch and, on a rank whose slice is one row shorter, the empty batch it owes (``etl.loader.order.batches_per_rank``).
Chunks read into device memory (``etl.loader.device_columns``) are gathered on the device, on the ring's copy
stream, straight into the slot's device inputs: no host copy of their rows.

A pass that starts at batch ``start`` > 0 (a resume) begins with the shuffle buffer holding that batch's first
row, drops the rows before it, and re-reads at most that one buffer.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Hashable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from etl.batch import Column
from etl.errors import EtlError, LoaderError, RowError
from etl.loader.chunk import Chunk, ChunkRun
from etl.loader.device_stage import DeviceStage, PendingCheck
from etl.loader.order import Piece, RowGroup, epoch_rng, rank_pieces
from etl.loader.ring import Ring
from etl.loader.sequences import Padding, pad_into
from etl.loader.stats import LoaderStats
from etl.loader.stream_state import StreamPass
from etl.ops.stream import Carried, RowRejected


@dataclass(frozen=True)
class PassSettings:
    """Which batches a pass makes: batches ``start`` to ``total`` (exclusive) of ``epoch`` on rank ``rank`` of
    ``world_size``, ``batch_size`` rows each, rows permuted within buffers of ``shuffle_buffer`` rows when
    ``shuffle`` (the permutations and the piece order drawn from ``seed``); ``padding``: the list columns each
    batch also gives padded, in their ring fields (``etl.loader.sequences``)."""

    epoch: int
    start: int
    total: int
    batch_size: int
    shuffle_buffer: int
    shuffle: bool
    seed: int
    rank: int
    world_size: int
    padding: tuple[Padding, ...] = ()


class Item(NamedTuple):
    """One batch as the assembler hands it over."""

    slot: int  #: the ring slot holding its fixed-width columns
    rows: int
    lists: dict[str, tuple[torch.Tensor, torch.Tensor]]  #: list columns as (values, offsets)
    check: PendingCheck | None  #: the non-finite checks the consumer examines before using it (device placement)
    events: dict[str, Any]  #: the streaming states' events by state (``etl.loader.stream_state``); empty without


class Assembler:
    """Makes the batches of one pass (see the module docstring): ``batches`` yields them, ``run`` (the body of a
    pass's assembler thread) queues them.

    ``read`` turns a piece into a chunk on the ``pool``'s threads (an ``InlineExecutor`` reads in the thread
    that asks for the batches). ``all_submitted`` is set once every piece went to the pool; ring slots are taken
    only once ``after`` (if given) is set; ``stop`` ends the pass early. With a device ``stage`` the chunks hold
    the stage's inputs and each slot is transformed on the device after its copy. ``empty``: a chunk of no rows
    of the chunks' kind (the batch a shorter rank may owe). ``streams``: the pass's use of the loader's streaming
    states, which give values to each batch's rows as it is gathered into its slot (``etl.loader.stream_state``)."""

    def __init__(self, settings: PassSettings, groups: list[RowGroup], read: Callable[[Piece], Chunk], pool: Executor,
                 ring: Ring, stats: LoaderStats, *, read_ahead: int, stop: threading.Event,
                 all_submitted: threading.Event, after: threading.Event | None = None, stage: DeviceStage | None = None,
                 empty: Chunk, streams: StreamPass | None = None) -> None:  # fmt: skip
        self.settings, self.groups, self.read, self.pool = settings, groups, read, pool
        self.ring, self.stats, self.read_ahead = ring, stats, read_ahead
        self.stop, self.all_submitted, self.after = stop, all_submitted, after
        self.stage, self.empty, self.streams = stage, empty, streams
        first_row = settings.start * settings.batch_size  # rank-local row where the first batch starts
        self.buffer_no = first_row // settings.shuffle_buffer
        self.skip = first_row - self.buffer_no * settings.shuffle_buffer  # rows of the first buffer to drop
        self.filling: list[Chunk] = []  # the buffer being filled
        self.filled = 0
        self.stream: deque[tuple[ChunkRun, np.ndarray]] = deque()  # full buffers and the order of their rows not yet emitted
        self.emitted = settings.start

    def run(self, ready: queue.Queue) -> bool:
        """Queue the pass's batches on ``ready``; True once the last one is queued, False if the pass was stopped
        or failed (the exception is queued in place of the next batch)."""
        try:
            for item in self.batches():
                if not _put(ready, item, self.stop):
                    return False
            return not self.stop.is_set()
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            _put(ready, e, self.stop)
            return False

    def batches(self) -> Generator[Item, None, None]:
        """The pass's batches, in order; ends early once ``stop`` is set."""
        s = self.settings
        pieces = pieces_from(rank_pieces(self.groups, seed=s.seed, epoch=s.epoch, shuffle=s.shuffle, rank=s.rank,
                                          world_size=s.world_size), self.buffer_no * s.shuffle_buffer)  # fmt: skip
        window: deque[Future] = deque(self.pool.submit(self.read, p) for p in pieces[: self.read_ahead])
        upcoming = iter(pieces[len(window) :])
        while window and not self.stop.is_set() and self.emitted < s.total:
            chunk = window.popleft().result()
            nxt = next(upcoming, None)
            if nxt is not None:
                window.append(self.pool.submit(self.read, nxt))
            else:
                self.all_submitted.set()
            self._buffer(chunk)
            while self.emitted < s.total and self._available() >= s.batch_size:
                if (item := self._emit(s.batch_size)) is None:
                    return
                yield item
        if self.stop.is_set():
            return
        self.all_submitted.set()
        if self.filled:
            self._flush()
        while self.emitted < s.total:  # the final partial batch, and the empty batch a shorter rank may owe
            if (item := self._emit(min(s.batch_size, self._available()))) is None:
                return
            yield item

    def _buffer(self, chunk: Chunk) -> None:
        """Append the chunk's rows to the shuffle buffers, flushing each one that fills up."""
        t0 = time.perf_counter()
        size = self.settings.shuffle_buffer
        while chunk.n:
            take = min(chunk.n, size - self.filled)
            self.filling.append(chunk.slice(0, take))
            self.filled += take
            chunk = chunk.slice(take, chunk.n)
            if self.filled == size:
                self._flush()
        self.stats.add_assemble(time.perf_counter() - t0)

    def _flush(self) -> None:
        """Close the buffer being filled: append it to the stream with its order."""
        s = self.settings
        buf = ChunkRun(self.filling)
        order = np.arange(buf.n)
        if s.shuffle:
            order = epoch_rng(s.seed, s.epoch, s.rank, self.buffer_no).permutation(buf.n)
        self.stream.append((buf, order[self.skip :]))
        self.skip = 0
        self.buffer_no += 1
        self.filling, self.filled = [], 0

    def _available(self) -> int:
        return sum(len(order) for _, order in self.stream)

    def _take(self, n: int) -> list[tuple[ChunkRun, np.ndarray]]:
        """The next ``n`` rows of the stream, as (buffer, rows of it) parts."""
        parts, need = [], n
        while need:
            buf, order = self.stream[0]
            take = min(need, len(order))
            parts.append((buf, order[:take]))
            need -= take
            if take == len(order):
                self.stream.popleft()
            else:
                self.stream[0] = (buf, order[take:])
        return parts

    def _emit(self, n: int) -> Item | None:
        """Gather the next ``n`` rows into a ring slot and start its copy; None if stopped first."""
        t0 = time.perf_counter()
        parts = self._take(n)
        events: dict[str, Any] = {}
        while self.after is not None and not self.after.wait(0.05):
            if self.stop.is_set():
                return None
        slot = self.ring.acquire(self.stop)
        if slot is None:
            return None
        columns = Chunk.concat([buf.lists.take_lists(rows) for buf, rows in parts]).lists if parts else self.empty.lists
        stage, check = self.stage, None
        if stage is not None and parts and parts[0][0].on_device:  # rows read into device memory: gathered there
            t1 = t0
            lists, check = self.ring.ship(slot, n, lambda inputs, out: stage.run(inputs, out, columns, _gather_tensors(parts, inputs)), copy=False)
        else:
            row = 0
            views = self.ring.write(slot, n)
            padded = {p.field for p in self.settings.padding}  # filled from the lists below, not gathered
            inputs = self.streams.new_inputs(n) if self.streams is not None else {}
            for buf, rows in parts:
                part = slice(row, row + len(rows))
                buf.gather(rows, {name: view[part] for name, view in views.items() if name not in padded},
                           {c: Carried(v[part], ok[part]) for c, (v, ok) in inputs.items()})  # fmt: skip
                row += len(rows)
            if self.streams is not None:  # the batch's streamed values, in its row order, before its copy starts
                streamed: dict[str, Column] = {}
                try:
                    events = self.streams.apply(inputs, views, streamed)
                except RowRejected as e:
                    raise _row_error(e, parts) from None
                if streamed:  # the states' list columns, in place of the empty ones the rows came with
                    columns = columns | {k: Column(c.array.astype(columns[k].array.dtype), None, c.offsets) for k, c in streamed.items()}
            for p in self.settings.padding:
                pad_into(columns[p.column].array, columns[p.column].list_offsets, views[p.field], p.side)
            t1 = time.perf_counter()
            if stage is not None:
                origin = np.concatenate([buf.take_fixed("origin", rows) for buf, rows in parts]) if parts else self.empty.fixed["origin"]
                lists, check = self.ring.ship(slot, n, lambda inputs, out: stage.run(inputs, out, columns, origin))
            else:
                self.ring.ship(slot, n)
                lists = {k: (torch.from_numpy(c.values), torch.from_numpy(c.offsets)) for k, c in columns.items()}
        self.stats.add_assemble(t1 - t0, time.perf_counter() - t1)
        self.emitted += 1
        if self.streams is not None:
            self.streams.name_step(self._position_key())
        return Item(slot, n, lists, check, events)

    def _position_key(self) -> Hashable:
        """Where the streaming states' state after the batches emitted so far is kept (``etl.loader.stream_state``)."""
        return self.settings.epoch, self.emitted


def _row_error(e: RowRejected, parts: list[tuple[ChunkRun, np.ndarray]]) -> EtlError:
    """The ``RowError`` naming the file, row group and row of the batch row a streaming state refused (a
    ``LoaderError`` naming its batch row when its origin is not known)."""
    row = e.row
    for buf, rows in parts:
        if row < len(rows):
            where = buf.row_origin(int(rows[row]))
            if where is not None:
                return RowError(where[0], where[1], where[2], e.column, e.problem)
            break
        row -= len(rows)
    return LoaderError(f"row {e.row} of a batch, column '{e.column}': {e.problem}")


def _gather_tensors(parts: list[tuple[ChunkRun, np.ndarray]], inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Gather the rows of ``parts`` (buffers of device chunks) into the slot's device ``inputs``, in order, on the
    current stream; returns their ``origin``s (a tensor on the device)."""
    row, origins = 0, []
    for buf, rows in parts:
        buf.gather_tensors(rows, {name: t[row : row + len(rows)] for name, t in inputs.items()})
        origins.append(buf.take_fixed("origin", rows))
        row += len(rows)
    return torch.cat(origins)


class InlineExecutor(Executor):
    """An executor that runs each task at once, in the thread that submits it (a loader without worker threads)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - raised by result(), as from a worker thread
            future.set_exception(e)
        return future


def _put(q: queue.Queue, item: object, stop: threading.Event) -> bool:
    """Put ``item`` on ``q``, waiting for room; False if ``stop`` was set first."""
    while not stop.is_set():
        try:
            q.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False


def pieces_from(pieces: list[Piece], start_row: int) -> list[Piece]:
    """The pieces from rank-local row ``start_row`` on (the first one cut)."""
    out, pos = [], 0
    for p in pieces:
        if pos + p.length > start_row:
            cut = max(0, start_row - pos)
            out.append(Piece(p.group, p.start + cut, p.length - cut))
        pos += p.length
    return out
