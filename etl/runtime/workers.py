"""A small thread pool for shard-level work.

Threads, not processes: the heavy work (Parquet decoding in Arrow, numba kernels compiled with ``nogil``) releases
the GIL, so threads run in parallel without copying batches between processes.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def run_workers(items: list[T], workers: int, work: Callable[[int, T, threading.Event], R]) -> list[R]:
    """Call ``work(worker_index, item, stop)`` for every item with ``workers`` threads pulling items in order.

    Results come back in item order. The first exception sets ``stop`` (long-running ``work`` should check it
    between row groups and return), lets running calls end, and is re-raised here; so does a KeyboardInterrupt
    raised here while the threads run."""
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    todo: queue.Queue[int] = queue.Queue()
    for i in range(len(items)):
        todo.put(i)
    results: list[R | None] = [None] * len(items)
    errors: list[BaseException] = []
    stop = threading.Event()

    def loop(w: int) -> None:
        while not stop.is_set():
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            try:
                results[i] = work(w, items[i], stop)
            except BaseException as e:  # noqa: BLE001 - re-raised by the caller thread
                errors.append(e)
                stop.set()

    n = max(1, min(workers, len(items)))
    if n == 1:
        loop(0)
    else:
        ended = [threading.Event() for _ in range(n)]

        def run(w: int) -> None:
            try:
                loop(w)
            finally:
                ended[w].set()

        threads = [threading.Thread(target=run, args=(w,), daemon=True, name=f"etl-worker-{w}") for w in range(n)]
        try:
            for t in threads:
                t.start()
            _wait_ended(threads, ended)
        except BaseException:  # Ctrl-C while starting or waiting: the threads stop at their next check, then it goes on
            stop.set()
            _wait_ended(threads, ended)
            raise
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return results  # type: ignore[return-value]


def _wait_ended(threads: list[threading.Thread], ended: list[threading.Event]) -> None:
    """Wait until each thread that started has set its ``ended`` event, in timed waits: Ctrl-C reaches the waiting
    thread at once (an untimed ``Thread.join`` sleeps through it once polars handles SIGINT, and one that Ctrl-C
    interrupts may later return while its thread still runs). A thread that Ctrl-C kept from starting is not
    waited for: once ``stop`` is set, it does nothing."""
    for t, e in zip(threads, ended):
        while not e.wait(0.1):
            if t.ident is None:
                break


_DONE = object()


def run_staged(
    items: list[T],
    producers: int,
    consumers: int,
    produce: Callable[[T, Callable[[R], None], threading.Event], None],
    consume: Callable[[int, R], None],
    depth: int = 4,
) -> None:
    """Two-stage pipeline: ``producers`` threads call ``produce(item, emit, stop)`` for every item; every value
    passed to ``emit`` is handed to each of the ``consumers`` threads, which call ``consume(consumer_index, x)``
    (so consumers split the work on a value between them, e.g. by column).

    At most ``depth`` values wait per consumer (memory stays bounded when consumers are slower). The first
    exception on either side stops both stages and is re-raised here."""
    if consumers < 1:
        raise ValueError(f"consumers must be >= 1, got {consumers}")
    inboxes: list[queue.Queue] = [queue.Queue(maxsize=depth) for _ in range(consumers)]
    errors: list[BaseException] = []
    stop = threading.Event()

    def emit(x: object) -> None:
        for box in inboxes:
            while not stop.is_set():
                try:
                    box.put(x, timeout=0.05)
                    break
                except queue.Full:
                    continue

    def consumer(c: int) -> None:
        box = inboxes[c]
        while not stop.is_set():
            try:
                x = box.get(timeout=0.05)
            except queue.Empty:
                continue
            if x is _DONE:
                return
            try:
                consume(c, x)
            except BaseException as e:  # noqa: BLE001 - re-raised by the caller thread
                errors.append(e)
                stop.set()

    threads = [threading.Thread(target=consumer, args=(c,), daemon=True, name=f"etl-consumer-{c}") for c in range(consumers)]
    for t in threads:
        t.start()
    try:
        run_workers(items, producers, lambda w, item, s: produce(item, emit, stop))
    except BaseException as e:  # noqa: BLE001 - re-raised below, after the consumers stopped
        errors.insert(0, e)
        stop.set()
    emit(_DONE)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
