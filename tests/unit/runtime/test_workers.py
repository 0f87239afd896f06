"""etl.runtime.workers.run_workers: ordering, error propagation, validation."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from etl.runtime.workers import run_workers


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_results_in_item_order(workers):
    items = list(range(30))
    seen_workers = set()
    lock = threading.Lock()

    def work(w, item, stop):
        with lock:
            seen_workers.add(w)
        time.sleep(0.001 * ((item * 7) % 5))  # finish out of order
        return item * item

    assert run_workers(items, workers, work) == [i * i for i in items]
    assert seen_workers <= set(range(min(workers, len(items))))


def test_every_item_processed_exactly_once():
    calls = []
    lock = threading.Lock()

    def work(w, item, stop):
        with lock:
            calls.append(item)
        return item

    run_workers(list("abcdefghij"), 3, work)
    assert sorted(calls) == list("abcdefghij")


def test_empty_items():
    assert run_workers([], 4, lambda w, i, s: 1 / 0) == []


@pytest.mark.parametrize("workers", [1, 3])
def test_first_error_reraised_and_stop_set(workers):
    stops = []
    done = []

    def work(w, item, stop):
        stops.append(stop)
        if item == 2:
            raise KeyError("boom-2")
        if item > 2 and workers == 1:
            done.append(item)
        time.sleep(0.01)
        return item

    with pytest.raises(KeyError, match="boom-2"):
        run_workers(list(range(40)), workers, work)
    assert stops and all(s is stops[0] for s in stops)
    assert stops[0].is_set()
    assert done == []  # a single worker stops pulling items after the error
    assert len(stops) < 40  # the remaining items were not started


def test_only_first_of_several_errors_is_raised():
    both_started = threading.Barrier(2, timeout=5)

    def work(w, item, stop):
        both_started.wait()  # both items are running before any error
        if item == 0:
            raise ValueError("first")
        # wait until the first error has stopped the pool, then fail too
        assert stop.wait(5)
        raise RuntimeError("second")

    with pytest.raises(ValueError, match="first"):
        run_workers([0, 1], 2, work)


def test_work_sees_stop_and_returns():
    started = threading.Event()

    def work(w, item, stop):
        if item == 0:
            started.wait(5)
            raise OSError("disk")
        started.set()
        for _ in range(500):
            if stop.is_set():
                return "stopped"
            time.sleep(0.01)
        return "ran to the end"

    t0 = time.time()
    with pytest.raises(OSError, match="disk"):
        run_workers([0, 1], 2, work)
    assert time.time() - t0 < 4


@pytest.mark.parametrize("workers", [0, -1, 1.5, "2", None])
def test_workers_validation(workers):
    with pytest.raises(ValueError, match="workers"):
        run_workers([1, 2], workers, lambda w, i, s: i)


#: Two workers wait for ``stop`` (for at most 10 s each) while a third thread sends SIGINT to the main thread, which waits
#: for them in ``run_workers``; prints what came out of it and the workers still running then.
_CTRL_C = """
import signal, threading
import polars  # loaded as in every run: its SIGINT handler is in place, which an untimed join sleeps through
from etl.runtime.workers import run_workers

started = threading.Barrier(3)
running = []

def work(w, item, stop):
    running.append(w)
    if item < 2:
        started.wait(timeout=5)
    stop.wait(10)
    running.remove(w)

def interrupt():
    started.wait(timeout=5)
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

threading.Thread(target=interrupt, daemon=True).start()
try:
    run_workers(list(range(6)), 2, work)
    print("returned", running)
except KeyboardInterrupt:
    print("KeyboardInterrupt", running)
"""


def test_ctrl_c_while_the_threads_run_stops_them_before_it_propagates():
    """SIGINT reaches the main thread while it waits for the workers: they see ``stop`` and have ended when the
    KeyboardInterrupt comes out of run_workers. In a process of its own, as a run has it (Python's handler, then
    polars' registered on import), the workers' waits bounded: were the signal lost, run_workers would return
    ("returned ...") and the test would fail, not hang."""
    done = subprocess.run([sys.executable, "-c", _CTRL_C], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "KeyboardInterrupt []"), done.stderr
