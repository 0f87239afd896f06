"""A small thread pool for shard-level work.

Threads, not processes: the heavy work (Parquet decoding in Arrow, numba kernels compiled with ``nogil``) releases
the GIL, so threads run in parallel without copying batches between processes.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def run_workers(items: list[T], workers: int, work: Callable[[int, T, threading.Event], R]) -> list[R]:
    """Call ``work(worker_index, item, stop)`` for every item with ``workers`` threads pulling items in order.

    Results come back in item order. The first exception sets ``stop`` (long-running ``work`` should check it
    between row groups and return), lets running calls end, and is re-raised here."""
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
        threads = [threading.Thread(target=loop, args=(w,), daemon=True, name=f"etl-worker-{w}") for w in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return results  # type: ignore[return-value]
