"""The streaming loader: Parquet shards → transformed fixed-size batches in a ring of (pinned) slots → the device.

    loader = etl.Loader("data/raw", pipeline="pipelines/criteo.yaml", artifacts="artifacts/",
                        batch_size=65536, shuffle=True, seed=0, device="cuda", num_workers=2)
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:     # batch.label [B] f32, batch.dense [B, D] f32, batch.sparse [B, S] int32/int64
            ...
    state = loader.state_dict()  # exact position, a few numbers

How it works: ``etl.loader.order`` fixes which row-group pieces this rank reads, in which order. ``num_workers`` threads
read and transform the pieces (Parquet decoding and the numba kernels release the GIL), at most
``num_workers + prefetch`` ahead of the assembler. One assembler thread gathers their rows in order into shuffle
buffers of ``shuffle_buffer`` rows, permutes each buffer with a generator drawn from (seed, epoch, rank, buffer
number), cuts ``batch_size``-row batches (the remainder carries over across pieces and shards), copies each into a
free slot of ``etl.loader.ring.Ring`` and starts its host→device copy. The consumer waits only when no batch is ready.
Once a pass has handed its last piece to the workers, the next epoch's pass starts reading (its batches enter the
ring after this pass's last one), so an epoch does not begin with a wait for its first shuffle buffer.

With ``transform_on="device"`` the workers run only the host part of the pipeline (label check, decoding text into
keys) and the rest runs on the device right after each slot's copy, on the copy's side stream
(``etl.loader.device_stage``); the CPU then only reads and decodes. The batches are the same, bit for bit.

A batch's tensors live in a reused slot: they are valid until the next batch is requested (``.clone()`` to keep).
Every batch is a pure function of (files, seed, epoch, rank, world size, batch number), so ``state_dict`` is that
and resuming recomputes the order and skips ahead, re-reading at most one shuffle buffer.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from etl.loader.chunk import Chunk, Layout
from etl.loader.device_stage import DeviceStage
from etl.errors import EtlError, LoaderError
from etl.pipeline import Pipeline
from etl.preprocess import MANIFEST
from etl.io.parquet import batch_from_arrow, list_shards, read_rows
from etl.loader.ring import Ring
from etl.loader.order import Piece, batches_per_rank, epoch_rng, rank_pieces, row_groups


@dataclass
class LoaderBatch:
    """One batch: ``label`` [B] float32, ``dense`` [B, D] float32, ``sparse`` [B, S] ids (columns in the order of
    ``Loader.layout``), ``lists``: multi-hot columns as (values, offsets[B + 1]), ``sparse_names`` their names."""

    label: torch.Tensor
    dense: torch.Tensor
    sparse: torch.Tensor
    lists: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    sparse_names: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return self.label.shape[0]

    def to_kjt(self) -> Any:
        """The sparse and list columns as a TorchRec ``KeyedJaggedTensor`` (keys: sparse columns, then lists;
        values key-major). Needs torchrec installed."""
        try:
            from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
        except ImportError as e:
            raise ImportError("LoaderBatch.to_kjt needs torchrec (pip install torchrec)") from e
        ids = self.sparse.long()
        values = [ids.t().reshape(-1)] + [v.long() for v, _ in self.lists.values()]
        lengths = [torch.ones(ids.numel(), dtype=torch.int32, device=ids.device)]
        lengths += [(o[1:] - o[:-1]).to(torch.int32) for _, o in self.lists.values()]
        return KeyedJaggedTensor.from_lengths_sync(keys=self.sparse_names + list(self.lists), values=torch.cat(values), lengths=torch.cat(lengths))


@dataclass
class LoaderStats:
    """Seconds spent per stage (summed over threads) and how long the consumer waited in ``next()``."""

    batches: int = 0
    rows: int = 0
    wait_seconds: float = 0.0
    consumer_seconds: float = 0.0  # from the first next() to the last batch returned
    read_seconds: float = 0.0
    transform_seconds: float = 0.0
    assemble_seconds: float = 0.0
    copy_seconds: float = 0.0  # host→device copy, and the device transform's launch with transform_on="device"

    @property
    def data_wait_fraction(self) -> float:
        """Share of the consumer's time spent waiting for data."""
        return self.wait_seconds / self.consumer_seconds if self.consumer_seconds > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"data_wait_fraction": self.data_wait_fraction}


class Loader:
    """Iterate over Parquet shards as transformed batches on ``device``. See the module docstring.

    ``source``: raw shards (a directory or files; needs ``pipeline``, and ``artifacts`` unless every op is
    fit-free) or the output directory of ``etl preprocess`` (detected by its manifest.json; read as is).
    ``rank``/``world_size`` default to ``torch.distributed`` when it is initialised, else 0/1.
    ``transform_on``: ``"host"`` (worker threads run the whole pipeline) or ``"device"`` (they run only its host
    part; the rest runs on ``device`` after the copy, with the torch backend; raw shards only)."""

    def __init__(
        self,
        source: str | Path | list[str | Path],
        pipeline: str | Path | None = None,
        artifacts: str | Path | None = None,
        *,
        batch_size: int = 65536,
        shuffle: bool = False,
        seed: int = 0,
        shuffle_buffer: int | None = None,
        drop_last: bool = False,
        device: str | torch.device = "cpu",
        num_workers: int = 2,
        prefetch: int = 4,
        rank: int | None = None,
        world_size: int | None = None,
        transform_on: str = "host",
    ):
        if batch_size < 1 or num_workers < 1 or prefetch < 1:
            raise ValueError("batch_size, num_workers and prefetch must be >= 1")
        if transform_on not in ("host", "device"):
            raise ValueError(f"transform_on must be 'host' or 'device', got {transform_on!r}")
        self.pipeline, self.processed, shards = _open_source(source, pipeline, artifacts)
        if transform_on == "device" and self.processed:
            raise ValueError("transform_on='device' transforms raw shards; this source is already transformed")
        self.layout = Layout.of(self.pipeline)
        self.groups = row_groups(shards)
        self._group_no = {g: i for i, g in enumerate(self.groups)}
        self.stage = DeviceStage(self.pipeline, self.layout, self.groups) if transform_on == "device" else None
        self.total_rows = sum(g.num_rows for g in self.groups)
        if rank is None and world_size is None:
            dist = torch.distributed.is_available() and torch.distributed.is_initialized()
            rank, world_size = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if dist else (0, 1)
        if rank is None or world_size is None or world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank and world_size must be given together with 0 <= rank < world_size, got {rank}, {world_size}")
        self.rank, self.world_size = rank, world_size
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, seed, drop_last
        self.shuffle_buffer = max(shuffle_buffer or 4 * batch_size, 1)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: torch {torch.__version__} sees no CUDA device")
        self.num_workers, self.prefetch = num_workers, prefetch
        self.epoch, self.position = 0, 0
        self._finished = False  # the last pass ran to its end: the next iteration starts the epoch over
        self.stats = LoaderStats()
        self._stats_lock = threading.Lock()
        self._ring: Ring | None = None
        self._active: weakref.ref | None = None
        self._ahead: _Epoch | None = None  # epoch + 1, started while the current pass drains

    # ------------------------------------------------------------------ public
    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        return batches_per_rank(self.total_rows, self.world_size, self.batch_size, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration yields. Setting the current epoch keeps the position, so a loop
        that resumed with ``load_state_dict`` may call it as usual."""
        if epoch != self.epoch:
            self._close_active()
            if self._ahead is not None and self._ahead.epoch != epoch:
                self._close_ahead()
            self.epoch, self.position, self._finished = epoch, 0, False

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "rank": self.rank,
                "world_size": self.world_size, "batch_size": self.batch_size, "shuffle": self.shuffle,
                "shuffle_buffer": self.shuffle_buffer, "drop_last": self.drop_last, "total_rows": self.total_rows}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where the loader that produced ``state`` stopped (same data and settings)."""
        mine = self.state_dict()
        for k in ("seed", "rank", "world_size", "batch_size", "shuffle", "shuffle_buffer", "drop_last", "total_rows"):
            if state[k] != mine[k]:
                raise ValueError(f"state_dict mismatch on {k}: saved {state[k]!r}, this loader {mine[k]!r}")
        self.close()
        self.epoch, self.position, self._finished = int(state["epoch"]), int(state["position"]), False

    def __iter__(self) -> _Epoch:
        """Yield the rest of the current epoch (all of it when the previous pass ran to its end).

        Once a pass has handed all its pieces to the workers, the next epoch's pass starts in the background (its
        batches enter the ring only after this pass's last one), so that its first batches are ready when the
        training loop calls ``set_epoch(epoch + 1)`` and iterates again (any other next pass discards it)."""
        self._close_active()
        if self._finished:
            self.position, self._finished = 0, False
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.epoch == self.epoch and self.position == 0:
            it = ahead
        else:
            if ahead is not None:
                ahead.close()
            self._ring = self._ring or self._new_ring()
            self._ring.reclaim()  # slots a previous, abandoned pass still counted as taken
            it = _Epoch(self, self.epoch, self.position)
        self._active = weakref.ref(it)
        return it

    def _new_ring(self) -> Ring:
        """Slots for the batch fields, or, with device placement, for the device stage's inputs and outputs."""
        if self.stage is not None:
            return Ring(self.prefetch + 2, self.batch_size, self.stage.inputs.fields(), self.device, self.stage.outputs())
        return Ring(self.prefetch + 2, self.batch_size, self.layout.batch_fields(), self.device)

    def close(self) -> None:
        """Stop the background threads of the current iteration and of the next epoch's, if any (also done on
        break + garbage collection)."""
        self._close_active()
        self._close_ahead()

    def _close_active(self) -> None:
        it = self._active() if self._active is not None else None
        if it is not None:
            it.close()
        self._active = None

    def _close_ahead(self) -> None:
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None

    def _start_ahead(self, epoch: int, after: threading.Event) -> None:
        """Start epoch ``epoch`` from its beginning; its batches take ring slots once ``after`` is set (the
        current pass queued its last batch or was closed)."""
        if self._ahead is None:
            self._ahead = _Epoch(self, epoch, 0, after)

    # ------------------------------------------------------------------ work done by the threads
    def _read_piece(self, piece: Piece) -> Chunk:
        g = piece.group
        t0 = time.perf_counter()
        columns = self.layout.columns if self.processed else self.pipeline.schema.names
        table = read_rows(g.path, columns, g.first_row + piece.start, piece.length, g.index)
        t1 = time.perf_counter()
        if self.processed:
            chunk = Chunk.from_table(table, self.layout)
        else:
            batch = batch_from_arrow(table, self.pipeline.schema, str(g.path), g.index, g.first_row + piece.start)
            if self.stage is not None:
                host = self.pipeline.transform(batch, part="host").batch
                chunk = self.stage.inputs.chunk(host, self._group_no[g], g.first_row)
            else:
                chunk = Chunk.from_batch(self.pipeline.transform(batch).batch, self.layout)
        t2 = time.perf_counter()
        with self._stats_lock:
            self.stats.read_seconds += t1 - t0
            self.stats.transform_seconds += t2 - t1
        return chunk


def _open_source(source, pipeline, artifacts) -> tuple[Pipeline, bool, list[Path]]:
    items = source if isinstance(source, list) else [source]
    if len(items) == 1 and (Path(items[0]) / MANIFEST).is_file():
        out = Path(items[0])
        manifest = json.loads((out / MANIFEST).read_text())
        return Pipeline.load(out / "artifacts"), True, [out / f["output"] for f in manifest["files"]]
    if pipeline is None:
        raise ValueError("raw shards need a pipeline (or give the output directory of etl preprocess)")
    p = Pipeline.load(artifacts) if artifacts is not None else Pipeline.from_file(pipeline)
    if artifacts is not None and p.doc != Pipeline.from_file(pipeline).doc:
        raise ValueError(f"{artifacts}: these artifacts were fitted with another pipeline than {pipeline}")
    if not p.is_fitted:
        raise ValueError(f"{pipeline} has ops to fit: run `etl fit` and pass artifacts=")
    return p, False, list_shards([Path(i) for i in items])


class _Epoch:
    """One pass over the loader's epoch from its current position; owns the background threads."""

    def __init__(self, loader: Loader, epoch: int, start: int, after: threading.Event | None = None):
        self.loader, self.epoch = loader, epoch
        self.total = len(loader)
        self.all_submitted = threading.Event()  # every piece went to the workers: the next epoch may start reading
        self.assembled = threading.Event()  # the pass takes no more ring slots: last batch queued, or closed
        self.held: int | None = None
        self.first_next: float | None = None
        self.ready: queue.Queue = queue.Queue(maxsize=loader.prefetch + 1)
        self.stop = threading.Event()
        self.pool = ThreadPoolExecutor(loader.num_workers, thread_name_prefix="etl-loader")
        args = (loader, epoch, start, self.ready, self.stop, self.pool, self.all_submitted, self.assembled, after)
        self.thread = threading.Thread(target=_assemble, args=args, daemon=True, name="etl-assembler")
        self.thread.start()
        self._finalizer = weakref.finalize(self, _shutdown, self.stop, self.pool, self.thread)

    def __iter__(self) -> _Epoch:
        return self

    def __next__(self) -> LoaderBatch:
        loader, ring = self.loader, self.loader._ring
        if self.held is not None:
            ring.release(self.held)
            self.held = None
        if loader.position >= self.total:
            self.close()
            loader._finished = True
            if self._is_active():
                loader._start_ahead(self.epoch + 1, self.assembled)  # if not started yet
            raise StopIteration
        t0 = time.perf_counter()
        self.first_next = self.first_next or t0
        while True:
            try:
                item = self.ready.get(timeout=0.1)
                break
            except queue.Empty:
                if not self.thread.is_alive():
                    raise LoaderError("the loader's assembler thread stopped without a batch or an error") from None
        t1 = time.perf_counter()
        if isinstance(item, BaseException):
            self.close()
            if self._is_active():
                loader._close_ahead()  # an error ends the run: no next epoch in the background
            raise item
        if self.all_submitted.is_set() and self._is_active():
            loader._start_ahead(self.epoch + 1, self.assembled)
        slot, n, lists = item
        tensors = ring.view(slot, n)
        self.held = slot
        loader.position += 1
        s = loader.stats
        s.wait_seconds += t1 - t0
        s.batches += 1
        s.rows += n
        s.consumer_seconds = time.perf_counter() - self.first_next
        lists = {k: (v.to(loader.device, non_blocking=True), o.to(loader.device, non_blocking=True)) for k, (v, o) in lists.items()}
        if loader.stage is not None and loader.device.type == "cuda":
            for t in (t for pair in lists.values() for t in pair):  # made on the copy stream, used on the consumer's
                t.record_stream(torch.cuda.current_stream(loader.device))
        return LoaderBatch(tensors["label"], tensors["dense"], tensors["sparse"], lists, loader.layout.sparse)

    def _is_active(self) -> bool:
        """Whether this is the loader's current pass (not the next epoch's, prepared in the background)."""
        return self.loader._active is not None and self.loader._active() is self

    def close(self) -> None:
        """Stop the threads, then give back the slot in use and the slots of batches never taken."""
        self._finalizer()
        self.assembled.set()
        ring = self.loader._ring
        if self.held is not None:
            ring.release(self.held)
            self.held = None
        while not self.ready.empty():
            item = self.ready.get_nowait()
            if isinstance(item, tuple):
                ring.release(item[0])


def _shutdown(stop: threading.Event, pool: ThreadPoolExecutor, thread: threading.Thread) -> None:
    stop.set()
    pool.shutdown(wait=False, cancel_futures=True)
    if thread is not threading.current_thread():
        thread.join()


def _assemble(loader: Loader, epoch: int, start: int, ready: queue.Queue, stop: threading.Event, pool: ThreadPoolExecutor,
              all_submitted: threading.Event, assembled: threading.Event, after: threading.Event | None) -> None:  # fmt: skip
    """The assembler thread: pieces (read and transformed by the pool) → shuffle buffers → batches → ring."""
    try:
        if _assemble_batches(loader, epoch, start, ready, stop, pool, all_submitted, after):
            assembled.set()
    except BaseException as e:  # noqa: BLE001 - handed to the consumer
        _put(ready, e, stop)


def _put(q: queue.Queue, item: object, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False


def _assemble_batches(loader: Loader, epoch: int, start: int, ready: queue.Queue, stop: threading.Event, pool: ThreadPoolExecutor,
                      all_submitted: threading.Event, after: threading.Event | None) -> bool:  # fmt: skip
    """Queue the batches of ``epoch`` from batch number ``start`` on; True once the last one is queued. Sets
    ``all_submitted`` once every piece went to the workers; takes ring slots only once ``after`` (if given) is set.

    Each full shuffle buffer is concatenated once and given its permutation; a batch is then gathered straight
    from the buffer(s) into a ring slot (one copy per row)."""
    B, S, total = loader.batch_size, loader.shuffle_buffer, len(loader)
    first_row = start * B  # rank-local row where the next batch starts
    buffer_no = first_row // S
    skip = first_row - buffer_no * S  # rows of the first buffer already consumed before the resume point
    pieces = _pieces_from(rank_pieces(loader.groups, seed=loader.seed, epoch=epoch, shuffle=loader.shuffle,
                                      rank=loader.rank, world_size=loader.world_size), buffer_no * S)  # fmt: skip

    def submit(p: Piece) -> Future:
        return pool.submit(_guarded, loader, p)

    window: deque[Future] = deque(submit(p) for p in pieces[: loader.num_workers + loader.prefetch])
    upcoming = iter(pieces[len(window) :])
    filling: list[Chunk] = []
    filled = 0
    stream: deque[tuple[Chunk, np.ndarray]] = deque()  # buffers and the order of their rows not yet emitted
    emitted = start
    stage = loader.stage
    empty = stage.inputs.empty() if stage is not None else loader.layout.empty()  # the batch a shorter rank may owe

    def flush() -> None:
        nonlocal buffer_no, filling, filled, skip
        buf = Chunk.concat(filling)
        order = np.arange(buf.n)
        if loader.shuffle:
            order = epoch_rng(loader.seed, epoch, loader.rank, buffer_no).permutation(buf.n)
        stream.append((buf, order[skip:]))
        skip = 0
        buffer_no += 1
        filling, filled = [], 0

    def emit(n: int) -> bool:
        nonlocal emitted
        t0 = time.perf_counter()
        parts, need = [], n
        while need:
            buf, order = stream[0]
            take = min(need, len(order))
            parts.append((buf, order[:take]))
            need -= take
            if take == len(order):
                stream.popleft()
            else:
                stream[0] = (buf, order[take:])
        while after is not None and not after.wait(0.05):
            if stop.is_set():
                return False
        slot = loader._ring.acquire(stop)
        if slot is None:
            return False
        row = 0
        views = loader._ring.write(slot, n)
        for buf, rows in parts:
            for name, view in views.items():
                np.take(buf.fixed[name], rows, axis=0, out=view[row : row + len(rows)], mode="clip")  # in range: clip skips a buffered copy
            row += len(rows)
        columns = Chunk.concat([buf.take_lists(rows) for buf, rows in parts]).lists if parts else empty.lists
        t1 = time.perf_counter()
        if stage is not None:
            origin = np.concatenate([buf.fixed["origin"][rows] for buf, rows in parts]) if parts else empty.fixed["origin"]
            lists = loader._ring.ship(slot, n, lambda inputs, out: stage.run(inputs, out, columns, origin))
        else:
            loader._ring.ship(slot, n)
            lists = {k: (torch.from_numpy(c.values), torch.from_numpy(c.offsets)) for k, c in columns.items()}
        loader.stats.assemble_seconds += t1 - t0
        loader.stats.copy_seconds += time.perf_counter() - t1
        emitted += 1
        return _put(ready, (slot, n, lists), stop)

    def available() -> int:
        return sum(len(order) for _, order in stream)

    while window and not stop.is_set() and emitted < total:
        chunk = window.popleft().result()
        nxt = next(upcoming, None)
        if nxt is not None:
            window.append(submit(nxt))
        else:
            all_submitted.set()
        t0 = time.perf_counter()
        while chunk.n:
            take = min(chunk.n, S - filled)
            filling.append(chunk.slice(0, take))
            filled += take
            chunk = chunk.slice(take, chunk.n)
            if filled == S:
                flush()
        loader.stats.assemble_seconds += time.perf_counter() - t0
        while emitted < total and available() >= B:
            if not emit(B):
                return False
    if stop.is_set():
        return False
    all_submitted.set()
    if filled:
        flush()
    while emitted < total:  # the final partial batch, and the empty batch a shorter rank may owe
        if not emit(min(B, available())):
            return False
    return True


def _pieces_from(pieces: list[Piece], start_row: int) -> list[Piece]:
    """The pieces from rank-local row ``start_row`` on (the first one cut)."""
    out, pos = [], 0
    for p in pieces:
        if pos + p.length > start_row:
            cut = max(0, start_row - pos)
            out.append(Piece(p.group, p.start + cut, p.length - cut))
        pos += p.length
    return out


def _guarded(loader: Loader, piece: Piece) -> Chunk:
    """Read and transform one piece; an unexpected failure is wrapped with the piece it happened on."""
    try:
        return loader._read_piece(piece)
    except EtlError:
        raise  # already names file, row group and column
    except Exception as e:  # noqa: BLE001 - re-raised with context
        g = piece.group
        raise LoaderError(f"{g.path}, row group {g.index}, rows {piece.start}..{piece.start + piece.length}: {type(e).__name__}: {e}") from e
