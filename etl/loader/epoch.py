"""One pass over an epoch: its threads, its queue of batches, the ring slots it holds, and their shutdown; or, for
a loader without worker threads, the same pass run in the consumer's thread (``InlinePass``)."""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from etl.errors import LoaderError
from etl.loader.assembler import Assembler, InlineExecutor, Item, PassSettings
from etl.loader.chunk import Chunk
from etl.loader.device_stage import DeviceStage
from etl.loader.order import Piece, RowGroup
from etl.loader.ring import Ring
from etl.loader.stats import LoaderStats
from etl.loader.stream_state import StreamPass


class EpochPass:
    """One pass: batches ``settings.start`` to ``settings.total`` of epoch ``settings.epoch``, made by an assembler
    thread (``etl.loader.assembler``) from pieces that a pool of ``num_workers`` threads reads with ``read``.

    The constructor starts the threads. The consumer calls ``take`` for each batch and ``release`` once done with
    it; ``close`` stops the threads and gives back every ring slot the pass still holds. A pass dropped without
    ``close`` stops its threads when it is garbage-collected: they hold no reference to it (nor to the loader).

    Events for whoever sequences passes: ``all_submitted``, set once every piece went to the workers (the next
    epoch may start reading), and ``assembled``, set once the pass takes no more ring slots (its last batch is
    queued, or it was closed). With ``after``, the pass takes ring slots only once that event is set.

    ``io_bound``: the pieces come from object storage, where a read mostly waits on requests: the pool then has one
    thread per piece in flight (``num_workers + prefetch``) instead of ``num_workers``, so the requests of every
    piece read ahead overlap (how many pieces are in flight, hence the memory they hold, does not change).
    ``streams``: the pass's use of the loader's streaming states, applied by the assembler thread
    (``etl.loader.stream_state``)."""

    def __init__(self, settings: PassSettings, groups: list[RowGroup], read: Callable[[Piece], Chunk], ring: Ring,
                 stats: LoaderStats, *, num_workers: int, prefetch: int, stage: DeviceStage | None = None, empty: Chunk,
                 after: threading.Event | None = None, io_bound: bool = False, streams: StreamPass | None = None) -> None:  # fmt: skip
        self.settings, self.epoch, self.ring = settings, settings.epoch, ring
        self.all_submitted = threading.Event()
        self.assembled = threading.Event()
        self.stop = threading.Event()
        self.ready: queue.Queue = queue.Queue(maxsize=prefetch + 1)
        self.pool = ThreadPoolExecutor(num_workers + prefetch if io_bound else num_workers, thread_name_prefix="etl-loader")
        assembler = Assembler(settings, groups, read, self.pool, ring, stats, read_ahead=num_workers + prefetch,
                              stop=self.stop, all_submitted=self.all_submitted, after=after, stage=stage, empty=empty,
                              streams=streams)  # fmt: skip
        self.thread = threading.Thread(target=assemble, args=(assembler, self.ready, self.assembled), daemon=True, name="etl-assembler")
        self.thread.start()
        self._slots = Slots(ring, self.ready)
        self._finalizer = weakref.finalize(self, shutdown, self.stop, self.pool, self.thread, self._slots, self.assembled)

    def take(self) -> Item | None:
        """The next batch, waiting for it: (ring slot, rows, list columns); None when the pass was closed (by
        another thread) before it came. The error that ended the pass is raised instead, once the pass is closed."""
        item = next_item(self.ready, self.thread, "assembler", self.stop)
        if item is None:
            return None
        if isinstance(item, BaseException):
            self.close()
            raise item
        self._slots.held = item[0]
        return item

    def release(self) -> None:
        """Give back the slot of the batch taken last: its tensors may be overwritten from now on."""
        self._slots.release_held()

    def close(self) -> None:
        """Stop the threads, give back the slot in use and the slots of batches never taken, then set
        ``assembled`` (a pass waiting to follow this one may take slots from now on)."""
        self._finalizer()


class Slots:
    """The ring slots a pass holds: the one handed to the consumer last (``held``) and those of the batches queued
    in ``ready`` but never taken. Kept apart from the pass so that its shutdown can give them back after the pass
    itself was garbage-collected."""

    def __init__(self, ring: Ring, ready: queue.Queue):
        self.ring, self.ready = ring, ready
        self.held: int | None = None

    def release_held(self) -> None:
        if self.held is not None:
            self.ring.release(self.held)
            self.held = None

    def release_all(self) -> None:
        self.release_held()
        while not self.ready.empty():
            item = self.ready.get_nowait()
            if isinstance(item, tuple):
                self.ring.release(item[0])


def next_item(ready: queue.Queue, thread: threading.Thread, name: str, stop: threading.Event) -> Any:
    """The next item (a batch or the exception that ended the pass) that a pass's ``thread`` queued on ``ready``,
    waiting for it as long as that thread lives; None once the pass is closed (``stop`` set, possibly by another
    thread while this one waits: noticed within 0.1 s); ``LoaderError`` when the thread ended without an item."""
    while not stop.is_set():
        try:
            return ready.get(timeout=0.1)
        except queue.Empty:
            if not thread.is_alive() and not stop.is_set():
                raise LoaderError(f"the loader's {name} thread stopped without a batch or an error") from None
    return None


def assemble(assembler: Assembler, ready: queue.Queue, assembled: threading.Event) -> None:
    """The assembler thread."""
    if assembler.run(ready):
        assembled.set()


class InlinePass:
    """A pass without threads (a loader with ``num_workers=0``): ``take`` reads, transforms and assembles the
    next batch in the calling thread, so it yields the batches of an ``EpochPass`` with one worker, in the same
    order, and a failure is raised by ``take`` itself. The same interface as ``EpochPass``; ``all_submitted`` and
    ``assembled`` are set as there."""

    def __init__(self, settings: PassSettings, groups: list[RowGroup], read: Callable[[Piece], Chunk], ring: Ring,
                 stats: LoaderStats, *, stage: DeviceStage | None = None, empty: Chunk, streams: StreamPass | None = None) -> None:  # fmt: skip
        self.settings, self.epoch, self.ring = settings, settings.epoch, ring
        self.all_submitted = threading.Event()
        self.assembled = threading.Event()
        self.stop = threading.Event()
        assembler = Assembler(settings, groups, read, InlineExecutor(), ring, stats, read_ahead=1, stop=self.stop,
                              all_submitted=self.all_submitted, stage=stage, empty=empty, streams=streams)  # fmt: skip
        self._batches = assembler.batches()
        self._held: int | None = None

    def take(self) -> Item:
        """The next batch: (ring slot, rows, list columns), made now."""
        try:
            item = next(self._batches)
        except StopIteration:
            raise LoaderError("the loader's pass ended before its last batch") from None
        except BaseException:
            self.close()
            raise
        self._held = item[0]
        return item

    def release(self) -> None:
        """Give back the slot of the batch taken last: its tensors may be overwritten from now on."""
        if self._held is not None:
            self.ring.release(self._held)
            self._held = None

    def close(self) -> None:
        """End the pass and give back the slot in use."""
        self.stop.set()
        self._batches.close()
        self.release()
        self.assembled.set()


def shutdown(stop: threading.Event, pool: ThreadPoolExecutor, thread: threading.Thread, slots: Slots,
             assembled: threading.Event) -> None:  # fmt: skip
    """End a pass, whether closed or garbage-collected (after ``break``): stop its threads, give back its ring
    slots, and set ``assembled`` so that the next epoch's pass, which waits on it, can go on."""
    stop.set()
    pool.shutdown(wait=False, cancel_futures=True)
    if thread is not threading.current_thread():
        thread.join()
    slots.release_all()
    assembled.set()
