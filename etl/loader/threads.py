"""The default engine (``Loader(engine="default")``): worker threads read and transform a source's pieces into a
ring of (pinned) slots, and the consumer's iteration (``Iteration``) turns each slot into a ``LoaderBatch``.

``ThreadEngine`` owns what outlives a pass: the ring (made on first use), the consumer's current iteration, and the
next epoch's pass, started once the current pass has handed its last piece to the workers (its batches enter the
ring after this pass's last one), so that an epoch does not begin with a wait for its first shuffle buffer. The
passes themselves come from the loader's source (``etl.loader.sources``).
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from etl.loader.batch import LoaderBatch
from etl.loader.chunk import Chunk
from etl.loader.order import Piece
from etl.loader.pieces import guarded
from etl.loader.ring import Field, Ring
from etl.loader.sources import Pass, Workers

if TYPE_CHECKING:
    from etl.loader.api import Loader


class ThreadEngine:
    """Passes of worker threads over the loader's source (see the module docstring)."""

    def __init__(self, reader: Callable[[Piece], Chunk]) -> None:
        self.reader = reader  # the source's: piece → chunk
        self.ring: Ring | None = None
        self.active: weakref.ref[Iteration] | None = None
        self.ahead: Pass | None = None  # epoch + 1, started while the current pass drains

    def iterate(self, loader: Loader) -> Iteration:
        """Yield the rest of the loader's current epoch (all of it when the previous pass ran to its end); a
        prepared pass of that epoch is taken when the position is its start, any other is discarded."""
        self.close_active()
        loader._commit_vocabularies()
        if loader._finished:
            loader.position, loader._finished = 0, False
        ahead, self.ahead = self.ahead, None
        if ahead is not None and ahead.epoch == loader.epoch and loader.position == 0:
            epoch_pass = ahead
        else:
            if ahead is not None:
                ahead.close()
            self.slots(loader).reclaim()  # slots a previous, abandoned pass still counted as taken
            epoch_pass = self.new_pass(loader, loader.epoch, loader.position)
        it = Iteration(loader, self, epoch_pass)
        self.active = weakref.ref(it)
        return it

    def set_epoch(self, loader: Loader, epoch: int) -> None:
        """The loader moves to ``epoch``: end the current iteration; keep the prepared pass only if it is that epoch's."""
        self.close_active()
        loader._commit_vocabularies()
        if self.ahead is not None and self.ahead.epoch != epoch:
            self.close_ahead()

    def close(self) -> None:
        """Stop the current iteration's pass and the next epoch's."""
        self.close_active()
        self.close_ahead()

    def slots(self, loader: Loader) -> Ring:
        """The ring, made on first use: slots for the batch fields, or, with device placement, for the device
        stage's inputs and outputs."""
        if self.ring is None:
            stage = loader.source.stage
            if stage is not None:
                self.ring = Ring(loader.prefetch + 2, loader.batch_size, stage.inputs.fields(), loader.device, stage.outputs())
            else:
                padded = [Field(p.field, (p.pad_to,), loader.layout.sparse_dtype) for p in loader.batching.padding]
                self.ring = Ring(loader.prefetch + 2, loader.batch_size, loader.layout.batch_fields() + padded, loader.device)
        return self.ring

    def new_pass(self, loader: Loader, epoch: int, start: int, after: threading.Event | None = None) -> Pass:
        """A pass over ``epoch`` from batch ``start`` on; it takes ring slots once ``after`` (if given) is set."""
        streams = None
        if loader.streams is not None:
            key = loader.source.vocab_key(loader.batching, epoch, start)
            streams = loader.streams.start_pass(key, start == 0 and loader.source.epochs, loader.stats)
        workers = Workers(guarded(_read_weakly(self)), self.slots(loader), loader.stats, loader.num_workers, loader.prefetch, loader.remote)
        return loader.source.new_pass(loader.batching, epoch, start, workers, after=after, streams=streams)

    def start_ahead(self, loader: Loader, epoch: int, after: threading.Event) -> None:
        """Start epoch ``epoch`` from its beginning; its batches take ring slots once ``after`` is set (the
        current pass queued its last batch or was closed). Nothing runs in the background without worker threads,
        nor with streaming states (a pass must start from the state the one before it ends with)."""
        if self.ahead is None and loader.num_workers > 0 and loader.streams is None:
            self.ahead = self.new_pass(loader, epoch, 0, after)

    def close_active(self) -> None:
        it = self.active() if self.active is not None else None
        if it is not None:
            it.close()
        self.active = None

    def close_ahead(self) -> None:
        if self.ahead is not None:
            self.ahead.close()
            self.ahead = None


    def read(self, piece: Piece) -> Chunk:
        """Read and transform one piece: what the workers of every pass call."""
        return self.reader(piece)


def _read_weakly(engine: ThreadEngine) -> Callable[[Piece], Chunk]:
    """``engine.read`` called through a weak proxy of ``engine``. A pass's threads must hold no reference to the
    engine (nor to its loader): none that keeps it alive, and none whose release on a worker thread frees it there
    (its passes' shutdown would then wait for that very thread)."""
    return functools.partial(type(engine).read, weakref.proxy(engine))


class Iteration:
    """The consumer's side of one pass: counts the loader's position, turns each ring slot into a ``LoaderBatch``,
    and starts the next epoch's pass once this one has submitted all its pieces."""

    def __init__(self, loader: Loader, engine: ThreadEngine, epoch_pass: Pass):
        self.loader, self.engine, self.epoch_pass = loader, engine, epoch_pass
        self.last: float | None = None  # when the previous batch was returned (or the first next() began)

    def __iter__(self) -> Iteration:
        return self

    def __next__(self) -> LoaderBatch:
        loader, epoch_pass = self.loader, self.epoch_pass
        epoch_pass.release()
        if loader.position >= epoch_pass.settings.total:
            self.close()
            loader._finished = True
            if self._is_active():
                self.engine.start_ahead(loader, epoch_pass.epoch + 1, epoch_pass.assembled)  # if not started yet
            raise StopIteration
        t0 = time.perf_counter()
        self.last = self.last or t0
        try:
            item = epoch_pass.take()
            if item is not None and item.check is not None:  # device placement: a NaN or ±inf found on the device is raised here
                item.check.raise_if_set()
        except Exception:
            epoch_pass.close()
            if self._is_active():
                self.engine.close_ahead()  # an error ends the run: no next epoch in the background
            raise
        if item is None:  # closed by another thread while this one waited: the loop ends here
            raise StopIteration
        t1 = time.perf_counter()
        if epoch_pass.all_submitted.is_set() and self._is_active():
            self.engine.start_ahead(loader, epoch_pass.epoch + 1, epoch_pass.assembled)
        n = item.rows
        tensors = epoch_pass.ring.view(item.slot, n)
        loader.position += 1
        if loader.streams is not None:
            loader.streams.prune(loader._vocab_here())
        now = time.perf_counter()
        loader.stats.add_batch(n, t1 - t0, now - self.last)
        self.last = now
        lists = {k: (v.to(loader.device, non_blocking=True), o.to(loader.device, non_blocking=True)) for k, (v, o) in item.lists.items()}
        if loader.stage is not None and loader.device.type == "cuda":
            for t in (t for pair in lists.values() for t in pair):  # made on the copy stream, used on the consumer's
                t.record_stream(torch.cuda.current_stream(loader.device))
        if loader.copy:  # owned tensors: the slot may take the next batch at once
            fields = ["label", "dense", "sparse", *(["lengths"] if loader.layout.lengths else []), *(p.field for p in loader.batching.padding)]
            tensors = {k: tensors[k].clone() for k in fields}
            epoch_pass.release()
        return LoaderBatch(tensors["label"], tensors["dense"], tensors["sparse"], lists, loader.layout.sparse, item.events,
                           lengths={c: tensors["lengths"][:, k] for k, c in enumerate(loader.layout.lengths)},
                           padded={p.column: tensors[p.field] for p in loader.batching.padding}, dense_names=loader.layout.dense)  # fmt: skip

    def _is_active(self) -> bool:
        """Whether this is the engine's current iteration (not superseded by a later ``iter``)."""
        return self.engine.active is not None and self.engine.active() is self

    def close(self) -> None:
        """Stop the pass and give back its ring slots."""
        self.epoch_pass.close()
