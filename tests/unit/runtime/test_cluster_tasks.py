"""etl.runtime.cluster_tasks.run_tasks on a LocalCluster of two worker processes: every result reaches the driver once, rows
are reported once, a task's error reaches the driver as itself and the other tasks see ``stop``, shared arguments
(a scattered value) reach every task, and a task whose workers keep dying, or whose shared input died with them, is
a ``ClusterError`` naming its item."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

import dask
import pytest

from etl.errors import ClusterError, RowError
from etl.runtime.cluster import connect
from etl.runtime.cluster_tasks import Stop, _RowCounter, run_tasks, share

if TYPE_CHECKING:
    from distributed import Client


@pytest.fixture
def client(local_cluster):
    return local_cluster


def square_in_steps(item: int, stop: Stop, progress: Callable[[int], None]) -> tuple[int, int]:
    for _ in range(3):
        progress(item)
    return item * item, os.getpid()


def scaled(factor: int, item: int, stop: Stop, progress: Callable[[int], None]) -> int:
    return factor * item


def kill_own_worker(item: str, stop: Stop, progress: Callable[[int], None]) -> None:
    """Kills the worker process running it, every time it runs."""
    os.kill(os.getpid(), signal.SIGKILL)


def bad_row_or_wait(item: tuple[int, str], stop: Stop, progress: Callable[[int], None]) -> None:
    """Item 0 raises a RowError once the other has started; the other waits for ``stop`` and leaves a mark."""
    k, marks = item
    deadline = time.monotonic() + 30  # never hang the suite
    if k == 0:
        while not os.path.exists(os.path.join(marks, "started")) and time.monotonic() < deadline:
            time.sleep(0.01)
        raise RowError("raw/a.parquet", 1, 7, "C3", "malformed value: 'zz'")
    open(os.path.join(marks, "started"), "w").close()
    while not stop.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
    if stop.is_set():
        open(os.path.join(marks, "stopped"), "w").close()


def test_every_result_once_in_the_driver_and_rows_counted_once(client) -> None:
    items = list(range(1, 11))
    results: dict[int, int] = {}
    pids = set()
    thread = threading.get_ident()
    reported: list[int] = []

    def on_result(k: int, r: tuple[int, int]) -> None:
        assert threading.get_ident() == thread and k not in results
        results[k] = r[0]
        pids.add(r[1])

    run_tasks(client, square_in_steps, items, on_result, reported.append)
    assert results == {k: x * x for k, x in enumerate(items)}
    assert os.getpid() not in pids
    assert sum(reported) == 3 * sum(items)


def test_a_task_error_reaches_the_driver_as_itself_after_the_others_stopped(client, tmp_path: Path) -> None:
    with pytest.raises(RowError) as info:
        run_tasks(client, bad_row_or_wait, [(0, str(tmp_path)), (1, str(tmp_path))], lambda k, r: None)
    e = info.value
    assert str(e) == "raw/a.parquet, row group 1, row 7, column 'C3': malformed value: 'zz'"
    assert (e.path, e.row_group, e.row, e.column) == ("raw/a.parquet", 1, 7, "C3")
    assert (tmp_path / "stopped").exists()  # the other task saw stop and ended before the error was raised here


def test_rows_of_a_rerun_task_are_not_counted_twice() -> None:
    reported: list[int] = []
    counter = _RowCounter(reported.append)
    for event in [(0, 100), (1, 50), (0, 200), (0, 100), (0, 300), (1, 50)]:  # item 0's task ran twice
        counter.on_event((0.0, event))
    counter.update(1, 80)  # the result of item 1's task, before its last event
    counter.on_event((0.0, (1, 80)))
    assert sum(reported) == 380


def test_shared_arguments_reach_every_task_as_their_values(client) -> None:
    results: dict[int, int] = {}
    run_tasks(client, scaled, [1, 2, 3], results.__setitem__, shared=(client.scatter(10, broadcast=True),))
    assert results == {0: 10, 1: 20, 2: 30}


def test_a_task_whose_workers_keep_dying_is_a_cluster_error_naming_its_item() -> None:
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), connect("local:1") as client:
        with pytest.raises(ClusterError) as info:
            run_tasks(client, kill_own_worker, ["a"], lambda k, r: None, describe=lambda item: f"item {item}")
    assert str(info.value).startswith("item a: stopped: the Dask worker processes holding this task died more often than")


def kill_own_worker_sharing(factor: int, item: str, stop: Stop, progress: Callable[[int], None]) -> None:
    """Kills the worker process running it, which holds the only copy of the shared ``factor``."""
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_task_whose_shared_input_died_with_its_worker_is_a_cluster_error_naming_its_item() -> None:
    """Dask cannot make the scattered value again: it forgets the task ("already forgotten") instead of running it
    once more, and the driver says so in one line, not with Dask's FutureCancelledError."""
    with connect("local:1") as client:
        with pytest.raises(ClusterError) as info:
            run_tasks(client, kill_own_worker_sharing, ["a"], lambda k, r: None, shared=(share(client, 10, "factor"),),
                      describe=lambda item: f"item {item}")  # fmt: skip
    assert str(info.value) == ("item a: stopped: Dask gave this task up when the worker processes holding its inputs died "
                               "(killed, or out of memory?)")  # fmt: skip


class _ClosingClient:
    """Stands for a Dask client whose connection to a worker closes (the worker died) while it scatters."""

    def scatter(self, value: object, **options: object) -> None:
        from distributed.comm.core import CommClosedError

        raise CommClosedError("in <TCP (closed) ConnectionPool.scatter>: Stream is closed")


def test_a_worker_dying_while_a_value_is_shared_is_a_cluster_error_naming_it() -> None:
    with pytest.raises(ClusterError, match=r"^pipeline criteo: could not be sent to the Dask workers: a worker process died"):
        share(cast("Client", _ClosingClient()), 10, "pipeline criteo")
